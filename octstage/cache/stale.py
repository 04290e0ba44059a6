"""Arrays of a cache's earlier manifest that a rebuild's manifest replaces: removed after it.

A rebuild writes an item whose key changed (a source file restored or replaced, another
``--shape``) as a new array and lists that one: the old array is no longer listed, and
``verify`` reports it as extra. Once the new manifest is written (the old one names the old
arrays until then: a build cut off before its manifest leaves the cache as it was), the build
removes the arrays the replaced manifest listed whose every item the new manifest stores
elsewhere (``superseded``), under the build's lock. Arrays of items the new manifest does not
list at all (a plate or volume left out for an environment fault, a rejection, a narrower
selection) are kept, so a re-run that takes them back reuses them; they are named in one line.
Only paths under the cache's array folders, inside the cache, are ever removed: never anything
the old manifest did not list.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from octstage.errors import ManifestError
from octstage.manifest.serial import table_file_name
from octstage.outputs import DATA_FOLDERS

ARRAY_TOPS = (*DATA_FOLDERS.values(), "packs")  # where a cache's arrays live
SHOWN = 5  # array paths named in a line

Arrays = dict[str, set[str]]  # zarr_path -> the items stored there (item_id or source_path)


def listed_arrays(manifest: Path) -> Arrays | None:
    """The arrays a manifest file lists (either form), read as two columns, never as items;
    None when there is no readable manifest there (nothing is then removed)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        kind = str(data.get("kind", "oct"))
        key = "item_id" if kind == "cellpainting" else "source_path"
        if "table" in data:
            name = table_file_name(data["table"], str(manifest))
            table = pq.read_table(manifest.parent / name, columns=["zarr_path", key])
            pairs: Iterable[tuple[str, str]] = zip(
                table.column("zarr_path").to_pylist(), table.column(key).to_pylist(), strict=True
            )
        else:
            items = data["fields" if kind == "cellpainting" else "volumes"]
            pairs = ((str(i["zarr_path"]), str(i[key])) for i in items)
        arrays: Arrays = {}
        for path, item in pairs:
            arrays.setdefault(str(path), set()).add(str(item))
        return arrays
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ManifestError):
        return None


@dataclass
class Stale:
    """The replaced manifest's arrays the new one does not list: ``superseded`` (every item
    stored anew elsewhere: removed) and ``kept`` (an item the new manifest lacks)."""

    superseded: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def stale_arrays(old: Arrays, new: Arrays) -> Stale:
    """Which of ``old``'s arrays ``new`` no longer lists, and whether each was replaced."""
    items = {item for stored in new.values() for item in stored}
    out = Stale()
    for path in sorted(set(old) - set(new)):
        (out.superseded if old[path] <= items else out.kept).append(path)
    return out


def _inside(root: Path, relpath: str) -> Path | None:
    """``root/relpath`` when it is an array folder of the cache (under an array top, inside
    ``root``, not a link), else None: a manifest names nothing else to remove."""
    parts = Path(relpath).parts
    if len(parts) < 3 or parts[0] not in ARRAY_TOPS or ".." in parts or Path(relpath).is_absolute():
        return None
    path = root / relpath
    try:
        if path.is_symlink() or not path.is_dir():
            return None
        path.resolve().relative_to(root.resolve())
    except (OSError, ValueError):
        return None
    return path


def remove_arrays(root: Path, relpaths: Iterable[str]) -> list[str]:
    """Remove each array folder (and its plate or participant folder once empty); the ones
    removed."""
    removed = []
    for rel in relpaths:
        path = _inside(root, rel)
        if path is None:
            continue
        shutil.rmtree(path)
        removed.append(rel)
        with contextlib.suppress(OSError):  # only when empty: another array of it stays
            path.parent.rmdir()
    return removed


def _some(paths: list[str]) -> str:
    more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
    return ", ".join(paths[:SHOWN]) + more


def tidy(
    root: Path,
    old: Arrays | None,
    new_manifest: Path,
    own: bool,
    say: Callable[[str], None],
) -> Stale:
    """After a build wrote ``new_manifest`` over the manifest whose arrays were ``old``: remove
    the superseded arrays when the manifest is the cache's ``own`` (``OUT/manifest.json``:
    another file may be one of several manifests sharing the arrays), and ``say`` one line per
    kind of stale array, naming them and what to do."""
    new = listed_arrays(new_manifest) if old else None
    if not old or new is None:
        return Stale()
    stale = stale_arrays(old, new)
    if stale.superseded and own:
        removed = remove_arrays(root, stale.superseded)
        if removed:
            say(
                f"build-cache: removed {len(removed)} array(s) of the earlier manifest that this "
                f"one replaces (their items are stored anew: a source changed, other settings): "
                f"{_some(removed)}"
            )
    elif stale.superseded:
        say(
            f"build-cache: {len(stale.superseded)} array(s) of the earlier {new_manifest.name} "
            f"are replaced by this build but kept, as --manifest names a file other than "
            f"{root / 'manifest.json'} (another manifest may list them); `octstage verify` "
            f"reports them as extra: delete them if no other manifest lists them: "
            f"{_some(stale.superseded)}"
        )
    if stale.kept:
        say(
            f"build-cache: {len(stale.kept)} array(s) of the earlier manifest hold items this "
            "one does not list (left out, rejected or not selected this time): kept so a "
            "re-run that takes them back reuses them; `octstage verify` reports them as extra "
            f"until then (delete them, or `octstage stage {root} NEW_FOLDER` copies only what "
            f"the manifest lists): {_some(stale.kept)}"
        )
    return stale
