"""The Cell Painting export's fixture, shared by the export's tests: one twin (2 plates x 24
wells x 3 sites, 128 px), one 20-step DINO run and one export (``--part-size 8``: 18 parts), made
once a session (~30 s). Treat it as read-only: copy the export before changing anything."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from octstage.cli import main as octstage
from octtrain.cli import main as octtrain
from tests.badinput.conftest import start_as_at_a_terminal

ROOT = Path(__file__).resolve().parents[2]
DINO_TINY = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"
PART = "8"  # items per part: 18 parts for the twin's 144 fields


@pytest.fixture(scope="session")
def embed_twin(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The twin's cache, a 20-step DINO checkpoint and its export (``--part-size 8``)."""
    tmp = tmp_path_factory.mktemp("embed-cp")
    source, cache, run = tmp / "twin", tmp / "cache", tmp / "run"
    assert (
        octstage(
            [
                "synth",
                "--kind",
                "cellpainting",
                str(source),
                "--plates",
                "2",
                "--sites",
                "3",
                "--size",
                "128",
                "--no-traps",
            ]
        )
        == 0
    )
    jump = source / "cpg0016-jump"
    assert (
        octstage(
            [
                "build-cache",
                "--kind",
                "cellpainting",
                "--source",
                str(jump),
                "--map-prefix",
                f"s3://cellpainting-gallery/cpg0016-jump/={jump}/",
                "--metadata",
                str(source / "datasets" / "metadata"),
                "--out",
                str(cache),
            ]
        )
        == 0
    )
    assert (
        octtrain(
            [
                "pretrain",
                "--config",
                str(DINO_TINY),
                "--manifest",
                str(cache / "manifest.json"),
                f"train.run_dir={run}",
                "train.max_steps=20",
                "checkpoint.every=20",
                "data.batch_size=16",
                "schedule.warmup_steps=5",
                "logging.wandb_mode=disabled",
            ]
        )
        == 0
    )
    ns = SimpleNamespace(
        tmp=tmp,
        manifest=cache / "manifest.json",
        checkpoint=run / "checkpoints",
        export=tmp / "export",
    )
    assert embed(ns, ns.export) == 0
    return ns


def embed_args(ns: SimpleNamespace, out: Path, *extra: str) -> list[str]:
    """``octtrain embed``'s arguments for the module's checkpoint and manifest."""
    args = ["embed", "--checkpoint", str(ns.checkpoint), "--manifest", str(ns.manifest)]
    return [*args, "--out", str(out), "--part-size", PART, "--device", "cpu", *extra]


def embed(ns: SimpleNamespace, out: Path, *extra: str) -> int:
    return octtrain(embed_args(ns, out, *extra))


def _begun(out: Path, index: int) -> bool:
    """Whether part ``index`` is being written (its temporary file exists)."""
    parts = out / "parts"
    return parts.is_dir() and any(parts.glob(f".part-{index:05d}.parquet.*.tmp"))


def stopped_mid_part(
    ns: SimpleNamespace, out: Path, stop: Callable[[subprocess.Popen[bytes]], None]
) -> tuple[int, str]:
    """``octtrain embed`` into ``out`` (one item a batch) run as at a terminal and stopped by
    ``stop(process)`` once two parts are finished and the third begun (so the signal lands
    inside a part); its exit code and output."""
    proc = start_as_at_a_terminal("octtrain.cli", embed_args(ns, out, "--batch-size", "1"), ROOT)
    try:
        started = time.monotonic()
        while not _begun(out, 2):
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            assert time.monotonic() - started < 120, "no part begun"
            time.sleep(0.01)
        stop(proc)
        text = proc.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, text
