"""participants.tsv: the label table, and the documented order of the four study groups."""

from __future__ import annotations

STUDY_GROUPS: tuple[str, ...] = (
    "healthy",
    "pre_diabetes_lifestyle_controlled",
    "oral_medication_and_or_non_insulin_injectable_medication_controlled",
    "insulin_dependent",
)
SPLITS: tuple[str, ...] = ("train", "val", "test")
DEVICES: tuple[str, ...] = (
    "heidelberg_spectralis",
    "topcon_maestro2",
    "topcon_triton",
    "zeiss_cirrus",
)
