"""The Cell Painting export's fixture, shared by the export's tests: one twin (2 plates x 24
wells x 3 sites, 128 px), one 20-step DINO run and one export (``--part-size 8``: 18 parts), made
once a session (~30 s). Treat it as read-only: copy the export before changing anything."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from octstage.cli import main as octstage
from octtrain.cli import main as octtrain

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
