"""DINOv2 in two real processes (torchrun, gloo): the student wrapped in DDP or sharded by FSDP,
the attention pictures read through the wrapper at the first step, replicas identical."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.octtrain.cell_cache import write_cell_cache
from tests.octtrain.test_pod import FAULT_WORKER, ended, pod_processes, torchrun

ROOT = Path(__file__).resolve().parents[2]
DINO_TINY = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"


def two_ranks(cache: Path, out: Path, *overrides: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One DINO run of two gloo processes on ``cache``; each rank's record from ``out``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    worker = ROOT / "tests" / "octtrain" / "dino_ddp_worker.py"
    cmd += [str(worker), str(DINO_TINY), str(cache), str(out), "data.batch_size=4", *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    return r0, r1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parallel", "compile_", "wrapper"),
    [
        ("ddp", "none", "DistributedDataParallel"),
        ("fsdp", "none", "FSDPDinoStudent"),
        # dino-vits8.yaml compiles: the compiled forwards and objective under DDP's hooks and
        # FSDP2's all-gathers (aot_eager: the same tracing, no code generation)
        ("ddp", "aot_eager", "OptimizedModule"),
        ("fsdp", "aot_eager", "OptimizedModule"),
    ],
)
def test_two_processes_write_attention_pictures_through_the_wrapper_at_step_1(
    parallel: str, compile_: str, wrapper: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    write_cell_cache(cache)
    run = tmp_path / "run"
    r0, r1 = two_ranks(
        cache,
        tmp_path,
        f"train.run_dir={run}",
        f"parallel={parallel}",
        f"compile={compile_}",
        "dino.warmup_teacher_temp=0.02",  # the temperature changes from step to step
        "dino.warmup_teacher_temp_steps=3",
        "train.max_steps=3",
        "checkpoint.every=3",
    )
    assert r0["world_size"] == 2 and r0["wrapper"] == r1["wrapper"] == wrapper
    assert r0["weights"] == r1["weights"]  # the replicas stayed identical
    assert r0["steps"] == 3 and r1["run_dir"] is None
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    images = [r for r in records if "images" in r]
    assert images[0]["step"] == 1
    for key in ("train/attention", "train/features_pca"):
        assert (run / images[0]["images"][key]).stat().st_size > 0
    assert (run / "checkpoints" / "step_00000003.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_resume_to_the_weights_of_an_unbroken_run(
    parallel: str, tmp_path: Path
) -> None:
    """5 steps straight vs 3 steps, stop, resume to 5: the same student on both ranks, so the
    checkpoint (gathered under FSDP on process 0) holds everything the run needs: student,
    teacher, centres, optimizer state and where the data order stood."""
    cache = tmp_path / "cache"
    cache.mkdir()
    write_cell_cache(cache)

    def run(name: str, *extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
        out = tmp_path / f"out-{name}-{len(extra)}"
        out.mkdir()
        # The cosine's length is the same in all three runs (not each run's max_steps).
        common = [f"parallel={parallel}", "logging.image_every=0", "schedule.total_steps=5"]
        return two_ranks(cache, out, f"train.run_dir={tmp_path / name}", *common, *extra)

    straight = run("straight", "train.max_steps=5", "checkpoint.every=5")
    run("broken", "train.max_steps=3", "checkpoint.every=3")
    resumed = run("broken", "train.max_steps=5", "checkpoint.every=5", "checkpoint.resume=auto")
    assert resumed[0]["steps"] == 5
    assert resumed[0]["weights"] == resumed[1]["weights"]
    assert resumed[0]["weights"] == straight[0]["weights"]


@pytest.mark.slow
def test_a_validation_field_one_host_cannot_read_stops_both_with_its_message(
    tmp_path: Path,
) -> None:
    """Every host reads every validation field; without the per-batch agreement the failing
    host raises alone and the other waits for it in the next collective (gloo's error, exit 1,
    or NCCL's 10-minute timeout under FSDP)."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    out.mkdir()
    write_cell_cache(cache, splits=("train",) * 8 + ("val",) * 8)  # plate P1: validation
    args = [str(FAULT_WORKER), str(out), "--config", str(DINO_TINY)]
    args += ["--manifest", str(cache / "manifest.json"), f"train.run_dir={tmp_path}/run"]
    args += ["train.max_steps=2", "validation.every=2", "validation.continue_on_failure=false"]
    args += ["logging.image_every=0", "checkpoint.every=2", "data.batch_size=4"]
    torchrun([*args], timeout=300, POD_FAIL="dino-validation:1")
    found = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [f["code"] for f in found] == [2, 2]  # validation failed: exit 2 on both
    own, other = found[1]["errors"][-1], found[0]["errors"][-1]
    assert own.startswith("validation failed on process 1: ") and "unreadable chunk" in own, own
    assert other.startswith("host 1 failed at validation batch 1: "), other
    assert other.endswith(own), other


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "cause", "where"),
    [
        ("dino-forward", "CUDA out of memory", "at validation batch 2"),
        ("dino-forward-last", "CUDA out of memory", "in validation"),  # after the last batch
        ("dino-metrics", "distances overflowed", "validating unit 2"),
    ],
)
def test_dino_s_validation_failing_on_one_host_alone_stops_both_with_its_message(
    tmp_path: Path, point: str, cause: str, where: str
) -> None:
    """Host 1's validation forward runs out of memory (carried into the next batch's
    agreement), or its metrics fail after the last batch (agreed once more after the pass):
    both exit 2 with its message. Unagreed, host 1's checkpoint agreement pairs with host 0's
    next batch agreement, and host 0 trains on into a hang."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    out.mkdir()
    write_cell_cache(cache, n=24, splits=("train",) * 8 + ("val",) * 16)  # 2 validation batches
    args = [str(FAULT_WORKER), str(out), "--config", str(DINO_TINY)]
    args += ["--manifest", str(cache / "manifest.json"), f"train.run_dir={tmp_path}/run"]
    args += ["train.max_steps=4", "validation.every=2", "validation.continue_on_failure=false"]
    args += ["logging.image_every=0", "checkpoint.every=2", "data.batch_size=4"]
    args += ["train.stall_exit_s=120"]
    torchrun([*args], timeout=300, POD_FAIL=f"{point}:1")
    found = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [f["code"] for f in found] == [2, 2]
    own, other = found[1]["errors"][-1], found[0]["errors"][-1]
    assert own.startswith("validation failed on process 1: ") and cause in own, own
    # The forward's failure stops host 0 at the next batch (the last one's: after the pass),
    # the metrics' at the trainer's agreement on the validation.
    assert other == f"host 1 failed {where}: {own}", other


@pytest.mark.slow
def test_a_ctrl_c_on_one_host_while_dino_is_set_up_ends_both_with_130(tmp_path: Path) -> None:
    """While host 1 reads its manifest, host 0 waits for it in the setup's agreement: a Ctrl-C
    on host 1 stops both there (without the agreed flag host 1 ends alone and host 0 dies on
    gloo's peer-closed error, exit 1)."""
    cache, out, mark = tmp_path / "cache", tmp_path / "out", tmp_path / "mark"
    cache.mkdir()
    out.mkdir()
    write_cell_cache(cache, splits=("train",) * 16)
    args = [str(out), "--config", str(DINO_TINY), "--manifest", str(cache / "manifest.json")]
    args += [f"train.run_dir={tmp_path}/run", "train.max_steps=500", "data.batch_size=4"]
    args += ["logging.image_every=0", "checkpoint.dir=", "train.stall_exit_s=120"]
    procs = pod_processes(args, POD_FAIL="slow-setup:1", POD_MARK=str(mark))
    deadline = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a host ended before the Ctrl-C"
        time.sleep(0.2)
    assert mark.exists(), "host 1 never began reading its manifest"
    procs[1].send_signal(signal.SIGINT)
    codes, stderr = ended(procs, 60)
    assert codes == [130, 130], [e[-2000:] for e in stderr]
    stops = [
        re.findall(r"Ctrl-C on host\(s\) \[([\d, ]+)\]: every host stops here \((.*)\)", e)
        for e in stderr
    ]
    assert stops[0] == stops[1] == [("1", "setting up the job")], stops
