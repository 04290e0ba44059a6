"""What a ``stage`` destination already holds, and what may be done to it.

A folder is staged into only when it is empty, holds the very same cache (the same manifest
bytes: re-staging is idempotent and repairs damaged volumes), or holds a stage of any cache
that was cut off before its manifest was written (only ``volumes/``: a resumed stage reuses the
volumes that verify). A folder holding another cache is refused unless ``--replace`` is given:
then its manifest is removed first (the folder reads as incomplete while it changes), and once
every new volume verified, every file the new manifest does not name goes, and the new manifest
is written last. A non-empty folder that holds no cache at all is never staged into: replacing
it would delete files octstage did not write.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from octstage.errors import MirrorError

MANIFEST = "manifest.json"
VOLUMES = "volumes"


def _describe(manifest: Path) -> str:
    """A short identity of the cache whose manifest this is (never raises)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        header = data["header"]
        return (
            f"a cache of {header['dataset']!r} built {header['created']} with "
            f"{len(data['volumes'])} volumes"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "a cache whose manifest.json cannot be read"


def check_destination(dst: Path, manifest: bytes, replace: bool) -> bool:
    """Whether ``dst`` holds another cache that ``--replace`` allows to be replaced (True);
    False when it is empty, absent or holds this cache (complete or not). Raises MirrorError
    naming the folder and why when it may not be staged into."""
    if not dst.exists():
        return False
    if not dst.is_dir():
        raise MirrorError(f"{dst}: not a folder: stage needs a folder to write the cache into")
    entries = {p.name for p in dst.iterdir()}
    old = dst / MANIFEST
    if MANIFEST in entries:
        try:
            same = old.read_bytes() == manifest
        except OSError as exc:
            raise MirrorError(f"{old}: cannot read: {exc.strerror or exc}") from None
        if same:
            return False
        if not replace:
            raise MirrorError(
                f"{dst}: holds another cache ({_describe(old)}); staging here would mix two "
                "caches: choose an empty folder, or pass --replace to replace it (files the new "
                "manifest does not name are removed)"
            )
        return True
    foreign = sorted(entries - {VOLUMES})
    if foreign:
        raise MirrorError(
            f"{dst}: not empty and holds no cache manifest (found {', '.join(foreign[:5])}"
            f"{' ...' if len(foreign) > 5 else ''}): stage writes only into an empty folder or "
            "one that holds a cache, so nothing of yours is overwritten or removed"
        )
    return False


def remove_unlisted(dst: Path, volumes: Iterable[str]) -> int:
    """Remove every file under ``dst`` outside the listed volume folders (and the manifest),
    then the folders left empty; returns how many files went. Kept volumes are not walked."""
    keep = set(volumes)
    ancestors = {str(Path(v).parents[i]) for v in keep for i in range(len(Path(v).parents) - 1)}
    removed = 0
    for top, dirs, files in os.walk(dst, topdown=False):
        rel = Path(top).relative_to(dst).as_posix()
        rel = "" if rel == "." else rel
        if rel in keep or _inside(rel, keep):
            continue
        for name in files:
            if rel or name != MANIFEST:
                (Path(top) / name).unlink()
                removed += 1
        for name in dirs:
            child = Path(top) / name
            if child.is_symlink():
                child.unlink()
                removed += 1
            elif f"{rel}/{name}".lstrip("/") not in keep | ancestors and not any(child.iterdir()):
                child.rmdir()
    return removed


def _inside(rel: str, keep: set[str]) -> bool:
    """Whether ``rel`` lies inside one of the kept volume folders."""
    parts = rel.split("/")
    return any("/".join(parts[:i]) in keep for i in range(1, len(parts)))


def clear_manifest(dst: Path) -> None:
    """The old cache's manifest goes first: the folder reads as incomplete while it changes."""
    (dst / MANIFEST).unlink(missing_ok=True)
