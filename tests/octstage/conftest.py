"""Fixtures for octstage tests: the default synthetic dataset, generated once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from octstage.synth import SynthInfo, generate


@pytest.fixture(scope="session")
def synth_info(tmp_path_factory: pytest.TempPathFactory) -> SynthInfo:
    """The default dataset (60 participants, seed 0, small) and what was planted in it."""
    return generate(tmp_path_factory.mktemp("synth") / "aireadi")


@pytest.fixture(scope="session")
def synth_root(synth_info: SynthInfo) -> Path:
    """Root of the default dataset: participants.tsv and retinal_oct/ (treat as read-only)."""
    return synth_info.root
