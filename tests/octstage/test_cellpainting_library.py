"""The Cell Painting twin's compound library (``synth.library``): more perturbations, so that an
evaluation's intervals can tell encoders apart; each a subtle change, on a 384-well plate with
enough DMSO wells for the per-plate recipe."""

from __future__ import annotations

import gzip
import io
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from octstage.cellpainting import families, synth
from octstage.cellpainting.cells import changes
from octstage.cellpainting.metadata import DMSO, TABLES
from octstage.cli import main


def test_no_library_is_the_six_named_perturbations_on_the_24_well_block() -> None:
    assert synth.library(7, 0) == families.PHENOTYPES
    wells = synth.plate_map(7, 0)
    assert set(wells) == {f"{r}{c:02d}" for r in "ABCD" for c in range(1, 7)}


def test_library_compounds_are_drawn_from_the_seed_and_change_one_or_two_features_subtly() -> None:
    lib = synth.library(7, 40)
    assert lib == synth.library(7, 40) and lib != synth.library(8, 40)
    drawn = {k: v for k, v in lib.items() if k not in families.PHENOTYPES}
    assert len(drawn) == 40 and all(kind == "compound" for kind, _, _ in drawn.values())
    assert sorted(drawn)[0] == f"JCP2022_{synth.LIBRARY_FIRST_ID:06d}"
    counts: Counter[int] = Counter()
    for _, phenotype, what in drawn.values():
        changed = changes(phenotype)
        assert 1 <= len(changed) <= 2, what
        counts[len(changed)] += 1
        for name, factor in changed.items():
            cap = synth.LIBRARY_FEATURES[name]
            assert abs(np.log(factor)) <= cap + 1e-3, (name, factor)  # subtle: within its cap
            assert name in what
    assert counts[1] > 5 and counts[2] > 5  # both kinds occur
    # up and down both occur, and strengths spread from inside the nuisance to the cap
    logs = [np.log(v) for _, p, _ in drawn.values() for v in changes(p).values()]
    assert min(logs) < 0 < max(logs)
    shares = [abs(x) for x in logs]
    assert min(shares) < 0.1 and max(shares) > 0.3


def test_a_library_plate_is_a_384_well_plate_with_dmso_in_four_times_the_wells() -> None:
    lib = synth.library(3, 30)
    wells = synth.plate_map(3, 1, 4, lib)
    counts = Counter(wells.values())
    assert counts[DMSO] == 4 * synth.CONTROL_SHARE
    assert all(n == 4 for p, n in counts.items() if p != DMSO)
    assert set(counts) == set(lib)
    rows, cols = synth.PLATE_384
    assert set(wells) <= {f"{r}{c:02d}" for r in rows for c in range(1, cols + 1)}
    assert any(w[0] > "D" for w in wells)  # beyond the 24-well block
    assert wells != synth.plate_map(3, 2, 4, lib)  # placed at random per plate


def test_a_library_too_big_for_384_wells_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "twin"
    assert main(["synth", "--kind", "cellpainting", "--compounds", "88", str(out)]) == 2
    assert "compounds 88: with 4 wells each and DMSO in 16, at most 87" in capsys.readouterr().err
    assert not out.exists()
    assert main(["synth", "--kind", "cellpainting", "--compounds", "-1", str(out)]) == 2
    full = tmp_path / "full"
    assert main(["synth", "--kind", "cellpainting", "--compounds", "87", "--plates", "1",
                 "--sites", "1", "--size", "32", "--no-traps", str(full)]) == 0  # fmt: skip
    assert len(set(synth.plate_map(0, 0, 4, synth.library(0, 87)))) == 384  # exactly full


def test_the_twin_lists_its_library_in_the_datasets_tables(tmp_path: Path) -> None:
    out = tmp_path / "twin"
    args = ["--plates", "1", "--sites", "1", "--size", "32", "--no-traps", "--compounds", "3"]
    assert main(["synth", "--kind", "cellpainting", *args, str(out)]) == 0
    meta = out / synth.METADATA_DIR

    def table(name: str) -> pd.DataFrame:
        return pd.read_csv(io.BytesIO(gzip.decompress((meta / TABLES[name]).read_bytes())))

    lib = synth.library(0, 3)
    drawn = sorted(set(lib) - set(families.PHENOTYPES))
    assert set(drawn) <= set(table("compound")["Metadata_JCP2022"])
    wells = table("well")
    assert Counter(wells["Metadata_JCP2022"]) == Counter(synth.plate_map(0, 0, 4, lib).values())
    assert len(wells) == (5 + 3) * 4 + 4 * synth.CONTROL_SHARE  # 5 named, 3 drawn, DMSO x4


@pytest.mark.parametrize(
    ("kind", "extra", "named"),
    [
        ("oct", ["--compounds", "3"], "--compounds: only for --kind cellpainting"),
        (
            "oct",
            ["--plates", "2", "--size", "64"],
            "--plates, --size: only for --kind cellpainting",
        ),
        ("cellpainting", ["--participants", "20"], "--participants: only for --kind oct"),
    ],
)
def test_synth_refuses_an_option_of_the_other_kind_instead_of_ignoring_it(
    kind: str,
    extra: list[str],
    named: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "twin"
    assert main(["synth", "--kind", kind, *extra, str(out)]) == 2
    assert named in capsys.readouterr().err
    assert not out.exists()
