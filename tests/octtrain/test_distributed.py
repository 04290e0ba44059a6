"""Two real processes (torchrun, gloo): disjoint data shards, identical weights, one writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "pretrain" / "tiny.yaml"


@pytest.mark.slow
def test_two_process_gloo_run_shards_without_overlap(
    tiny_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "tests" / "octtrain" / "ddp_worker.py"),
        str(TINY),
        str(tmp_path),
        f"data.manifest={tiny_cache[0]}",
        f"train.run_dir={run}",
        "train.max_steps=4",
        "data.batch_size=8",
        "checkpoint.every=2",
        "logging.log_every=1",
        "validation.every=2",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2
    seen0 = [i for batch in r0["indices"] for i in batch]
    seen1 = [i for batch in r1["indices"] for i in batch]
    assert all(len(b) == 4 for b in r0["indices"] + r1["indices"])  # global 8 = 2 x 4
    assert not set(seen0) & set(seen1)
    assert sorted(seen0 + seen1) == list(range(32))  # one epoch of the train split, no overlap
    assert r0["weights"] == r1["weights"]  # DDP kept the replicas identical
    assert r0["run_dir"] == str(run) and r1["run_dir"] is None
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    assert [e["step"] for e in index["checkpoints"]] == [2, 4]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if "val/loss" in r]
    assert [r["val/samples"] for r in val] == [8.0, 8.0]  # both shards counted once
    # The logged loss is the mean of both hosts' own losses, not host 0's alone.
    logged = {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
    assert sorted(logged) == [1, 2, 3, 4]
    for step, value in logged.items():
        own = r0["losses"][str(step - 1)], r1["losses"][str(step - 1)]  # step i logs as i + 1
        assert own[0] != pytest.approx(own[1], rel=1e-4)  # the shards differ, so this can fail
        assert value == pytest.approx(sum(own) / 2, rel=1e-5)
