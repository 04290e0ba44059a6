"""The source inventory a mirror saves, and the mirror plan derived from it (pure: no I/O).

The inventory is the source's own account of every object (name, size, SHA1), listed once with
the source SDK and saved beside the mirror, so later steps (build-cache's SHA1 check, re-runs)
need not ask the source again. Format, read by ``octstage build-cache`` (keep it stable)::

    <DST>/_octstage/inventory.json =
    {"format": "octstage-inventory/1", "source": "<SRC url without secrets>",
     "created": "<ISO 8601 UTC>",
     "objects": [{"name": "<relpath>", "size": 123, "sha1": "<hex>" | null,
                  "sha1_from": "listed" | "hashed", "version": "<store's version id>" | null}]}

``sha1_from`` says where a SHA1 came from: the source's own listing, or ``--hash-missing``, which
read the object at the source once and hashed it. A hashed SHA1 holds for the object ``version``
it was taken of, so a later run reuses it (reading nothing) only while the listing shows the
same size and version. Both keys are optional on reading (older inventories lack them).

The plan compares the inventory with the destination listing, whose ``sha1`` is the source SHA1
recorded at the destination after an earlier verification (None when never verified).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from octstage.errors import MirrorError
from octstage.storage.base import ObjectInfo

FORMAT = "octstage-inventory/1"
LISTED, HASHED = "listed", "hashed"
RESERVED = "_octstage/"
INVENTORY_NAME = f"{RESERVED}inventory.json"


@dataclass(frozen=True)
class Entry:
    """One source object."""

    name: str
    size: int
    sha1: str | None
    sha1_from: str = LISTED  # LISTED or HASHED
    version: str | None = None


@dataclass(frozen=True)
class Inventory:
    """Every object of a source, sorted by name (``_octstage/`` excluded)."""

    source: str
    created: str
    objects: tuple[Entry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.objects)

    @property
    def without_sha1(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.objects if e.sha1 is None)


def inventory_from_listing(
    listing: Iterable[ObjectInfo],
    source: str,
    created: str,
    hashed: Mapping[str, str] | None = None,
) -> Inventory:
    """The inventory of a source listing (its ``sha1`` is the source's own SHA1); ``hashed``
    gives the SHA1 of objects the listing has none for, hashed at the source."""
    hashed = hashed or {}

    def entry(o: ObjectInfo) -> Entry:
        if o.sha1:
            return Entry(o.name, int(o.size), o.sha1.lower(), LISTED, o.version)
        sha1 = hashed.get(o.name)
        return Entry(o.name, int(o.size), sha1, HASHED if sha1 else LISTED, o.version)

    objects = sorted(
        (entry(o) for o in listing if not o.name.startswith(RESERVED)), key=lambda e: e.name
    )
    return Inventory(source, created, tuple(objects))


def remembered_hashes(previous: Inventory | None, listing: Iterable[ObjectInfo]) -> dict[str, str]:
    """SHA1s hashed by an earlier run that still hold: same name, size and listed version."""
    if previous is None:
        return {}
    earlier = {e.name: e for e in previous.objects if e.sha1_from == HASHED}
    found = {}
    for o in listing:
        e = earlier.get(o.name)
        if e is not None and e.sha1 and o.version and (e.size, e.version) == (o.size, o.version):
            found[o.name] = e.sha1
    return found


def forget_hashes(inv: Inventory, names: Iterable[str]) -> tuple[Inventory, list[str]]:
    """The inventory without the hashed SHA1s of ``names`` (listed ones are kept), and the
    names whose hash it dropped."""
    drop = set(names)
    dropped = [e.name for e in inv.objects if e.sha1_from == HASHED and e.name in drop]
    if not dropped:
        return inv, []
    objects = tuple(
        replace(e, sha1=None, sha1_from=LISTED) if e.name in dropped else e for e in inv.objects
    )
    return replace(inv, objects=objects), dropped


def to_json(inv: Inventory) -> str:
    doc = {
        "format": FORMAT,
        "source": inv.source,
        "created": inv.created,
        "objects": [asdict(e) for e in inv.objects],
    }
    return json.dumps(doc, ensure_ascii=False, indent=0) + "\n"


def from_json(text: str | bytes, where: str) -> Inventory:
    """Parse an inventory; MirrorError naming ``where`` if it is not one."""
    try:
        doc: Any = json.loads(text)
        if doc.get("format") != FORMAT:
            raise MirrorError(f"{where}: format {doc.get('format')!r}, expected {FORMAT!r}")
        objects = tuple(
            Entry(
                str(o["name"]),
                int(o["size"]),
                str(o["sha1"]).lower() if o["sha1"] else None,
                str(o.get("sha1_from") or LISTED),
                str(o["version"]) if o.get("version") else None,
            )
            for o in doc["objects"]
        )
        return Inventory(str(doc["source"]), str(doc["created"]), objects)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MirrorError(f"{where}: not an octstage inventory: {exc!r}") from exc


@dataclass(frozen=True)
class MirrorPlan:
    """What a mirror run has to do, object by object."""

    copy: tuple[Entry, ...]  # missing at the destination, other size, or source changed
    verify: tuple[Entry, ...]  # present, same size, never verified against the source SHA1
    unverifiable: tuple[Entry, ...]  # present, same size, but the source has no SHA1
    in_sync: tuple[Entry, ...]  # verified earlier against this very source SHA1
    extra: tuple[str, ...]  # only at the destination
    delete: tuple[str, ...]  # the extras that --prune removes

    @property
    def copy_bytes(self) -> int:
        return sum(e.size for e in self.copy)

    def counts(self) -> dict[str, int]:
        return {
            "copy": len(self.copy),
            "copy_bytes": self.copy_bytes,
            "verify": len(self.verify),
            "unverifiable": len(self.unverifiable),
            "in_sync": len(self.in_sync),
            "extra": len(self.extra),
            "delete": len(self.delete),
        }


def plan_mirror(inv: Inventory, destination: Iterable[ObjectInfo], prune: bool) -> MirrorPlan:
    """Compare the inventory with the destination listing. ``_octstage/`` is never touched."""
    held = {o.name: o for o in destination if not o.name.startswith(RESERVED)}
    copy: list[Entry] = []
    verify: list[Entry] = []
    unverifiable: list[Entry] = []
    in_sync: list[Entry] = []
    for entry in inv.objects:
        there = held.get(entry.name)
        if there is None or there.size != entry.size:
            copy.append(entry)
        elif entry.sha1 is None:
            unverifiable.append(entry)
        elif there.sha1 == entry.sha1:
            in_sync.append(entry)
        elif there.sha1 is not None:
            copy.append(entry)  # verified against an older version of the source object
        else:
            verify.append(entry)
    names = {e.name for e in inv.objects}
    extra = tuple(sorted(set(held) - names))
    return MirrorPlan(
        tuple(copy), tuple(verify), tuple(unverifiable), tuple(in_sync), extra,
        extra if prune else (),
    )  # fmt: skip


def check_deletions(plan: MirrorPlan, source_objects: int, max_delete: int) -> None:
    """Refuse a prune that deletes anything for an empty source or more than ``max_delete``.

    A typo in a source prefix lists nothing (or another folder), and a sync from it would empty
    the mirror; so both refusals happen before anything is copied or deleted.
    """
    if plan.delete and source_objects == 0:
        raise MirrorError(
            f"--prune refused: the source lists no objects, so every one of the "
            f"{len(plan.delete)} destination objects would be deleted (mistyped source?)"
        )
    if len(plan.delete) > max_delete:
        raise MirrorError(
            f"--prune refused: it would delete {len(plan.delete)} destination objects, more than "
            f"--max-delete {max_delete} (mistyped source? raise --max-delete if intended)"
        )
