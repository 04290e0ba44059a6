"""Trainer fixtures: a small real Zarr cache + manifest (shared by pretrain and finetune tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.octtrain.embed_fixtures import embed_twin  # noqa: F401
from tests.octtrain.finetune_fixtures import tiny_finetuned, tiny_pretrained  # noqa: F401
from tests.octtrain.tiny_cache import write_tiny_cache


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(manifest_path, cache_root): 48 volumes 8x32x32, 4 balanced classes, train/val/test
    32/8/8, the label visible as a layer's thickness. Treat it as read-only."""
    return write_tiny_cache(tmp_path_factory.mktemp("tiny-cache"))


@pytest.fixture(autouse=True)
def _few_threads() -> None:
    # Two cores are shared by every test and helper; one intra-op thread keeps runs predictable.
    torch.set_num_threads(1)
