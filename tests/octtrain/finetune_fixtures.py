"""Shared finetuning fixtures: a real tiny pretraining checkpoint and a finetuned one.

Imported by tests/octtrain/conftest.py so every test module shares one of each per session.
The trainer modules are imported inside the fixtures: a broken finetune module must fail the
tests that use it, not the collection of every trainer test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from octstage import manifest as mf

if TYPE_CHECKING:
    from octtrain.config.finetune import FinetuneConfig
    from octtrain.train.job import RunResult

REPO = Path(__file__).resolve().parents[2]
PRETRAIN_TINY = REPO / "configs" / "pretrain" / "tiny.yaml"
FINETUNE_TINY = REPO / "configs" / "finetune" / "tiny.yaml"


def finetune_config(manifest: Path, run_dir: Path, *overrides: str) -> FinetuneConfig:
    """configs/finetune/tiny.yaml on ``manifest``, writing into ``run_dir``."""
    from octtrain.config.finetune import FinetuneConfig
    from octtrain.config.loader import load_config

    base = [f"data.manifest={manifest}", f"train.run_dir={run_dir}", "logging.console=false"]
    return load_config(FinetuneConfig, FINETUNE_TINY, base + list(overrides))


@pytest.fixture(scope="session")
def tiny_pretrained(tiny_cache: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of a real pretraining checkpoint (tiny preset, 4 steps) on the tiny cache."""
    from octtrain.config.loader import load_config
    from octtrain.config.pretrain import PretrainConfig
    from octtrain.train.pretrain import run_pretrain

    manifest, _ = tiny_cache
    run_dir = tmp_path_factory.mktemp("pretrain-tiny")
    overrides = [
        f"data.manifest={manifest}",
        f"train.run_dir={run_dir}",
        "train.max_steps=4",
        "checkpoint.every=4",
        "logging.wandb_mode=disabled",
        "logging.console=false",
    ]
    result = run_pretrain(load_config(PretrainConfig, PRETRAIN_TINY, overrides))
    assert result.last_checkpoint is not None
    return result.last_checkpoint


@pytest.fixture(scope="session")
def tiny_finetuned(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path_factory: pytest.TempPathFactory
) -> RunResult:
    """A 3-epoch finetuning run (encoder frozen for epoch 1) from ``tiny_pretrained``."""
    from octtrain.train.finetune import run_finetune

    manifest, _ = tiny_cache
    run_dir = tmp_path_factory.mktemp("finetune-tiny")
    return run_finetune(finetune_config(manifest, run_dir), tiny_pretrained)


def manifest_variant(
    manifest: Path, out: Path, edit: Callable[[list[mf.Volume]], list[mf.Volume]]
) -> Path:
    """A copy of ``manifest`` in ``out`` whose volumes ``edit`` changed (same cache)."""
    original = mf.load(manifest)
    volumes = tuple(edit(list(original.volumes)))
    path = out / "manifest.json"
    mf.write(dataclasses.replace(original, volumes=volumes), path)
    return path
