"""What a ``stage`` destination may already hold, and how ``stage --replace`` sweeps it.

The output-folder rule (``octstage.outputs``, docs/output-folders.md) for stage's folder: empty,
absent or holding this cache is staged into (a stage resumes); another cache only with
``--replace``; a folder holding anything else never. A replace first records what the replaced
cache's manifest lists (``REPLACING``), so one that is stopped and run again still removes only
those files, and everything a user put there stays, named in the report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from octstage.atomic import atomic_write_text
from octstage.errors import MirrorError
from octstage.outputs import DATA_FOLDERS, ITEMS_SUFFIX, MANIFEST

# What ``stage --replace`` may remove, recorded before the replaced cache's manifest goes.
REPLACING = ".stage-replacing.json"


def _describe(manifest: Path) -> str:
    """A short identity of the cache whose manifest this is (never raises)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        header = data["header"]
        kind = data.get("kind", "oct")
        items = data["fields"] if kind == "cellpainting" else data["volumes"]
        return (
            f"a {kind} cache of {header['dataset']!r} built {header['created']} with "
            f"{len(items)} items"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "a cache whose manifest.json cannot be read"


def check_destination(dst: Path, manifest: bytes, replace: bool) -> bool:
    """Whether ``stage`` replaces a cache in ``dst`` (True: ``--replace`` was given and ``dst``
    holds another cache, or a replace there stopped before it finished); False when ``dst`` is
    empty, absent or holds this cache (complete or not, so a stage resumes). Raises MirrorError
    naming the folder and why when it may not be staged into. A non-empty folder that holds no
    cache is never staged into, and a replace removes only what the replaced cache's manifest
    lists (``sweep_replaced``): what else a user put there stays, and is named."""
    if not dst.exists():
        return False
    if not dst.is_dir():
        raise MirrorError(f"{dst}: not a folder: stage needs a folder to write the cache into")
    entries = {p.name for p in dst.iterdir()}
    unfinished = REPLACING in entries
    old = dst / MANIFEST
    if MANIFEST in entries:
        try:
            same = old.read_bytes() == manifest
        except OSError as exc:
            raise MirrorError(f"{old}: cannot read: {exc.strerror or exc}") from None
        if same:
            return unfinished  # written, but stopped before the replace's record went
        if not replace:
            raise MirrorError(
                f"{dst}: holds another cache ({_describe(old)}); staging here would mix two "
                "caches: choose an empty folder, or pass --replace to replace it (the files of "
                "that cache the new manifest does not name are removed; anything else is kept)"
            )
        return True
    if unfinished:
        if not replace:
            raise MirrorError(
                f"{dst}: a stage --replace into this folder stopped before it finished; run it "
                "again with --replace to finish it (only the replaced cache's files are removed)"
            )
        return True
    foreign = sorted(
        e for e in entries - set(DATA_FOLDERS.values()) if not e.endswith(ITEMS_SUFFIX)
    )
    if foreign:
        raise MirrorError(
            f"{dst}: not empty and holds no cache manifest (found {', '.join(foreign[:5])}"
            f"{' ...' if len(foreign) > 5 else ''}): stage writes only into an empty folder or "
            "one that holds a cache, so nothing of yours is overwritten or removed"
        )
    return False


def record_replaced(dst: Path, listed: Iterable[str]) -> None:
    """Add ``listed`` (the paths a replaced cache's manifest names) to the folder's record of
    what ``stage --replace`` may remove, written before that manifest goes: a replace that is
    stopped and run again still knows which files were the old cache's, and nothing else is
    ever removed. Paths of an earlier unfinished replace stay in the record."""
    paths = replaced_paths(dst) | set(listed)
    atomic_write_text(dst / REPLACING, json.dumps(sorted(paths), indent=0) + "\n")


def replaced_paths(dst: Path) -> set[str]:
    """The paths ``record_replaced`` wrote in ``dst`` (empty when no replace is under way)."""
    record = dst / REPLACING
    try:
        paths: Any = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as exc:
        raise MirrorError(
            f"{record}: unreadable ({exc}): it lists the files of the cache being replaced; "
            "without it nothing can be removed safely: move the folder's contents away yourself, "
            "or choose an empty folder"
        ) from None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise MirrorError(f"{record}: not a list of paths; move it away or choose an empty folder")
    return set(paths)


def sweep_replaced(dst: Path, keep: Iterable[str], replaced: set[str]) -> tuple[int, list[str]]:
    """Remove from ``dst`` what the replaced cache listed (``replaced``) and the new one does not
    (``keep``), stage's own temporaries beside them, and the folders that leaves empty; returns
    how many files went and what was found that neither cache lists, kept in place (a folder is
    named once, with a trailing "/"). Only folders that hold listed paths are walked, kept
    volumes never, and a symlink is removed as a link, its target never touched."""
    kept_volumes = set(keep)
    gone = replaced - kept_volumes
    folders = {
        p.as_posix() for v in kept_volumes | replaced for p in Path(v).parents if p != Path(".")
    }
    removed = 0
    found: list[str] = []

    def visit(folder: Path, rel: str) -> None:
        nonlocal removed
        for entry in sorted(folder.iterdir()):
            name = rel + entry.name
            if name in kept_volumes or name in (MANIFEST, REPLACING):
                continue
            if name in gone or _STAGE_TEMP.fullmatch(entry.name):
                removed += _remove(entry)
            elif name in folders and entry.is_dir() and not entry.is_symlink():
                visit(entry, name + "/")
                if not any(entry.iterdir()):
                    entry.rmdir()
            else:
                found.append(name + "/" if entry.is_dir() and not entry.is_symlink() else name)

    visit(dst, "")
    return removed, found


# stage's own temporaries: a volume fetched into ``.stage-<name>-<8 hex>`` (octstage.stage), a
# file written through ``octstage.atomic`` into ``.<name>.<random>.tmp`` beside it.
_STAGE_TEMP = re.compile(r"\.stage-.+-[0-9a-f]{8}|\.(manifest\.json|.+\.items\.parquet)\..+\.tmp")


def _remove(entry: Path) -> int:
    """Remove a file, link or folder (links inside it unlinked, never followed); files removed."""
    if entry.is_symlink() or not entry.is_dir():
        entry.unlink()
        return 1
    count = sum(
        len(files) + sum(1 for d in dirs if (Path(top) / d).is_symlink())
        for top, dirs, files in os.walk(entry)
    )
    shutil.rmtree(entry)
    return count


def finish_replace(dst: Path) -> None:
    """The replace is complete (the new manifest written): its record goes."""
    (dst / REPLACING).unlink(missing_ok=True)


def clear_manifest(dst: Path) -> None:
    """The old cache's manifest goes first: the folder reads as incomplete while it changes."""
    (dst / MANIFEST).unlink(missing_ok=True)
