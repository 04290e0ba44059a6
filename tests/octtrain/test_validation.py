"""Exact-once validation: sharding, padding, the reduction, failures; 2-3 real gloo processes."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from octtrain.config.sections import DataConfig
from octtrain.data.loaders import PaddedShard, padded_loader, steps_per_process
from octtrain.data.samplers import shard
from octtrain.eval.common.validation import ValidationError, collect, predict
from octtrain.runtime.backend import TorchBackend

C = 4


def _image(batch: dict[str, Any]) -> torch.Tensor:
    image: torch.Tensor = batch["image"]
    return image


class Items(Dataset[dict[str, Any]]):
    """Sample i is a vector whose class-(i % C) coordinate is large; item ``broken`` raises."""

    def __init__(self, n: int, broken: int | None = None) -> None:
        self.n, self.broken = n, broken

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.broken:
            raise OSError(f"cannot read sample {i}")
        x = torch.zeros(C)
        x[i % C] = 3.0 + i / 100
        return {"image": x, "label": torch.tensor(i % C)}


def test_shards_cover_each_sample_exactly_once() -> None:
    for n in range(12):
        for world in range(1, 5):
            got = sorted(i for r in range(world) for i in shard(n, r, world))
            assert got == list(range(n))
            steps = steps_per_process(n, world, batch_size=2)
            assert all(len(shard(n, r, world)) <= steps * 2 for r in range(world))
    assert shard(1, 1, 2) == []  # a process may have nothing...
    assert steps_per_process(1, 2, 4) == 1  # ...and still runs the same number of batches
    assert steps_per_process(0, 2, 4) == 0


def test_padded_shard_marks_fillers_invalid() -> None:
    data = PaddedShard(Items(5), [1, 3], length=4, filler_index=0)
    items = [data[i] for i in range(len(data))]
    assert [int(it["index"]) for it in items] == [1, 3, 0, 0]
    assert [float(it["valid"]) for it in items] == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="padded length"):
        PaddedShard(Items(5), [0, 1, 2], length=2, filler_index=0)


def test_predict_single_process_matches_direct_computation() -> None:
    backend = TorchBackend("cpu")
    data = Items(7)
    loader = padded_loader(data, len(data), rank=0, world=1, batch_size=3)
    assert len(loader) == 3  # 7 samples -> 3 full batches of 3, two fillers
    out = predict(nn.Identity(), loader, backend, n=7, num_classes=C, to_input=_image)
    expected = torch.softmax(torch.stack([data[i]["image"] for i in range(7)]), dim=-1)
    np.testing.assert_allclose(out.probs, expected.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(out.labels, np.arange(7) % C)
    assert out.nll > 0


def test_failing_sample_raises_validation_error_and_restores_mode() -> None:
    backend = TorchBackend("cpu")
    model = nn.Identity()
    model.train()
    loader = padded_loader(Items(5, broken=3), 5, rank=0, world=1, batch_size=2)
    with pytest.raises(ValidationError, match="failed on process 0: cannot read sample 3"):
        predict(model, loader, backend, n=5, num_classes=C, to_input=_image)
    assert model.training


def test_duplicates_and_losses_break_the_invariant() -> None:
    # A shard that serves sample 1 twice and never sample 2 (the padded-sampler bug).
    batch = {"index": torch.tensor([0, 1, 1]), "valid": torch.ones(3), "x": torch.ones(3, 1)}
    with pytest.raises(ValidationError, match="1 sample\\(s\\) counted more than once, 1 never"):
        collect(lambda b: b["x"], [batch], TorchBackend("cpu"), n=3, width=1)


WORKER = textwrap.dedent(
    """
    import faulthandler, json, os, sys
    # A process stuck in a collective (the hang these tests guard against) prints where it is
    # and exits, failing the test in two minutes rather than at gloo's ten-minute timeout.
    faulthandler.dump_traceback_later(120, exit=True)
    import torch
    from torch import nn
    sys.path.insert(0, os.environ["TEST_DIR"])
    from octtrain.runtime.backend import TorchBackend
    from octtrain.data.loaders import padded_loader
    from octtrain.eval.common.validation import ValidationError, predict
    from tests.octtrain.test_validation import Items, C, _image

    n, broken_rank = int(sys.argv[1]), int(sys.argv[2])
    broken_item, spmd = int(sys.argv[4]), sys.argv[5].startswith("spmd")
    ctrl_c = sys.argv[5] == "spmd-ctrl-c"  # the broken item's read is a Ctrl-C, not an error
    backend = TorchBackend("cpu")
    model = nn.Identity()
    if spmd:
        # As under XLA SPMD: each batch's forward is one program over every host (here: a
        # collective in the forward) and step values are already global (no all-reduce).
        backend.step_is_global = True
        host_sum = backend.reduce_step_sum  # an all-reduce: what a sum over hosts still is
        backend.reduce_host_sum = lambda tensor: host_sum(tensor)
        backend.reduce_step_sum = lambda tensor: tensor.clone()

        class GlobalStep(nn.Module):
            def forward(self, x):
                torch.distributed.all_reduce(torch.ones(7))
                return x

        model = GlobalStep()
    broken = broken_item if backend.rank == broken_rank else None  # only this one fails to read
    if sys.argv[5] == "ddp-forward":  # the broken rank's first forward fails, not its read

        class OutOfMemory(nn.Module):
            def forward(self, x):
                raise RuntimeError("CUDA out of memory: tried to allocate 2.00 GiB")

        model = OutOfMemory() if backend.rank == broken_rank else model
        broken = None
    data = Items(n, broken=broken)
    if ctrl_c:
        import signal
        from octtrain.runtime.interrupt import agreed_ctrl_c

        # As at a terminal: under a background test run (cmd &) SIGINT arrives ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)

        class CtrlC(Items):
            def __getitem__(self, i):
                if i == self.broken:
                    os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C on this host alone
                    self.broken = None
                return super().__getitem__(i)

        data = CtrlC(n, broken=broken)
    loader = padded_loader(data, n, backend.rank, backend.world_size, batch_size=2)
    result = {"rank": backend.rank, "batches": len(loader)}
    forwards = [0]
    model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:
        with agreed_ctrl_c(2) if ctrl_c else open(os.devnull):
            out = predict(model, loader, backend, n=n, num_classes=C, to_input=_image)
        result["labels"] = out.labels.tolist()
        result["argmax"] = out.probs.argmax(axis=1).tolist()
    except ValidationError as exc:
        result["error"] = str(exc)
    except KeyboardInterrupt:
        result["error"] = "interrupted"
    result["forwards"] = forwards[0]
    backend.barrier()
    backend.close()
    with open(os.path.join(sys.argv[3], f"rank{result['rank']}.json"), "w") as fh:
        json.dump(result, fh)
    """
)


def _torchrun(
    tmp_path: Path, procs: int, n: int, broken_rank: int, broken_item: int = 1, mode: str = "ddp"
) -> list[dict[str, Any]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TEST_DIR": str(repo), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={procs}", str(script), str(n), str(broken_rank), str(tmp_path)]
    cmd += [str(broken_item), mode]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(procs)]


@pytest.mark.slow
def test_torchrun_fewer_samples_than_processes(tmp_path: Path) -> None:
    results = _torchrun(tmp_path, procs=3, n=2, broken_rank=-1)
    for res in results:  # every process sees both samples exactly once, none hangs
        assert res["batches"] == 1
        assert res["labels"] == [0, 1] and res["argmax"] == [0, 1]


@pytest.mark.slow
def test_torchrun_failure_on_one_process_is_seen_by_all(tmp_path: Path) -> None:
    results = _torchrun(tmp_path, procs=2, n=5, broken_rank=1)
    own = results[1]["error"]
    assert own.startswith("validation failed on process 1: ")
    # Its message, agreed at the batch it could not load (every multi-process validation
    # agrees per batch: a pod's Ctrl-C travels the same way).
    assert results[0]["error"] == f"host 1 failed at validation batch 1: {own}"


@pytest.mark.slow
def test_torchrun_a_forward_failing_on_one_process_is_agreed_at_the_next_batch(
    tmp_path: Path,
) -> None:
    """Process 1's forward fails (a CUDA OOM) after both loaded batch 1: it carries the failure
    into batch 2's agreement, where process 0 waits. Joining the table's reduction instead, it
    would pair a float sum with the others' flag sum (gloo aborts: SIGABRT)."""
    results = _torchrun(tmp_path, procs=2, n=9, broken_rank=1, mode="ddp-forward")
    own = results[1]["error"]
    assert (
        own == "validation failed on process 1: RuntimeError: CUDA out of memory: tried to "
        "allocate 2.00 GiB"
    )
    assert results[0]["error"] == f"host 1 failed at validation batch 2: {own}"


@pytest.mark.slow
def test_spmd_a_host_failing_mid_validation_stops_every_host_at_that_batch(
    tmp_path: Path,
) -> None:
    # 9 samples over 2 hosts, batches of 2: host 1 loads 1, 3 | 5, 7 | ... and fails in its
    # second batch, while host 0 would enter that batch's forward (a collective) and wait.
    results = _torchrun(tmp_path, procs=2, n=9, broken_rank=1, broken_item=7, mode="spmd")
    own = results[1]["error"]
    assert own == "validation failed on process 1: cannot read sample 7"
    assert results[0]["error"] == f"host 1 failed at validation batch 2: {own}"


@pytest.mark.slow
def test_spmd_a_ctrl_c_on_one_host_mid_validation_stops_every_host_at_the_same_batch(
    tmp_path: Path,
) -> None:
    """The per-batch agreement under a backend whose step is global (each forward a
    collective) carries a pod's Ctrl-C: host 1's arrives while it reads its second batch, and
    both hosts stop before that batch's forward. Raised on host 1 alone, host 0 would wait in
    the forward's collective (the worker's faulthandler ends it after two minutes)."""
    results = _torchrun(tmp_path, procs=2, n=9, broken_rank=1, broken_item=7, mode="spmd-ctrl-c")
    assert [r["error"] for r in results] == ["interrupted", "interrupted"]
    assert [r["forwards"] for r in results] == [1, 1]  # the first batch's only, on both


def test_failed_validations_leave_no_loader_workers_behind() -> None:
    """With continue_on_failure each failed validation used to leave its loader (workers here;
    on XLA torch_xla's thread and the batches it holds on the device) until the garbage
    collector found the failure's reference cycle: one more per failure. The collector is off
    here, so only the explicit release counts."""
    backend = TorchBackend("cpu")
    data = Items(24)
    cfg = DataConfig(num_workers=1, persistent_workers=False, pin_memory=False)

    def failing(batch: dict[str, Any]) -> torch.Tensor:
        raise RuntimeError("the forward ran out of memory")  # after the loader started

    alive = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            loader = padded_loader(data, 24, 0, 1, batch_size=2, cfg=cfg)
            with pytest.raises(ValidationError, match="ran out of memory"):
                collect(failing, backend.wrap_loader(loader), backend, n=24, width=C)
            alive.append(len(multiprocessing.active_children()))
    finally:
        gc.enable()
    assert alive == [0, 0, 0]
