"""Every YAML in configs/stage/ loads into a valid BuildConfig; typos are errors, not defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from octstage.config import BuildConfig, load_build_config
from octstage.errors import ConfigError

STAGE_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "stage").glob("*.yaml"))


def test_there_are_stage_configs() -> None:
    assert {p.name for p in STAGE_CONFIGS} >= {"default.yaml", "demo.yaml"}


@pytest.mark.parametrize("path", STAGE_CONFIGS, ids=lambda p: p.name)
def test_every_stage_config_loads(path: Path) -> None:
    assert isinstance(load_build_config(path), BuildConfig)


def test_default_yaml_matches_the_code_defaults() -> None:
    assert load_build_config(STAGE_CONFIGS[0].parent / "default.yaml") == BuildConfig()


def test_overrides_win_and_none_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("shape: [16, 64, 64]\nclevel: 5\n")
    cfg = load_build_config(path, shape=(8, 32, 32), clevel=None)
    assert (cfg.shape, cfg.clevel) == ((8, 32, 32), 5)


def test_unknown_key_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("shpae: [16, 64, 64]\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml.*shpae"):
        load_build_config(path)


def test_unreadable_or_malformed_yaml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("shape: [16, 64\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        load_build_config(bad)
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        load_build_config(tmp_path / "missing.yaml")


def test_the_dask_worker_config_unsets_the_malloc_trim_threshold() -> None:
    """configs/dask/worker.yaml (for workers started by hand) must say what the local cluster
    says: no MALLOC_TRIM_THRESHOLD_ for the decoders (30-45% per volume otherwise)."""
    import dask.config

    path = Path(__file__).resolve().parents[2] / "configs" / "dask" / "worker.yaml"
    config = dask.config.collect(paths=[str(path)], env={})
    environ = config["distributed"]["nanny"]["pre-spawn-environ"]
    assert "MALLOC_TRIM_THRESHOLD_" in environ and environ["MALLOC_TRIM_THRESHOLD_"] is None
