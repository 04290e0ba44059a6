"""octtrain's output folders under the one rule (octstage/outputs.py): a run folder that cannot be
resumed is refused, never restarted over; report and feature-cache paths that cannot be written
are one line naming the path, before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octtrain import cli
from tests.badinput.test_octtrain_inputs import PRETRAIN, assert_clean, octtrain, pristine

__all__ = ["pristine"]  # the module fixture, shared


@pytest.mark.parametrize("index", ["missing", "empty"])
def test_resume_auto_of_a_run_without_its_index_is_refused_not_restarted(
    pristine: Path, tmp_path: Path, index: str
) -> None:
    run = tmp_path / "run"
    base: list[str | Path] = [
        "pretrain",
        "--config",
        PRETRAIN,
        "--manifest",
        pristine / "manifest.json",
    ]
    fast = ["train.max_steps=2", "logging.log_every=1", "train.stall_timeout_s=60"]
    assert cli.main([*map(str, base), f"train.run_dir={run}", *fast]) == 0
    listed = run / "checkpoints" / "index.json"
    if index == "missing":
        listed.unlink()
    else:
        listed.write_text(json.dumps({"checkpoints": [], "best": None}))
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    metrics = (run / "metrics.jsonl").read_bytes()
    again = octtrain(*base, f"train.run_dir={run}", "checkpoint.resume=auto", *fast)
    assert_clean(again, 2, "index.json is missing or lists no checkpoint", "step_00000002.pt")
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before
    assert (run / "metrics.jsonl").read_bytes() == metrics


@pytest.mark.parametrize(
    "command",
    [
        ["probe", "--out", "{file}", "--feature-cache", "{tmp}/feats"],
        ["probe", "--out", "{tmp}/report", "--feature-cache", "{file}/features"],
        ["profile", "--out", "{file}"],
        ["evaluate", "--out", "{file}/sub"],
    ],
    ids=["probe --out a file", "probe --feature-cache under a file", "profile", "evaluate"],
)
def test_an_output_path_that_cannot_be_written_is_one_line_before_any_work(
    pristine: Path, tmp_path: Path, command: list[str]
) -> None:
    file = tmp_path / "taken"
    file.write_text("mine")
    args = [a.format(file=file, tmp=tmp_path) for a in command]
    proc = octtrain(
        args[0], "--checkpoint", tmp_path / "x.pt", "--manifest", pristine / "manifest.json",
        *args[1:],
    )  # fmt: skip
    assert_clean(proc, 2, str(file))
    assert file.read_text() == "mine"


@pytest.mark.parametrize(
    "command",
    [
        ["embed", "--checkpoint", "{tmp}/x.pt", "--out", "{cache}/export"],
        ["evaluate", "--checkpoint", "{tmp}/x.pt", "--out", "{cache}/eval"],
        ["probe", "--checkpoint", "{tmp}/x.pt", "--out", "{cache}/volumes/report"],
        ["pretrain", "--config", str(PRETRAIN), "train.run_dir={cache}/run"],
    ],
    ids=["embed", "evaluate", "probe", "pretrain"],
)
def test_an_output_inside_the_cache_folder_is_refused_before_any_work(
    pristine: Path, tmp_path: Path, command: list[str]
) -> None:
    """An export, report or run among a cache's files would be what build-cache and stage
    --replace manage: refused up front, naming the cache, nothing written into it."""
    before = sorted(p.relative_to(pristine).as_posix() for p in pristine.rglob("*"))
    args = [a.format(cache=pristine, tmp=tmp_path) for a in command]
    proc = octtrain(args[0], "--manifest", pristine / "manifest.json", *args[1:])
    assert_clean(proc, 2, "inside the cache folder", str(pristine))
    assert sorted(p.relative_to(pristine).as_posix() for p in pristine.rglob("*")) == before
