"""Typed build settings, validated when constructed (a bad value fails before any work starts)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from octstage.errors import ConfigError
from octstage.manifest import CACHE_VERSION
from octstage.provenance import config_hash


@dataclass(frozen=True)
class BuildConfig:
    """Every parameter that changes what a cached volume contains (all go into the cache key)."""

    shape: tuple[int, int, int] = (64, 384, 384)
    chunks: tuple[int, int, int] = (16, 128, 128)
    clevel: int = 3
    p_low: float = 1.0
    p_high: float = 99.0
    subsample: tuple[int, int, int] = (2, 4, 4)
    resize: str = "area"  # per-B-scan area averaging, linear across frames

    def __post_init__(self) -> None:
        for name, what in (
            ("shape", "three positive sizes (D H W)"),
            ("chunks", "three positive sizes"),
            ("subsample", "three positive strides"),
        ):
            value = getattr(self, name)
            if (
                not isinstance(value, (list, tuple))
                or len(value) != 3
                or not all(_is_int(x) and x >= 1 for x in value)
            ):
                raise ConfigError(f"{name} must be {what}, got {value!r}")
        for name in ("p_low", "p_high"):
            value = getattr(self, name)
            if not _is_number(value):
                raise ConfigError(f"{name} must be a number (a percentile), got {value!r}")
        if not 0.0 <= self.p_low < self.p_high <= 100.0:
            raise ConfigError(
                f"percentiles must satisfy 0 <= p_low < p_high <= 100, got {self.p_low}, "
                f"{self.p_high}"
            )
        # Blosc's levels are 0..9 whatever its inner codec (zstd alone would take 22): a higher
        # value fails every write, after the whole decode. 0 would store volumes uncompressed.
        # A YAML "3" (quoted) or 3.5 is no level either: without the type check the first is a
        # TypeError here and the second reaches Blosc.
        level = self.clevel
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 9:
            raise ConfigError(
                f"clevel must be in 1..9 (Blosc's compression levels; 0 stores uncompressed), "
                f"got {level!r}"
            )
        if not isinstance(self.resize, str) or self.resize not in ("area", "linear"):
            raise ConfigError(f"resize must be 'area' or 'linear', got {self.resize!r}")
        # Lists from YAML/argparse become tuples so the config stays hashable and comparable.
        for name in ("shape", "chunks", "subsample"):
            object.__setattr__(self, name, tuple(int(x) for x in getattr(self, name)))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cache_version": CACHE_VERSION}

    def params_hash(self) -> str:
        """Hash of every preprocessing parameter and the cache version."""
        return config_hash(self.as_dict())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_build_config(path: str | Path | None, **overrides: Any) -> BuildConfig:
    """A BuildConfig from a YAML file of values (``configs/stage/*.yaml``) plus overrides.

    Unknown keys are an error naming the file: a typo must not silently fall back to a default.
    ``None`` overrides (an option not given on the command line) are ignored.
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read build settings: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of build settings")
        known = {f.name for f in fields(BuildConfig)}
        unknown = sorted(set(loaded) - known)
        if unknown:
            raise ConfigError(f"{path}: unknown build settings {unknown}; known: {sorted(known)}")
        values = loaded
    try:
        config = BuildConfig(**values)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(config, **given) if given else config
