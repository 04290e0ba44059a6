"""YAML + dotted overrides -> typed, validated config dataclasses, and back to plain data.

``load_config(PretrainConfig, "configs/pretrain/tiny.yaml", ["train.max_steps=20"])`` reads the
YAML, applies overrides (values parsed with ``yaml.safe_load``) and converts every value to its
annotated type; an unknown key raises ``ConfigError`` naming the dotted key. Every section checks
itself when built (``__post_init__``), so a bad value fails before any work starts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from octtrain.errors import ConfigError

log = logging.getLogger("octtrain")
# The checkout's root: ``--config configs/...`` names a file under it, from any folder.
REPO = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from nested plain data, converting values to the annotated types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or '<root>'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}{key}"
        if key not in fields:
            raise ConfigError(f"unknown config key {dotted!r} (known here: {sorted(fields)})")
        kwargs[key] = _convert(value, hints[key], dotted, _section_default(fields[key]))
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if path and not str(exc).startswith(path):
            raise ConfigError(f"{path.rstrip('.')}: {exc}") from None
        raise


def _section_default(f: dataclasses.Field[Any]) -> Any:
    """The default a parent gives a nested section (``field(default_factory=lambda:
    OptimConfig(lr=5e-4))``), or None: a section the YAML names starts from these values, not
    from the section class's own, so a YAML that sets one key keeps the parent's others."""
    if f.default_factory is dataclasses.MISSING:
        return None
    default = f.default_factory()
    return default if dataclasses.is_dataclass(default) else None


def _convert(value: Any, tp: Any, path: str, section: Any = None) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], path, section)
    if dataclasses.is_dataclass(tp):
        if section is not None and isinstance(value, dict):
            value = _merged(to_dict(section), value)  # keys left out keep the parent's default
        return from_dict(tp, value, path + ".")  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], path) for v in value)
        if len(value) != len(args):
            raise ConfigError(f"{path}: expected {len(args)} values, got {list(value)}")
        return tuple(_convert(v, a, path) for v, a in zip(value, args, strict=True))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        # YAML 1.1 reads "1e-3" as a string; accept any numeric spelling.
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: expected a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{path}: unsupported config type {tp!r}")


def _merged(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` over ``base``, nested mappings merged key by key."""
    out = dict(base)
    for key, value in given.items():
        inner = out.get(key)
        both = isinstance(inner, dict) and isinstance(value, dict)
        out[key] = _merged(inner, value) if both else value  # type: ignore[arg-type]
    return out


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one ``dotted.key=value`` override to nested plain data (value via yaml.safe_load)."""
    key, sep, raw = override.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {override!r} is not of the form dotted.key=value")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part!r} is not a section")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: value is not valid YAML: {exc}") from None


def config_path(yaml_path: str | os.PathLike[str]) -> Path:
    """``yaml_path`` as given, or, when it is relative and not in the current folder, the same
    path under the checkout (``configs/pretrain/tiny.yaml`` from any folder), said in the log.
    A path found in neither is refused, naming both places looked in."""
    path = Path(yaml_path)
    if path.is_absolute() or path.exists():
        return path
    in_repo = REPO / path
    if in_repo.is_file():
        _said_where(path, in_repo)
        return in_repo
    raise ConfigError(
        f"{path}: no such config file (looked in the current folder, {Path.cwd()}, and in the "
        f"checkout, {REPO}); name it by a path from here or from the checkout's root"
    )


@functools.lru_cache(maxsize=16)
def _said_where(path: Path, found: Path) -> None:
    """Say once where a config was found (a command reads its config more than once)."""
    log.info("config %s: not in the current folder; read %s", path, found)


def read_values(yaml_path: str | os.PathLike[str] | None, overrides: list[str]) -> dict[str, Any]:
    """The plain data of ``yaml_path`` (None: empty; a relative path missing here is looked
    for in the checkout: ``config_path``) with the dotted overrides applied."""
    data: dict[str, Any] = {}
    if yaml_path is not None:
        yaml_path = config_path(yaml_path)
        try:
            text = yaml_path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{yaml_path}: cannot read config: {exc.strerror or exc}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{yaml_path}: not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{yaml_path}: top level must be a mapping")
        data = loaded or {}
    for override in overrides:
        apply_override(data, override)
    return data


def load_config(cls: type[T], yaml_path: str | os.PathLike[str] | None, overrides: list[str]) -> T:
    """Read ``yaml_path`` (None: defaults only), apply dotted overrides, build and validate."""
    yaml_path = None if yaml_path is None else config_path(yaml_path)
    data = read_values(yaml_path, overrides)
    try:
        return from_dict(cls, data)
    except ConfigError as exc:
        from_file = read_values(yaml_path, [])  # the file alone: whom to blame
        raise ConfigError(f"{_blame(cls, from_file, exc, yaml_path)}{exc}") from None


def _blame(cls: type[Any], from_file: dict[str, Any], exc: ConfigError, yaml_path: Any) -> str:
    """Where the error came from: the YAML file when the file alone fails the same way, else
    the command line (an override typed there introduced it)."""
    if yaml_path is None:
        return "command line: "
    try:
        from_dict(cls, from_file)
    except ConfigError as alone:
        if str(alone) == str(exc):
            return f"{yaml_path}: "
    return "command line: "


def to_dict(config: Any) -> dict[str, Any]:
    """Plain, YAML-safe data for a config (tuples become lists); ``from_dict`` inverts it."""
    return _plain(dataclasses.asdict(config))  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def to_yaml(config: Any) -> str:
    """The resolved config as YAML, in field order."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)
