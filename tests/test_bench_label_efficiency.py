"""The label-efficiency bench's pure parts: its command line (what it refuses up front), its
nested label subsets and its verdict lines against issue 26's targets (the bench's runs
themselves are 30 min: ``--quick`` checks them)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_label_efficiency import parse_args
from device_looks import UNSEEN
from label_efficiency_data import subsets
from label_efficiency_report import ARMS, table, verdict


def test_subsets_are_nested_stratified_and_never_empty() -> None:
    # what subsets reads of a manifest volume
    train: Any = [
        SimpleNamespace(participant_id=f"{c}{i:03d}", label=c) for c in range(4) for i in range(50)
    ]
    picked = subsets(train, (0.01, 0.1, 1.0), seed=3)
    assert [len(picked[f]) for f in (0.01, 0.1, 1.0)] == [4, 20, 200]
    assert set(picked[0.01]) < set(picked[0.1]) < set(picked[1.0])
    assert {p[0] for p in picked[0.01]} == {"0", "1", "2", "3"}  # one per class
    assert picked == subsets(train, (0.01, 0.1, 1.0), seed=3)
    assert picked[0.1] != subsets(train, (0.1,), seed=4)[0.1]


def _score(mean: float) -> dict[str, Any]:
    s = {"mean": mean, "ci_low": mean - 0.05, "ci_high": mean + 0.05, "seed_std": 0.01}
    return {"balanced_accuracy": s, "macro_auroc": s}


def _doc(pre10: float, rnd10: float, rnd100: float, unseen: float) -> dict[str, Any]:
    results = {
        ARMS[0]: {"0.1": _score(pre10), "1": _score(0.7)},
        ARMS[1]: {"0.1": _score(rnd10), "1": _score(rnd100)},
        ARMS[2]: {"0.1": _score(0.3), "1": _score(0.4)},
    }
    return {
        "fractions": [0.1, 1.0],
        "train_participants": {"0.1": 100, "1": 1000},
        "results": results,
        "unseen_device": {a: {"seen": _score(0.7), "unseen": _score(unseen)} for a in ARMS},
        "device_look": {UNSEEN: {"gain": 1.1}},
    }


def test_the_verdict_says_reached_only_where_the_target_is_met() -> None:
    met = verdict(_doc(pre10=0.62, rnd10=0.45, rnd100=0.66, unseen=0.66))
    assert all("NOT reached" not in line for line in met), met
    assert any("+0.170" in line for line in met)
    missed = verdict(_doc(pre10=0.46, rnd10=0.45, rnd100=0.66, unseen=0.55))
    assert sum("NOT reached" in line for line in missed) == 3, missed


def test_a_baseline_at_chance_voids_the_ratio() -> None:
    lines = verdict(_doc(pre10=0.3, rnd10=0.25, rnd100=0.25, unseen=0.7))
    assert any("AT CHANCE" in line for line in lines)
    (ratio,) = [line for line in lines if "/ random init at 100%" in line]
    assert "120%" in ratio and "void" in ratio and "reached" not in ratio, ratio


def _cross(costs: dict[str, float]) -> dict[str, Any]:
    arm = {"held_out": _score(0.5), "in_device": _score(0.5)}
    return {
        d: {ARMS[0]: {"held_out": _score(0.6 - c), "in_device": _score(0.6)}, ARMS[1]: arm}
        for d, c in costs.items()
    }


def test_the_held_out_device_cost_must_halve_on_the_worst_device_and_on_average() -> None:
    def line(costs: dict[str, float]) -> str:
        doc = _doc(pre10=0.46, rnd10=0.45, rnd100=0.66, unseen=0.55)
        (out,) = [x for x in verdict({**doc, "cross_device": _cross(costs)}) if "holding" in x]
        return out

    assert line({"a": 0.10, "b": 0.12, "c": 0.05, "d": 0.08}).endswith(": reached")
    worst = line({"a": 0.02, "b": 0.16, "c": 0.02, "d": 0.02})  # mean 0.055, worst 0.16
    assert worst.endswith("NOT reached") and "b +0.160" in worst
    assert line({"a": 0.12, "b": 0.12, "c": 0.12, "d": 0.12}).endswith("NOT reached")  # mean
    # a --fractions 1 --cross-device run gets the devices' lines, not the labels'
    only_100 = {**_doc(pre10=0.46, rnd10=0.45, rnd100=0.66, unseen=0.55), "fractions": [1.0]}
    lines = verdict({**only_100, "cross_device": _cross({"a": 0.1})})
    assert any("holding" in x for x in lines) and any("unseen device" in x for x in lines)
    assert not any("at 10%" in x for x in lines) and "needs the 10% fraction" in lines[-1]


def test_the_table_has_a_row_per_arm_and_the_unseen_device() -> None:
    text = table(_doc(pre10=0.5, rnd10=0.4, rnd100=0.6, unseen=0.65))
    for arm in ARMS:
        rows = [line for line in text.splitlines() if line.startswith(f"| {arm} | 0.")]
        assert len(rows) == 2  # balanced accuracy and macro AUROC
    assert "unseen device" in text and "(-0.050)" in text


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--fractions", "0"], "each fraction must be in (0, 1]"),
        (["--fractions", "0.1,1.5"], "1.5: each fraction must be in (0, 1]"),
        (["--seeds", "0"], "--seeds: 0: must be 1 or more"),
        (["--steps", "0"], "--steps: 0: must be 1 or more"),
        (["--finetune-steps", "-1"], "--finetune-steps: -1: must be 1 or more"),
    ],
)
def test_counts_and_fractions_that_would_train_nothing_are_refused_up_front(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(args)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_an_out_that_is_a_cache_or_a_file_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "manifest.json").write_text("{}")
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    for out, said in ((cache, "holds a cache (manifest.json)"), (afile, "is not a folder")):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--out", str(out)])
        err = " ".join(capsys.readouterr().err.split())
        assert exit_.value.code == 2 and f"--out {out}: " in err and said in err, err
    assert sorted(p.name for p in cache.iterdir()) == ["manifest.json"]
    assert parse_args(["--out", str(tmp_path / "new"), "--seeds", "2"]).seeds == 2
