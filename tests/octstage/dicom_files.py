"""Small DICOM files for the reading tests: one synthetic OCT volume written in any encoding."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pydicom.data

from octstage.dataset.synth import write_oct_dicom
from octstage.dataset.synth_oct import render_retina

SPACING = (0.12, 0.0039, 0.0113)
UID_ = "1.2.826.0.1.3680043.8.498.99.1651.1.10"
CUT = r"truncated|wrong length|file ends early"  # every way a reason says the file was cut
PYDICOM_FILES = Path(os.path.dirname(pydicom.data.__file__)) / "test_files"


def volume(seed: int = 0) -> np.ndarray:
    return render_retina((6, 40, 48), 0.1, "R", np.random.default_rng(seed))


def write(path: Path, ts: str, vol: np.ndarray | None = None, **kw: object) -> np.ndarray:
    vol = volume() if vol is None else vol
    args: dict[str, object] = dict(
        patient_id="4150",
        laterality="R",
        transfer_syntax=ts,
        spacing_mm=SPACING,
        device="topcon_maestro2",
        sop_instance_uid=UID_,
    )
    args.update(kw)
    write_oct_dicom(path, vol, **args)  # type: ignore[arg-type]
    return vol
