"""The AI-READI team's own loader (``aireadi-loader``) reads the unmodified twin, and counts what
the project counts, except the files the audit excludes, each named with its reason.

The loader pins torch 2.4.1, which this project cannot take (torch 2.13.0), so it is installed
without its dependencies (``pip install --no-deps``) into a folder of the test run; its real
dependencies (pandas, MONAI, pydicom) come from the dev extra. Needs the package registry once
per test session. Slow tier: ``make test-slow``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from octstage.audit.core import audit, list_oct, read_headers
from octstage.dataset.dicom import read_volume
from octstage.dataset.labels import read_participants
from octstage.dataset.release import DEVICE_MODELS, DEVICE_REGIONS, read_manifest_tsv
from octstage.dataset.synth import SynthInfo
from octstage.storage import LocalStorage

pytestmark = pytest.mark.slow
LOADER = "aireadi-loader==0.1.0"


@pytest.fixture(scope="module")
def loader(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    try:
        return importlib.import_module("aireadi_loader.dataloader")
    except ImportError:
        pass
    target = tmp_path_factory.mktemp("aireadi_loader")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         LOADER],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        pytest.fail(f"cannot install {LOADER} without its deps: {done.stderr[-2000:]}")
    sys.path.insert(0, str(target))
    return importlib.import_module("aireadi_loader.dataloader")


def _loader_region(region: str) -> str:
    """``"Macula, 6 x 6"`` -> ``"Macula_6x6"``, the loader's argument spelling."""
    return region.replace(", ", "_").replace(" x ", "x").replace(" ", "_")


def test_the_official_loader_reads_the_twin_and_counts_agree(
    loader: ModuleType, synth_info: SynthInfo
) -> None:
    root = synth_info.root
    storage = LocalStorage(root)
    participants, problems = read_participants(str(root / "participants.tsv"))
    report = audit(
        participants,
        read_headers(storage, list_oct(storage), workers=4),
        problems,
        read_manifest_tsv(storage),
    )
    accepted = {f.name: f for f in report.files if f.participant_id in participants}
    excluded = {f.name: f for f in report.excluded}
    named: dict[str, str] = {}  # loader-listed files the project leaves out -> audit reason
    checked = 0
    for device, regions in DEVICE_REGIONS.items():
        model = DEVICE_MODELS[device][1]
        for region in regions:
            for split in ("train", "val", "test"):
                ds = loader.PatientDataset(
                    f"{root}/", split=split, mode="volume", imaging_device=model,
                    anatomic_region=_loader_region(region), concept_id=0,
                )  # fmt: skip
                theirs = {
                    str(Path(v["frames"]).relative_to(root)): v for v in ds.visits_dict.values()
                }
                ours = {
                    n: f for n, f in accepted.items()
                    if f.device == device and f.region == region
                    and participants[f.participant_id or ""].split == split
                }  # fmt: skip
                assert set(ours) <= set(theirs), (device, region, split)
                for name in set(theirs) - set(ours):
                    assert name in excluded, f"{name}: the loader lists it, the audit says nothing"
                    named[name] = excluded[name].kind or ""
                # Per study group, the counts agree once the named exclusions are taken out.
                kept = [v for n, v in theirs.items() if n in ours]
                assert Counter(v["class"] for v in kept) == Counter(
                    participants[f.participant_id or ""].study_group for f in ours.values()
                )
                for name, visit in list(theirs.items())[:1]:
                    if name in ours:  # the loader decodes the same voxels the project reads
                        frames = np.asarray(ds[visit["index"]]["frames"])[0]
                        _, volume = read_volume(root / name, name)
                        assert frames.shape == volume.shape
                        if synth_info.transfer_syntaxes[name] != "1.2.840.10008.1.2.4.50":
                            assert np.array_equal(frames, volume)
                        checked += 1
    assert checked >= 8
    # Every file the audit excludes that manifest.tsv lists is named here, with its reason.
    listed_excluded = {n: f.kind for n, f in excluded.items() if n not in synth_info.unlisted}
    assert named == listed_excluded
    assert set(named.values()) >= {"irregular_grid", "truncated", "folder_not_id"}


def test_the_loader_reads_hba1c_as_the_project_does(
    loader: ModuleType, synth_info: SynthInfo
) -> None:
    """Concept 3004410 (HbA1c): missing codes dropped by both, the same value per participant."""
    ds = loader.PatientDataset(
        f"{synth_info.root}/", split="train", mode="volume", imaging_device="Cirrus",
        anatomic_region="Macula", concept_id=3004410,
    )  # fmt: skip
    values = {str(v["pat_id"]): float(v["source_values"][0]) for v in ds.visits_dict.values()}
    assert values and all(synth_info.hba1c[p] == v for p, v in values.items())
    cirrus = {f.split("/")[3] for f in synth_info.files if "/zeiss_cirrus/" in f}
    dropped = {p for p in cirrus if synth_info.splits.get(p) == "train"} - set(synth_info.hba1c)
    assert not dropped & set(values)
