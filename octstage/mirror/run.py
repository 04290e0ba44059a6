"""``octstage mirror SRC DST``: copy with rclone, then verify every new object against the source.

1. Inventory: list the source with its own SDK (b2sdk gives name, size and SHA1, including
   ``large_file_sha1``; a local source is hashed). An empty source is refused outright.
2. Plan: list the destination (with the source SHA1s recorded there by earlier runs) and diff
   (``mirror.inventory.plan_mirror``). A prune from an empty source or beyond ``--max-delete``
   is refused here, before anything is touched. ``--dry-run`` stops here and says what would be
   copied, verified and deleted.
3. Save the inventory at ``<DST>/_octstage/inventory.json``.
4. Copy: ``rclone copy`` through the rc daemon (``mirror.rclone``) with ``--fast-list``, the
   given transfers/checkers, and a progress bar fed from rclone's stats. Skipped when the plan has
   nothing to copy, so a run over an unchanged source transfers 0 bytes and lists each side once.
5. Verify: list the destination again and hash, at the destination, every object not yet
   verified (``octstage.mirror.verify``): record matches, re-copy and re-check mismatches.
6. Prune (only with ``--prune``): delete what the source no longer has, never ``_octstage/``.
7. Report: summary table, optional JSON. Exit 0 when every object is verified, 1 when some
   object is unverified (no source SHA1) or failed, 2 when the run was refused.

Objects the source lists without a SHA1 (a B2 large file uploaded without ``large_file_sha1``,
every S3 object) cannot be verified against the source. ``--hash-missing`` reads each such
object once at the source and hashes it (one extra read of those objects); the inventory records
the SHA1 as ``hashed`` with the object's listed version, and verification goes on as usual
(a read of another size than listed, the object rewritten since the listing, records nothing).
Later runs reuse a recorded hash, flag or not, while the listing shows the same size and
version; a rewritten object is hashed again (or reported unverified without the flag). A hash
that no copy matches, even re-copied, is dropped from the inventory (the hashing read, checked
against nothing, may be the bad one), so the next run hashes that object again.

A killed run resumes by running it again: each run starts from the two listings, GCS makes an
object visible only when complete, and verification is recorded object by object.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from octstage.errors import MirrorError, StorageError
from octstage.manifest import atomic_write_text
from octstage.mirror.inventory import (
    INVENTORY_NAME,
    RESERVED,
    Entry,
    Inventory,
    MirrorPlan,
    check_deletions,
    inventory_from_listing,
    plan_mirror,
    remembered_hashes,
    to_json,
)
from octstage.mirror.rclone import CopyStats, RcloneDaemon, copy_config
from octstage.mirror.report import MirrorReport, print_summary
from octstage.mirror.source_hashes import (
    forget_unmatched_hashes,
    hash_at_source,
    previous_inventory,
)
from octstage.mirror.verify import (
    FAILED,
    Destination,
    GcsDestination,
    LocalDestination,
    Outcome,
    verify_all,
)
from octstage.progress import DEFAULT_SECONDS, LineProgress, interval, megabytes
from octstage.storage import LocalStorage, ObjectInfo, Storage, open_location
from octstage.storage.locations import Location, known_secrets, parse_location, rclone_env, scrub

log = logging.getLogger(__name__)
RECOPY_LIMIT = 200  # objects copied one by one after the bulk copy, per run


def run_mirror(
    src: str,
    dst: str,
    *,
    dry_run: bool = False,
    prune: bool = False,
    max_delete: int = 100,
    transfers: int = 32,
    checkers: int = 64,
    json_out: Path | None = None,
    fast_list: bool = True,
    progress_seconds: float | None = None,
    hash_missing: bool = False,
) -> int:
    """Mirror ``src`` to ``dst`` (see the module docstring); returns the exit code.

    Progress is a bar on a terminal, else a plain line every ``progress_seconds``
    (``octstage.progress``).
    """
    every = interval(progress_seconds)
    src_loc, dst_loc = parse_location(src), parse_location(dst)
    _check_locations(src_loc, dst_loc)
    secrets = known_secrets([src_loc, dst_loc])
    report = MirrorReport(src_loc.url, dst_loc.url, dry_run, prune)
    started = time.monotonic()
    console = Console(stderr=True)
    try:
        _run(
            src_loc,
            dst_loc,
            report,
            console,
            secrets,
            max_delete,
            transfers,
            checkers,
            fast_list,
            every,
            hash_missing,
        )
    except StorageError as exc:
        raise MirrorError(scrub(str(exc), secrets)) from None
    report.seconds = round(time.monotonic() - started, 3)
    report.exit_code = 1 if (report.failed or report.unverified) else 0
    print_summary(report, console)
    if json_out is not None:
        atomic_write_text(json_out, scrub(report.to_json(), secrets) + "\n")
    return report.exit_code


def _check_locations(src: Location, dst: Location) -> None:
    if dst.kind not in ("gcs", "local"):
        raise MirrorError(f"{dst.spec}: the destination must be a GCS bucket or a local folder")
    if src.kind == dst.kind and src.bucket == dst.bucket:
        a, b = src.prefix.rstrip("/"), dst.prefix.rstrip("/")
        if _inside(a, b) or _inside(b, a):
            raise MirrorError(f"{src.spec} and {dst.spec} overlap; mirror into another place")


def _inside(path: str, root: str) -> bool:
    return root in ("", "/") or path == root or path.startswith(root + "/")


def _run(
    src_loc: Location,
    dst_loc: Location,
    report: MirrorReport,
    console: Console,
    secrets: list[str],
    max_delete: int,
    transfers: int,
    checkers: int,
    fast_list: bool,
    every: float = DEFAULT_SECONDS,
    hash_missing: bool = False,
) -> None:
    t0 = time.monotonic()
    src_storage = open_location(src_loc)
    secrets.extend(_live_secrets(src_storage))
    listing = _source_listing(src_storage, src_loc)
    report.list_seconds = round(time.monotonic() - t0, 3)
    dst_storage = open_location(dst_loc)
    hashed = remembered_hashes(previous_inventory(dst_storage), listing)
    report.hash_reused = len(hashed)
    missing = [
        o
        for o in listing
        if not o.sha1 and o.name not in hashed and not o.name.startswith(RESERVED)
    ]
    if hash_missing and report.dry_run:
        report.would_hash = [o.name for o in missing]
    elif hash_missing and missing:
        found, report.hashed_at_source_bytes = hash_at_source(
            src_storage, missing, console, transfers, every
        )
        report.hashed_at_source = len(found)
        hashed.update(found)
    inv = inventory_from_listing(
        listing, src_loc.url, datetime.now(UTC).isoformat(timespec="seconds"), hashed
    )
    report.source_objects, report.source_bytes = len(inv.objects), inv.total_bytes
    report.source_without_sha1 = len(inv.without_sha1)
    if not inv.objects:
        raise MirrorError(
            f"{src_loc.url}: the source lists no objects (mistyped bucket or prefix?); "
            "nothing copied, nothing deleted"
        )

    t0 = time.monotonic()
    plan = plan_mirror(inv, dst_storage.list(), prune=report.prune)
    report.plan_seconds = round(time.monotonic() - t0, 3)
    report.plan = plan.counts()
    check_deletions(plan, len(inv.objects), max_delete)
    if report.dry_run:
        report.would_copy = [e.name for e in plan.copy]
        report.would_verify = [e.name for e in (*plan.copy, *plan.verify) if e.sha1]
        report.would_delete = list(plan.delete)
        report.unverified = [e.name for e in (*plan.copy, *plan.unverifiable) if not e.sha1]
        return

    dst_storage.write_bytes(INVENTORY_NAME, to_json(inv).encode())
    if not (plan.copy or plan.verify):
        log.info("%s: every object already verified; nothing to copy", dst_loc.url)
        report.unverified = [e.name for e in plan.unverifiable]
    else:
        env = rclone_env([src_loc, dst_loc])
        with RcloneDaemon(env, secrets) as daemon:
            config = copy_config(transfers, checkers, fast_list=fast_list)
            if plan.copy:
                _copy(daemon, src_loc, dst_loc, config, plan, report, console, every)
            _verify(daemon, src_loc, dst_loc, dst_storage, inv, report, console, transfers, every)
        corrupt = [f["name"] for f in report.failed if f["status"] == "corrupt"]
        report.hashes_dropped = forget_unmatched_hashes(dst_storage, inv, corrupt)
    if plan.delete:
        _prune(dst_storage, plan, report)


def _live_secrets(storage: Storage) -> list[str]:
    get = getattr(storage, "secrets", None)
    return list(get()) if callable(get) else []


def _source_listing(storage: Storage, loc: Location) -> list[ObjectInfo]:
    """The source objects; a local source is hashed here (B2 and GCS list their SHA1)."""
    listing = list(storage.list())
    if loc.kind != "local":
        return listing
    root = Path(loc.prefix)
    hashed = []
    for obj in listing:
        with open(root / obj.name, "rb") as fh:
            sha1 = hashlib.file_digest(fh, "sha1").hexdigest()
        hashed.append(ObjectInfo(obj.name, obj.size, sha1))
    return hashed


def _copy(
    daemon: RcloneDaemon,
    src: Location,
    dst: Location,
    config: dict[str, Any],
    plan: MirrorPlan,
    report: MirrorReport,
    console: Console,
    every: float = DEFAULT_SECONDS,
) -> None:
    t0 = time.monotonic()
    log.info("copying %d objects (%d bytes) with rclone", len(plan.copy), plan.copy_bytes)
    # Not a terminal: the bar below prints nothing, so plain lines (numbers only, no names).
    lines = None if console.is_terminal else LineProgress(console, "mirror copy", every, megabytes)
    with Progress(
        TextColumn("copy"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[files]}"),
        TimeElapsedColumn(),
        console=console,
        refresh_per_second=2,  # the copy competes for the same cores
    ) as progress:
        task = progress.add_task("copy", total=plan.copy_bytes or None, files="")

        def show(stats: CopyStats) -> None:
            files = f"{stats.files}/{stats.total_files} files"
            total = stats.total_bytes or plan.copy_bytes or None
            progress.update(task, completed=stats.bytes, total=total, files=files)
            if lines is not None:
                lines.update(stats.bytes, total, files)

        # Like LocalStorage's listing (so the inventory), skip hidden files of a local source.
        hidden = [".*", ".*/**"] if src.kind == "local" else []
        result = daemon.copy(src.rclone_fs, dst.rclone_fs, config, show, exclude=hidden)
    if lines is not None:
        done = result.stats
        files = f"{done.files}/{done.total_files} files"
        lines.update(done.bytes, done.total_bytes or plan.copy_bytes or None, files, final=True)
    report.copied_files += result.stats.files
    report.copied_bytes += result.stats.bytes
    report.copy_seconds = round(time.monotonic() - t0, 3)
    if not result.success:
        # Not fatal: verification below finds every object the copy missed or corrupted.
        report.copy_error = result.error or result.stats.last_error
        log.warning("rclone copy reported errors: %s", report.copy_error)


def _verify(
    daemon: RcloneDaemon,
    src: Location,
    dst: Location,
    dst_storage: Storage,
    inv: Inventory,
    report: MirrorReport,
    console: Console,
    transfers: int,
    every: float = DEFAULT_SECONDS,
) -> None:
    t0 = time.monotonic()
    post = plan_mirror(inv, dst_storage.list(), prune=False)
    todo: list[Entry] = sorted((*post.copy, *post.verify, *post.unverifiable), key=_name)
    recopy_config = copy_config(1, 1, ignore_times=True)
    lock = threading.Lock()
    budget = [RECOPY_LIMIT]

    def recopy(name: str) -> str | None:
        with lock:
            if budget[0] <= 0:
                # The copy itself failed wholesale: one object at a time would take forever.
                return f"not re-copied (over {RECOPY_LIMIT} this run); run the mirror again"
            budget[0] -= 1
        try:
            dst_storage.delete(name)  # a failed re-copy then leaves no corrupt object behind
        except StorageError as exc:
            return str(exc)
        result = daemon.copyfile(src.rclone_fs, name, dst.rclone_fs, recopy_config)
        with lock:
            report.copied_files += result.stats.files
            report.copied_bytes += result.stats.bytes
        return None if result.success else (result.error or "copy failed")

    destination = _destination(dst_storage)
    with Progress(
        TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console,
        refresh_per_second=2,  # the copy competes for the same cores
    ) as progress:  # fmt: skip
        task = progress.add_task("verify", total=len(todo))
        lines = None if console.is_terminal else LineProgress(console, "mirror verify", every)
        checked = [0]

        def done(outcome: Outcome) -> None:
            progress.advance(task)
            if lines is not None:
                with lock:  # called from the verifying threads
                    checked[0] += 1
                    lines.update(checked[0], len(todo), final=checked[0] == len(todo))

        absent = {e.name for e in post.copy}
        outcomes = verify_all(todo, destination, recopy, min(transfers, 8), done, absent)
    report.verified = sum(1 for o in outcomes if o.status in ("verified", "recopied"))
    report.recopied = [o.name for o in outcomes if o.status == "recopied"]
    report.unverified = [o.name for o in outcomes if o.status == "unverified"]
    report.failed = [
        {"name": o.name, "status": o.status, "detail": o.detail}
        for o in outcomes
        if o.status in FAILED
    ]
    report.hashed_bytes = sum(o.bytes_hashed for o in outcomes)
    report.verify_seconds = round(time.monotonic() - t0, 3)


def _name(entry: Entry) -> str:
    return entry.name


def _destination(storage: Storage) -> Destination:
    if isinstance(storage, LocalStorage):
        return LocalDestination(storage)
    from octstage.storage.gcs import GcsStorage

    if isinstance(storage, GcsStorage):
        return GcsDestination(storage)
    raise MirrorError(f"{storage.url}: cannot verify objects in this kind of destination")


def _prune(dst_storage: Storage, plan: MirrorPlan, report: MirrorReport) -> None:
    for name in plan.delete:
        dst_storage.delete(name)
        report.deleted.append(name)
    log.info("pruned %d objects absent from the source", len(report.deleted))
