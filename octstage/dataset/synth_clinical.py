"""The twin's clinical side: OMOP CDM tables in ``clinical_data/`` and ``participants.json``.

As the release holds them (and ``aireadi-loader`` reads them): comma-separated OMOP tables keyed
by ``person_id`` (the 4-digit participant ID), with real OMOP concept ids:

- ``measurement.csv``: HbA1c (3004410, %), glucose (3004501, mg/dL), systolic and diastolic
  blood pressure (3004249, 3012888, mmHg) and BMI (3038553, kg/m2), one row per participant
  and concept, ``value_as_number`` the value.
- ``condition_occurrence.csv``: type 2 diabetes mellitus (201826) for the medication- and
  insulin-controlled groups, essential hypertension (320128) where systolic > 140 mmHg.
- ``observation.csv``: tobacco smoking status (43054909, 0/1), and for every diagnosed
  participant a history row (4214956) whose ``qualifier_concept_id`` names the condition and
  whose value is the years since diagnosis: the loader reads that pair as concept 201826.

AI-READI's missing-value codes (555, 777, 888, 999) stand in for some values: participant ``i``'s
HbA1c when ``i % 11 == 10``, glucose when ``i % 13 == 12``, smoking when ``i % 7 == 6`` (the code
cycles through the four). Every labelled participant has rows (the loader drops one with none).

The learnable signal: HbA1c = 5.0 + 20 x (ONL fraction - 0.07) + N(0, 0.15), rounded to 0.1, so
it rises with the ONL thickness the volumes show (study group 0 ~5.0 %, group 3 ~7.7 %) and a
model that sees the ONL can regress it.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from octstage.dataset.release import MISSING_CODES

CLINICAL_DIR = "clinical_data"
HBA1C = 3004410
# concept id -> (measurement_source_value, unit_source_value, unit_concept_id)
MEASUREMENTS: dict[int, tuple[str, str, int]] = {
    HBA1C: ("hba1c", "%", 8554),
    3004501: ("glucose", "mg/dL", 8840),
    3004249: ("bp_systolic", "mmHg", 8876),
    3012888: ("bp_diastolic", "mmHg", 8876),
    3038553: ("bmi", "kg/m2", 9531),
}
T2DM, HYPERTENSION, SMOKING, HISTORY = 201826, 320128, 43054909, 4214956
_MISSING = {HBA1C: 11, 3004501: 13, SMOKING: 7}  # concept -> modulus (see the module doc)


def hba1c_of(onl_fraction: float, rng: np.random.Generator) -> float:
    """HbA1c (%) of a participant whose ONL is ``onl_fraction`` of the depth."""
    return round(5.0 + 20.0 * (onl_fraction - 0.07) + float(rng.normal(0.0, 0.15)), 1)


def write_clinical(
    out: Path,
    participants: Sequence[str],
    groups: Mapping[str, int],
    onl: Mapping[str, float],
    seed: int,
) -> dict[str, float]:
    """Write the three OMOP tables; return each participant's HbA1c (only where not missing)."""
    rng = np.random.default_rng([seed, 2])
    measurements: list[list[object]] = []
    conditions: list[list[object]] = []
    observations: list[list[object]] = []
    hba1c: dict[str, float] = {}
    for i, pid in enumerate(participants):
        date = str(np.datetime64("2023-07-01") + np.timedelta64(int(rng.integers(0, 700)), "D"))
        a1c = hba1c_of(onl[pid], rng)
        values = {
            HBA1C: a1c,
            3004501: round(28.7 * a1c - 46.7 + float(rng.normal(0.0, 12.0))),
            3004249: round(float(rng.normal(128.0, 15.0))),
            3012888: round(float(rng.normal(78.0, 9.0))),
            3038553: round(float(rng.normal(29.0, 5.0)), 1),
        }
        for concept, modulus in _MISSING.items():
            if concept in values and i % modulus == modulus - 1:
                values[concept] = MISSING_CODES[(i // modulus) % len(MISSING_CODES)]
        if values[HBA1C] not in MISSING_CODES:
            hba1c[pid] = a1c
        for concept, value in values.items():
            source, unit, unit_id = MEASUREMENTS[concept]
            row_id = len(measurements) + 1
            measurements.append([row_id, pid, concept, date, 32856, value, unit_id, unit, source])
        diagnosed = []
        if groups[pid] >= 2:
            diagnosed.append((T2DM, "type_2_diabetes"))
        if values[3004249] not in MISSING_CODES and float(values[3004249]) > 140:
            diagnosed.append((HYPERTENSION, "hypertension"))
        for concept, source in diagnosed:
            conditions.append([len(conditions) + 1, pid, concept, date, 32862, source])
            years = round(float(rng.uniform(1, 20)))
            observations.append(
                [len(observations) + 1, pid, HISTORY, date, 32862, years, "", "", concept, 9448,
                 f"{source}_years"]
            )  # fmt: skip
        smokes: int = int(rng.random() < 0.2)
        if i % _MISSING[SMOKING] == _MISSING[SMOKING] - 1:
            smokes = MISSING_CODES[(i // _MISSING[SMOKING]) % len(MISSING_CODES)]
        observations.append(
            [len(observations) + 1, pid, SMOKING, date, 32862, smokes, "", "", "", "",
             "smoking_status"]
        )  # fmt: skip
    folder = out / CLINICAL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    _csv(
        folder / "measurement.csv",
        ["measurement_id", "person_id", "measurement_concept_id", "measurement_date",
         "measurement_type_concept_id", "value_as_number", "unit_concept_id",
         "unit_source_value", "measurement_source_value"],
        measurements,
    )  # fmt: skip
    _csv(
        folder / "condition_occurrence.csv",
        ["condition_occurrence_id", "person_id", "condition_concept_id", "condition_start_date",
         "condition_type_concept_id", "condition_source_value"],
        conditions,
    )  # fmt: skip
    _csv(
        folder / "observation.csv",
        ["observation_id", "person_id", "observation_concept_id", "observation_date",
         "observation_type_concept_id", "value_as_number", "value_as_string",
         "value_as_concept_id", "qualifier_concept_id", "unit_concept_id",
         "observation_source_value"],
        observations,
    )  # fmt: skip
    return hba1c


def _csv(path: Path, header: list[str], rows: list[list[object]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")


def write_participants_json(out: Path, study_groups: Sequence[str]) -> None:
    """The BIDS-style sidecar describing participants.tsv's columns."""
    flag = {"Description": "whether the participant has this data type", "Levels": {
        "TRUE": "present", "FALSE": "absent"}}  # fmt: skip
    doc = {
        "participant_id": {"Description": "4-digit participant ID; first digit is the site"},
        "clinical_site": {
            "Description": "clinical site",
            "Levels": {
                "UW": "University of Washington",
                "UCSD": "University of California San Diego",
                "UAB": "University of Alabama at Birmingham",
            },
        },
        "study_group": {
            "Description": "diabetes severity group",
            "Levels": {g: g.replace("_", " ") for g in study_groups},
        },
        "age": {"Description": "age at the study visit", "Units": "years"},
        "study_visit_date": {"Description": "date of the study visit"},
        "recommended_split": {
            "Description": "train/val/test split balanced on age, sex, race and study group",
            "Levels": {"train": "training", "val": "validation", "test": "test"},
        },
        **{k: flag for k in ("retinal_oct", "retinal_octa", "retinal_photography", "cardiac_ecg")},
    }
    (out / "participants.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
