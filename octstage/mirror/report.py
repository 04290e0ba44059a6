"""What a mirror run did: ``MirrorReport`` (the ``--json`` document) and its summary table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from rich.console import Console
from rich.table import Table

SHOW = 20  # names listed per category on the console (all of them go to --json)


@dataclass
class MirrorReport:
    """Everything a run did; ``to_json`` is the ``--json`` document (no secrets in it)."""

    source: str
    destination: str
    dry_run: bool
    prune: bool
    source_objects: int = 0
    source_bytes: int = 0
    source_without_sha1: int = 0
    hashed_at_source: int = 0  # objects read and hashed at the source this run
    hashed_at_source_bytes: int = 0
    hash_reused: int = 0  # hashed by an earlier run, same version: not read again
    hashes_dropped: list[str] = field(default_factory=list)  # hashed, but no copy matched
    would_hash: list[str] = field(default_factory=list)
    list_seconds: float = 0.0
    plan_seconds: float = 0.0
    plan: dict[str, int] = field(default_factory=dict)
    would_copy: list[str] = field(default_factory=list)
    would_verify: list[str] = field(default_factory=list)
    would_delete: list[str] = field(default_factory=list)
    copied_files: int = 0
    copied_bytes: int = 0
    copy_seconds: float = 0.0
    copy_error: str = ""
    verified: int = 0
    recopied: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    hashed_bytes: int = 0
    verify_seconds: float = 0.0
    deleted: list[str] = field(default_factory=list)
    seconds: float = 0.0
    exit_code: int = 0

    def to_json(self) -> str:
        return json.dumps({"command": "mirror", **asdict(self)}, indent=1, ensure_ascii=False)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def print_summary(r: MirrorReport, console: Console) -> None:
    table = Table(title=f"octstage mirror {'(dry run) ' if r.dry_run else ''}{r.source} -> "
                  f"{r.destination}")  # fmt: skip
    table.add_column("")
    table.add_column("objects", justify="right")
    table.add_column("detail")
    table.add_row("source", str(r.source_objects), f"{_mb(r.source_bytes)}, listed in "
                  f"{r.list_seconds:.1f} s; {r.source_without_sha1} without SHA1")  # fmt: skip
    if r.dry_run:
        table.add_row("would copy", str(len(r.would_copy)), _mb(r.plan.get("copy_bytes", 0)))
        table.add_row("would verify", str(len(r.would_verify)), "hash at the destination")
        table.add_row("would delete", str(len(r.would_delete)), "--prune" if r.prune else "")
        table.add_row("would hash at the source", str(len(r.would_hash)), "--hash-missing")
        table.add_row("already verified", str(r.plan.get("in_sync", 0)), "")
    else:
        speed = r.hashed_bytes / r.verify_seconds / 1e6 if r.verify_seconds else 0.0
        table.add_row("copied", str(r.copied_files), f"{_mb(r.copied_bytes)} in "
                      f"{r.copy_seconds:.1f} s")  # fmt: skip
        table.add_row("verified now", str(r.verified), f"{_mb(r.hashed_bytes)} hashed, "
                      f"{speed:,.1f} MB/s")  # fmt: skip
        table.add_row("already verified", str(r.plan.get("in_sync", 0)), "recorded earlier")
        table.add_row("re-copied (corrupt)", str(len(r.recopied)), "")
        table.add_row("hashed at the source", str(r.hashed_at_source),
                      f"{_mb(r.hashed_at_source_bytes)} (--hash-missing); "
                      f"{r.hash_reused} hashed earlier, reused")  # fmt: skip
        if r.hashes_dropped:
            table.add_row("source hashes dropped", str(len(r.hashes_dropped)),
                          "no copy matched: --hash-missing hashes them again")  # fmt: skip
        why = "source has no SHA1: pass --hash-missing" if r.unverified else ""
        table.add_row("unverified", str(len(r.unverified)), why)
        table.add_row("failed", str(len(r.failed)), "")
        table.add_row("deleted", str(len(r.deleted)), "--prune" if r.prune else "")
        if r.copy_error:
            table.add_row("rclone errors", "", r.copy_error[:200])
    console.print(table)
    for title, names in (
        ("would copy", r.would_copy),
        ("would delete", r.would_delete),
        ("unverified", r.unverified),
        ("failed", [f"{f['name']}: {f['detail']}" for f in r.failed]),
    ):
        for name in names[:SHOW]:
            console.print(f"  {title}: {name}", markup=False, highlight=False)
        if len(names) > SHOW:
            console.print(f"  {title}: ... and {len(names) - SHOW} more (see --json)")
