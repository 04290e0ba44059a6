"""BuildConfig validates on construction and hashes every parameter."""

from __future__ import annotations

import pytest

from octstage.config import BuildConfig
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
        ({"resize": "cubic"}, "resize"),
        ({"subsample": (0, 1, 1)}, "subsample"),
    ],
)
def test_invalid_values_raise_clear_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BuildConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        BuildConfig(**kwargs)  # type: ignore[arg-type]


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
