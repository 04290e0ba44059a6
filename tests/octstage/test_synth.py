"""The synthetic dataset: deterministic, AI-READI-shaped, traps planted, class signal present."""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pytest
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, JPEGBaseline8Bit, RLELossless

from octstage.dataset.dicom import read_header, read_volume
from octstage.dataset.ids import DEVICES
from octstage.dataset.labels import SPLITS, STUDY_GROUPS
from octstage.dataset.release import DEVICE_MODELS, DEVICE_REGIONS, MISSING_CODES
from octstage.dataset.synth import SynthInfo, generate
from octstage.errors import ConfigError

LEGACY = re.compile(r"\b(1[0-9]{3})\b")  # the incident's regex


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", participants=16, seed=3)
    b = generate(tmp_path / "b", participants=16, seed=3)
    c = generate(tmp_path / "c", participants=16, seed=4)
    assert a.files == b.files
    assert tree_digest(a.root) == tree_digest(b.root)
    dcm = [{v for k, v in tree_digest(x.root).items() if k.endswith(".dcm")} for x in (a, c)]
    assert len(dcm[0] & dcm[1]) == 2  # only the empty file and the HTML page saved as .dcm


def test_layout_and_tables_look_like_ai_readi(synth_info: SynthInfo) -> None:
    root = synth_info.root
    with open(root / "participants.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert list(rows[0])[:6] == [
        "participant_id", "clinical_site", "study_group", "age", "study_visit_date",
        "recommended_split",
    ]  # fmt: skip
    assert len(rows) == 60
    assert {r["participant_id"][0] for r in rows} == {"1", "4", "7"}
    assert Counter(r["study_group"] for r in rows) == {g: 15 for g in STUDY_GROUPS}
    splits = Counter(r["recommended_split"] for r in rows)
    assert set(splits) == set(SPLITS) and 0.65 <= splits["train"] / 60 <= 0.75
    for group in STUDY_GROUPS:  # every class is in every split
        assert {r["recommended_split"] for r in rows if r["study_group"] == group} == set(SPLITS)
    with open(root / "retinal_oct" / "manifest.tsv", newline="") as fh:
        manifest = list(csv.DictReader(fh, delimiter="\t"))
    # The two unlabelled participants' files are on disk but not in the release's index.
    listed = [f for f in synth_info.files if f not in synth_info.unlisted]
    assert [m["filepath"] for m in manifest] == [f"/{f}" for f in listed]
    assert {f.split("/")[3] for f in synth_info.unlisted} == set(synth_info.unlabelled_with_oct)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.dcm")) == sorted(
        synth_info.files
    )
    assert json.loads((root / "participants.json").read_text())["study_group"]["Levels"].keys() == (
        set(STUDY_GROUPS)
    )


def test_manifest_tsv_uses_the_release_spellings(synth_info: SynthInfo) -> None:
    """The values aireadi-loader matches: makers, models, regions with scan size, OCT, R/L."""
    with open(synth_info.root / "retinal_oct" / "manifest.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert {r["manufacturer"] for r in rows} == {"Heidelberg", "Topcon", "Zeiss"}
    assert {r["manufacturers_model_name"] for r in rows} == {
        "Spectralis", "Maestro2", "Triton", "Cirrus",
    }  # fmt: skip
    assert {r["imaging"] for r in rows} == {"OCT"} and {r["laterality"] for r in rows} == {"R", "L"}
    for r in rows:
        device = r["filepath"].split("/")[3]
        assert DEVICE_MODELS[device] == (r["manufacturer"], r["manufacturers_model_name"])
        assert r["anatomic_region"] in DEVICE_REGIONS[device]
        assert r["anatomic_region"] == synth_info.regions[r["filepath"][1:]]
        if r["filepath"][1:] not in synth_info.excluded:
            h = read_header(synth_info.root / r["filepath"][1:], r["filepath"])
            assert h.shape == (int(r["number_of_frames"]), int(r["height"]), int(r["width"]))
            assert (h.manufacturer, h.model) == DEVICE_MODELS[device]
    regions = Counter((r["manufacturers_model_name"], r["anatomic_region"]) for r in rows)
    assert len(regions) >= 9  # beyond each device's main region
    assert regions[("Triton", "Macula, 12 x 12")] > 20 and ("Triton", "Macula") not in regions


def test_clinical_tables_are_omop_with_missing_codes(synth_info: SynthInfo) -> None:
    folder = synth_info.root / "clinical_data"
    tables = {}
    for name in ("condition_occurrence", "measurement", "observation"):
        with open(folder / f"{name}.csv", newline="") as fh:
            tables[name] = list(csv.DictReader(fh))
        assert {r["person_id"] for r in tables[name]} <= set(synth_info.labelled)
    m = tables["measurement"]
    assert {r["person_id"] for r in m} == set(synth_info.labelled)  # everyone has rows
    hba1c = {r["person_id"]: float(r["value_as_number"]) for r in m
             if r["measurement_concept_id"] == "3004410"}  # fmt: skip
    missing = {p for p, v in hba1c.items() if v in MISSING_CODES}
    assert 3 <= len(missing) <= 8 and len({hba1c[p] for p in missing}) >= 3
    assert {p: v for p, v in hba1c.items() if p not in missing} == synth_info.hba1c
    assert {r["unit_source_value"] for r in m if r["measurement_concept_id"] == "3004410"} == {"%"}
    # HbA1c rises with the study group (and the ONL the volumes show): a learnable target.
    by_group = [
        np.mean([v for p, v in synth_info.hba1c.items() if synth_info.labels[p] == g])
        for g in range(4)
    ]
    assert by_group == sorted(by_group) and by_group[3] - by_group[0] > 2
    assert {r["condition_concept_id"] for r in tables["condition_occurrence"]} >= {"201826"}
    observed = {float(r["value_as_number"]) for r in tables["observation"]}
    assert observed & set(MISSING_CODES)


def test_devices_encodings_and_sizes(synth_info: SynthInfo) -> None:
    devices = Counter(f.split("/")[2] for f in synth_info.files)
    assert set(devices) == set(DEVICES)
    syntaxes = Counter(synth_info.transfer_syntaxes.values())
    assert set(syntaxes) == {
        ExplicitVRLittleEndian,
        RLELossless,
        JPEGBaseline8Bit,
        JPEG2000Lossless,
    }
    assert min(syntaxes.values()) >= 10
    sizes = [(synth_info.root / f).stat().st_size for f in synth_info.files]
    assert max(sizes) < 100_000


def test_class_is_independent_of_device_and_site(synth_info: SynthInfo) -> None:
    by_class: dict[int, set[tuple[str, str]]] = {k: set() for k in range(4)}
    for f in synth_info.files:
        pid = f.split("/")[3]
        if pid in synth_info.labels:
            by_class[synth_info.labels[pid]].add((f.split("/")[2], pid[0]))
    for combos in by_class.values():
        assert {d for d, _ in combos} == set(DEVICES)
        assert {s for _, s in combos} == {"1", "4", "7"}


def test_every_trap_is_planted(synth_info: SynthInfo) -> None:
    assert Counter(synth_info.excluded.values()) == {
        "irregular_grid": 4, "folder_not_id": 2, "patient_id_missing": 2, "unreadable": 2,
        "no_pixel_data": 1, "patient_id_disagrees": 1, "truncated": 2,
        "folder_filename_disagree": 1, "filename_not_id": 1, "patient_id_not_id": 1,
    }  # fmt: skip
    assert len(synth_info.labelled_without_oct) == 3
    assert len(synth_info.unlabelled_with_oct) == 2
    assert not set(synth_info.unlabelled_with_oct) & set(synth_info.labelled)
    lost = set(synth_info.labelled) - set(synth_info.verified)
    assert lost == set(synth_info.labelled_without_oct) | {
        synth_info.labelled[i] for i in (2, 7, 8, 11)
    }


def test_uid_segments_would_fool_the_incident_regex(synth_info: SynthInfo) -> None:
    ids = set(synth_info.labelled) | set(synth_info.unlabelled_with_oct)
    fooled = 0
    for rel in synth_info.files:
        folder, fname = rel.split("/")[-2:]
        found = LEGACY.findall(fname)
        fooled += any(f in ids and f != folder for f in found)
        assert not found or not fname.startswith(found[0])  # "\b" never sees the prefix
    assert fooled >= 20


def test_headers_carry_the_planted_ids(synth_info: SynthInfo) -> None:
    for rel in synth_info.files[:20]:
        if rel in synth_info.excluded:
            continue
        h = read_header(synth_info.root / rel, rel)
        assert h.patient_id == rel.split("/")[3]
        assert h.laterality == rel.split("_")[-2].upper()
        assert h.sop_instance_uid == rel[: -len(".dcm")].split("_")[-1]
        assert h.problem() is None


def test_study_group_is_learnable_after_resizing(synth_info: SynthInfo) -> None:
    """Nearest class mean of the depth profile at 64 rows, train -> val+test: well above 25%."""
    feats, labels, train = [], [], []
    for rel in synth_info.files:
        pid = rel.split("/")[3]
        if rel in synth_info.excluded or pid not in synth_info.labels:
            continue
        _, vol = read_volume(synth_info.root / rel, rel)
        small = np.stack([cv2.resize(f, (64, 64), interpolation=cv2.INTER_AREA) for f in vol])
        feats.append(small.mean(axis=(0, 2)))
        labels.append(synth_info.labels[pid])
        train.append(synth_info.splits[pid] == "train")
    x, y, tr = np.array(feats), np.array(labels), np.array(train)
    means = np.stack([x[tr & (y == k)].mean(axis=0) for k in range(4)])
    pred = np.argmin(((x[~tr, None] - means[None]) ** 2).sum(axis=-1), axis=1)
    assert (pred == y[~tr]).mean() >= 0.5


def test_refuses_a_foreign_folder_and_replaces_its_own(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("not synth's")
    with pytest.raises(ConfigError, match="not made by octstage synth"):
        generate(tmp_path, participants=16)
    out = tmp_path / "d"
    generate(out, participants=20, seed=1)
    with pytest.raises(ConfigError, match=r"holds another twin .*--overwrite"):
        generate(out, participants=16, seed=1)  # every file of it replaced: asked for, or not
    info = generate(out, participants=16, seed=1, overwrite=True)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.dcm")) == sorted(info.files)


def test_too_few_participants_for_the_traps() -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        generate(Path("/nonexistent/never-written"), participants=15)


@pytest.mark.slow
def test_full_size_volumes_have_the_real_shapes(tmp_path: Path) -> None:
    """One participant per device (0..3): each device's main scan at its real geometry."""
    info = generate(tmp_path / "full", participants=4, full_size=True, traps=False)
    shapes = {f.split("/")[2]: read_header(info.root / f, f).shape for f in info.files}
    assert shapes == {
        "heidelberg_spectralis": (61, 496, 768),
        "topcon_maestro2": (128, 885, 512),
        "topcon_triton": (256, 992, 512),
        "zeiss_cirrus": (128, 1024, 512),
    }
    _, vol = read_volume(info.root / info.files[0], info.files[0])
    assert vol.shape == (61, 496, 768)
