"""BuildConfig validates on construction and hashes every parameter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from octstage.cache import volumestore
from octstage.config import BuildConfig, load_build_config
from octstage.errors import ConfigError


def test_defaults_and_list_inputs_become_tuples() -> None:
    cfg = BuildConfig(shape=[16, 64, 64])  # type: ignore[arg-type]
    assert cfg.shape == (16, 64, 64)
    assert cfg.as_dict()["cache_version"] >= 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shape": (0, 64, 64)}, "shape"),
        ({"shape": (64, 64)}, "shape"),
        ({"p_low": 99.0, "p_high": 1.0}, "percentiles"),
        ({"clevel": 0}, "clevel"),
        ({"clevel": 10}, "clevel"),
        ({"clevel": 22}, "clevel"),  # zstd's own top level, not Blosc's
        ({"clevel": 3.5}, "clevel"),
        ({"clevel": "3"}, "clevel"),  # quoted in YAML: was a TypeError, not a ConfigError
        ({"clevel": True}, "clevel"),
        ({"resize": "cubic"}, "resize"),
        ({"subsample": (0, 1, 1)}, "subsample"),
    ],
)
def test_invalid_values_raise_clear_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BuildConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        BuildConfig(**kwargs)  # type: ignore[arg-type]


def test_the_clevels_the_config_accepts_are_the_ones_blosc_writes(tmp_path: Path) -> None:
    """1 and 9 write a volume; 10 (zstd's own scale goes to 22) fails inside Blosc at write
    time, after the decode, so the config refuses it before any work."""
    volume = np.arange(2 * 16 * 16, dtype=np.uint8).reshape(2, 16, 16)
    for clevel in (1, 9):
        cfg = BuildConfig(clevel=clevel)
        volumestore.write_volume(
            tmp_path, f"v{clevel}", volume, (1.0, 1.0, 1.0), {}, clevel=cfg.clevel
        )
    with pytest.raises(ConfigError, match=r"clevel must be in 1\.\.9 .*got 10"):
        BuildConfig(clevel=10)
    with pytest.raises(RuntimeError, match="blosc"):
        volumestore.write_volume(tmp_path, "v10", volume, (1.0, 1.0, 1.0), {}, clevel=10)


def test_every_parameter_changes_the_hash() -> None:
    base = BuildConfig()
    variants = [
        BuildConfig(shape=(32, 384, 384)),
        BuildConfig(chunks=(8, 128, 128)),
        BuildConfig(clevel=5),
        BuildConfig(p_low=2.0),
        BuildConfig(p_high=98.0),
        BuildConfig(subsample=(1, 1, 1)),
        BuildConfig(resize="linear"),
    ]
    hashes = {base.params_hash(), *(v.params_hash() for v in variants)}
    assert len(hashes) == len(variants) + 1
    assert BuildConfig().params_hash() == base.params_hash()


def test_a_yaml_clevel_outside_blosc_range_is_refused_naming_the_value(tmp_path: Path) -> None:
    settings = tmp_path / "stage.yaml"
    for value, shown in (("12", "12"), ('"3"', "'3'")):
        settings.write_text(f"shape: [8, 32, 32]\nclevel: {value}\n")
        with pytest.raises(ConfigError, match=f"clevel must be in 1\\.\\.9 .*got {shown}$"):
            load_build_config(settings)
