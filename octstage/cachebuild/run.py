"""``octstage build-cache``: every verified OCT volume decoded once into a uint8 Zarr cache.

The driver lists the source (local folder or bucket, through ``octstage.storage``), decides
what it can without reading (``plan.precheck``), reuses what the cache already holds, and
hands the rest to dask workers by name (``task.run_task`` via ``cluster.execute``), a
bounded window at a time so neither the workers nor the driver hold more than a few volumes.
It then writes the QC sheet, the resolved build config and, last and atomically, the manifest.

The cache is a folder or a bucket (``--out gs://...``, ``s3://...``), reached through
``cache.store.CacheStore`` by the driver and by every worker alike: with ``--scheduler`` the
workers may run on machines that share no disk with the driver. The credentials the driver uses
for the source and the cache reach the workers through a dask plugin (``build.cluster``), never
through a task's arguments or a log line. A folder cache is locked against a second build and
cleaned of a killed run's temporaries; a bucket needs neither (nothing there is renamed, and
every object under a key has the same bytes whoever writes it).

Re-runs: a source's SHA1 is remembered in ``CACHE/source-index.json`` under a fingerprint of
the object (local: size + mtime; bucket: size + the listed hashes). When the fingerprint is
unchanged the SHA1 gives the cache key directly, so an unchanged source is neither re-read nor
decoded; anything else is streamed and hashed again (hashing is cheap, decoding is not). A
bucket listing that carries a verified SHA1 (B2's content SHA1, the ``source-sha1`` that
``octstage mirror`` records on GCS) needs no index at all: a lost index is rebuilt from it.

The release's ``retinal_oct/manifest.tsv``, when the source has one, is read too: each volume's
row must agree with it (``dataset.witness``; a disagreement rejects the file) and gives its
anatomic region and scan size. ``--from-tsv`` takes the file list from that table instead of
listing the tree (a listed file that is not there is rejected, named with its line).
``--concept ID`` copies that OMOP concept's value per participant from ``clinical_data/`` into
every volume (missing codes dropped and counted in the manifest's ``concepts``).

Failures of the machine (I/O errors, a missing decoder, a dead worker) are reported under the
category ``environment`` and retried on the next run; only deterministic verdicts are stored.

Exit codes (``exit_code``; documented in ``octstage build-cache --help``): 0 clean, 1 expected
exclusions only, 2 refused or more left out than ``--max-reject-share``, 3 volumes missing for
environmental reasons (a re-run retries them). The manifest is written unless the run was
refused.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from octstage import manifest as mf
from octstage.cache.stale import listed_arrays, tidy
from octstage.cache.store import CacheStore
from octstage.cachebuild.cluster import execute
from octstage.cachebuild.lock import exclusive, open_cache
from octstage.cachebuild.plan import (
    DEFAULT_INVENTORY,
    OCT_PREFIXES,
    Candidate,
    InventoryEntry,
    Record,
    Tally,
    cache_key,
    capped_workers,
    parse_inventory,
    precheck,
    sha1_mismatch,
    software_versions,
    summary,
    usable_cores,
    volume_entry,
)
from octstage.cachebuild.qc import qc_sheet
from octstage.cachebuild.sourceindex import SourceIndex, fingerprint
from octstage.cachebuild.task import Task, environment, load_record, load_reject
from octstage.config import BuildConfig
from octstage.dataset.clinical import read_concepts
from octstage.dataset.labels import STUDY_GROUPS, Participant, read_label_table
from octstage.dataset.release import TSV_NAME, TsvRow, read_manifest_tsv
from octstage.errors import MachineError, ObjectNotFoundError, OctstageError, StorageError
from octstage.outputs import MANIFEST, check_cache_folder
from octstage.progress import interval
from octstage.provenance import code_version
from octstage.storage import ObjectInfo, Storage, open_storage, split_url
from octstage.storage.locations import credential_env, parse_location

console = Console(stderr=True)

INDEX_SAVE_SECONDS = 20.0
# The manifest header (config) and the summary say how source bytes were checked.
SOURCE_VERIFICATION = "source_verification"
SHA1_INVENTORY = "sha1-inventory"
_SKIP = " (pass --no-verify-sources to build without checking sources)"


def run_build(
    source: str,
    labels: str | os.PathLike[str],
    out: str | os.PathLike[str],
    manifest: Path | None,
    config: BuildConfig,
    workers: int = 2,
    scheduler: str | None = None,
    inventory: str | None = None,
    json_out: Path | None = None,
    max_reject_share: float | None = None,
    verify_sources: bool = True,
    progress_seconds: float | None = None,
    from_tsv: bool = False,
    concepts: Sequence[int] = (),
    manifest_form: str = "json",
) -> int:
    """Build (or bring up to date) the cache at ``out`` (a folder or a bucket URL) and write
    its manifest last: to ``manifest`` (default ``OUT/manifest.json``; for a bucket cache also
    to ``OUT/manifest.json``, where ``octstage stage`` looks). See the module doc.

    Returns the exit code of ``exit_code``.
    """
    if workers < 1 and scheduler is None:
        raise OctstageError(f"--workers must be at least 1, got {workers}")
    if max_reject_share is not None and not 0.0 <= max_reject_share <= 1.0:
        raise OctstageError(f"--max-reject-share must be in [0, 1], got {max_reject_share}")
    every = interval(progress_seconds)  # checked before any work starts
    if inventory is not None and not verify_sources:
        raise OctstageError("--inventory and --no-verify-sources contradict each other")
    for location in (source, str(out)):  # a key in a URL is refused before --out is made
        parse_location(location)
    started = time.monotonic()
    try:
        return _run(
            source,
            labels,
            out,
            manifest,
            config,
            workers,
            scheduler,
            inventory,
            json_out,
            max_reject_share,
            verify_sources,
            every,
            started,
            from_tsv,
            concepts,
            manifest_form,
        )
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = exc.filename or out
        raise MachineError(
            f"{where}: {exc.strerror}: free space and run the same command again (finished "
            "volumes are kept)"
        ) from None


def _run(
    source: str,
    labels: str | os.PathLike[str],
    out: str | os.PathLike[str],
    manifest: Path | None,
    config: BuildConfig,
    workers: int,
    scheduler: str | None,
    inventory: str | None,
    json_out: Path | None,
    max_reject_share: float | None,
    verify_sources: bool,
    every: float,
    started: float,
    from_tsv: bool,
    concepts: Sequence[int],
    manifest_form: str,
) -> int:
    cache = open_cache(out)
    with exclusive(cache):
        table = read_label_table(str(labels))
        participants, label_problems = table.participants, table.problems
        storage = open_storage(source)
        # Never over another cache: its manifest would be replaced by this one's.
        written = [p for p in (manifest, cache.local and cache.local / MANIFEST) if p]
        check_cache_folder(cache.local, written, "oct", OctstageError, source)
        # What the manifest this build replaces listed: its arrays this one replaces go after it.
        replaced = manifest or (cache.local and cache.local / MANIFEST) or None
        earlier = listed_arrays(replaced) if replaced is not None and cache.local else None
        tsv = read_manifest_tsv(storage)  # the release's index: regions, and a fourth witness
        clinical, concept_rows = read_concepts(storage, concepts) if concepts else ({}, ())
        if from_tsv and tsv is None:
            raise OctstageError(f"--from-tsv: {storage.url}/{TSV_NAME} does not exist")
        state = _BuildState()
        if from_tsv and tsv is not None:
            objects = _stat_listed(storage, tsv, state.rejected)
        else:
            objects = _list_oct(storage)
        inventory_entries = _load_inventory(storage, inventory) if verify_sources else None
        verification = "none" if inventory_entries is None else SHA1_INVENTORY
        index = SourceIndex.load(cache)
        fingerprints = {o.name: fingerprint(storage, o) for o in objects}

        tasks: list[Task] = []
        for obj in objects:
            if obj.problem is not None:  # one unreadable file is one exclusion, not the end
                why = f"unreadable: {obj.problem}"
                state.rejected[obj.name] = environment(why) if obj.transient else why
                continue
            verdict = precheck(obj.name, obj.size, participants, inventory_entries, table.excluded)
            if isinstance(verdict, str):
                state.rejected[obj.name] = verdict
                continue
            if verdict.expected_sha1 is None:  # no inventory, or no SHA1 in it
                state.tally.unverified += 1
            known = _reuse(cache, config, verdict, index.sha1(obj, fingerprints[obj.name]))
            if known is None:
                tasks.append(Task(storage.url, obj.name, cache.url, config, verdict.expected_sha1))
            else:
                state.add(obj.name, known, reused=True)

        if scheduler is None and tasks:
            workers, capped = capped_workers(
                workers, len(tasks), usable_cores(), "--workers", "file to decode"
            )
            if capped:
                console.print(f"build-cache: {capped}", highlight=False)
        saved = time.monotonic()
        access = credential_env([parse_location(source), parse_location(cache.url)])
        try:
            for outcome in execute(tasks, workers, scheduler, console, every, access):
                state.tally.read += outcome.read
                state.tally.decoded += outcome.decoded
                if outcome.sha1 is not None:
                    index.remember(outcome.name, fingerprints[outcome.name], outcome.sha1)
                found = outcome.record or outcome.reason or "error: no reason given"
                state.add(outcome.name, found, reused=not outcome.decoded)
                if time.monotonic() - saved > INDEX_SAVE_SECONDS:
                    index.save()  # a killed run keeps most of its hashing work
                    saved = time.monotonic()
        except KeyboardInterrupt:
            index.save()  # finished volumes have their records; keep the hashing work too
            raise
        index.save()

        volumes = _volumes(state.records, participants, state.rejected, tsv or {}, clinical)
        rejects = tuple(mf.Rejected(n, r) for n, r in sorted(state.rejected.items()))
        seconds = time.monotonic() - started
        stats = summary(state.tally, volumes, state.rejected.items(), seconds, len(label_problems))
        stats[SOURCE_VERIFICATION] = verification
        stats["label_problem_rows"] = [{"row": r, "reason": why} for r, why in label_problems]
        _write_outputs(
            source,
            cache,
            (manifest, manifest_form),
            config,
            volumes,
            rejects,
            stats,
            json_out,
            concept_rows,
        )
        if cache.local is not None and replaced is not None:
            own = replaced.resolve() == (cache.local / MANIFEST).resolve()
            tidy(cache.local, earlier, replaced, own, _say)
    _print_summary(stats)
    for ref, why in label_problems[:20]:
        console.print(f"label row {ref}: {why}", markup=False, highlight=False)
    if len(label_problems) > 20:
        console.print(f"[yellow]… {len(label_problems) - 20} more label rows (see --json)")
    return exit_code(stats, len(objects), max_reject_share)


def exit_code(stats: dict[str, Any], listed: int, max_reject_share: float | None) -> int:
    """The exit code of a finished build (see the module doc); prints why when it is 2."""
    left_out = stats["rejected"]
    if listed and not stats.get("volumes", 1):
        console.print(
            f"[bold red]build-cache: nothing kept: all {listed} sources left out "
            f"({left_out} rejected: see the reasons above"
            + (", some environmental: a re-run retries them" if stats["environment"] else "")
            + ")"
        )
        return 2
    if max_reject_share is not None and listed and left_out / listed > max_reject_share:
        console.print(
            f"[bold red]build-cache: {left_out} of {listed} sources left out "
            f"({left_out / listed:.1%}), more than --max-reject-share {max_reject_share:.1%}"
        )
        return 2
    if stats["environment"]:
        return 3
    return 1 if left_out else 0


@dataclass
class _BuildState:
    """What the driver has learned so far: a record or a rejection reason per source."""

    tally: Tally = field(default_factory=Tally)
    records: dict[str, Record] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, found: Record | str, reused: bool) -> None:
        if isinstance(found, str):
            self.rejected[name] = found
        else:
            self.records[name] = found
            if reused:
                self.tally.reused += 1
            else:
                self.tally.built += 1


def _reuse(
    cache: CacheStore, config: BuildConfig, cand: Candidate, sha1: str | None
) -> Record | str | None:
    """A complete record or stored rejection for a source whose SHA1 is already known."""
    if sha1 is None:
        return None
    if cand.expected_sha1 is not None and cand.expected_sha1 != sha1:
        return sha1_mismatch(cand.name, cand.expected_sha1, sha1)
    return load_record(cache, cache_key(sha1, config)) or load_reject(cache, sha1, cand.name)


def _volumes(
    records: dict[str, Record],
    participants: dict[str, Participant],
    rejected: dict[str, str],
    tsv: Mapping[str, TsvRow],
    clinical: Mapping[int, Mapping[str, float]],
) -> tuple[mf.Volume, ...]:
    volumes = []
    for name, record in records.items():
        participant = participants[record.patient_id]
        entry = volume_entry(name, record, participant, tsv.get(name), clinical)
        if isinstance(entry, str):
            rejected[name] = entry
        else:
            volumes.append(entry)
    return tuple(sorted(volumes, key=lambda v: (v.participant_id, v.device, v.source_path)))


def _write_outputs(
    source: str,
    cache: CacheStore,
    written: tuple[Path | None, str],  # the local manifest file (None: none), and its form
    config: BuildConfig,
    volumes: tuple[mf.Volume, ...],
    rejects: tuple[mf.Rejected, ...],
    stats: dict[str, Any],
    json_out: Path | None,
    concepts: tuple[mf.Concept, ...] = (),
) -> None:
    version = code_version()
    manifest, form = written
    cache.write_bytes("qc.png", qc_sheet(cache.open_array, volumes))
    resolved = {
        "code_version": version,
        "config_hash": config.params_hash(),
        "config": config.as_dict(),
        "software": software_versions(),  # part of every cache key (plan.cache_key)
    }
    cache.write_json("build-config.json", resolved, indent=1)
    if json_out is not None:
        mf.atomic_write_text(json_out, json.dumps(stats, indent=1) + "\n")
    header = mf.Header(
        dataset=source,
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        code_version=version,
        cache_version=mf.CACHE_VERSION,
        config_hash=config.params_hash(),
        # How sources were checked travels with the manifest (in ``config``: the published
        # header schema has no other free-form place); config_hash stays the parameters' hash.
        config={**config.as_dict(), SOURCE_VERIFICATION: stats[SOURCE_VERIFICATION]},
        counts=mf.count_summary(volumes, len(rejects)),
    )
    built = mf.Manifest(header, STUDY_GROUPS, volumes, rejects, concepts=concepts)
    cache.write_manifest(built, manifest, form)  # last: a cache with a manifest is complete


def _stat_listed(
    storage: Storage, tsv: Mapping[str, TsvRow], rejected: dict[str, str]
) -> list[ObjectInfo]:
    """The files manifest.tsv lists, as objects (stat in threads: a bucket answers slowly);
    one that is not there is rejected, named with its line."""

    def stat(row: TsvRow) -> ObjectInfo | None:
        try:
            return storage.stat(row.path)
        except ObjectNotFoundError:
            rejected[row.path] = (
                f"{TSV_NAME}: line {row.line} lists it, the source has no such file"
            )
            return None

    with ThreadPoolExecutor(max_workers=16) as pool:
        found = [o for o in pool.map(stat, tsv.values()) if o is not None]
    if not found:
        raise StorageError(f"{storage.url}: none of the files {TSV_NAME} lists is there")
    return found


def _list_oct(storage: Storage) -> list[ObjectInfo]:
    for prefix in OCT_PREFIXES:
        found = list(storage.list(prefix))
        if found:
            return found
    raise StorageError(f"{storage.url}: no files under {' or '.join(OCT_PREFIXES)}")


def _load_inventory(storage: Storage, inventory: str | None) -> dict[str, InventoryEntry] | None:
    """The inventory named by ``--inventory`` (path or URL), else the one beside the source;
    None only when there is none beside the source. One that exists but cannot be read or
    parsed stops the build: treating it as absent would silently skip every SHA1 check."""
    if inventory is None:
        where = f"{storage.url}/{DEFAULT_INVENTORY}"
        try:
            data = storage.read_bytes(DEFAULT_INVENTORY)
        except ObjectNotFoundError:
            console.print(f"[yellow]build-cache: no source inventory at {where}: SHA1s unchecked")
            return None
        except StorageError as exc:
            raise OctstageError(f"{where}: cannot read the source inventory: {exc}{_SKIP}") from exc
    else:
        where = inventory
        parent, name = split_url(inventory)
        try:
            data = open_storage(parent).read_bytes(name)
        except StorageError as exc:
            raise OctstageError(f"{where}: cannot read the source inventory: {exc}{_SKIP}") from exc
    try:
        return parse_inventory(json.loads(data), where)
    except ValueError as exc:  # also bytes that are not UTF-8
        raise OctstageError(f"{where}: source inventory is not JSON: {exc}{_SKIP}") from exc
    except OctstageError as exc:
        raise OctstageError(f"{exc}{_SKIP}") from exc


def _print_summary(stats: dict[str, Any]) -> None:
    table = Table(title="build-cache", show_header=False)
    rate = stats["built_per_second"]
    rows = [
        ("volumes in manifest", stats["volumes"]),
        ("participants", stats["participants"]),
        ("built (decoded)", stats["built"]),
        ("reused (no decode)", stats["reused"]),
        ("sources read + hashed", stats["read"]),
        ("source verification", stats[SOURCE_VERIFICATION]),
        ("no SHA1 to check against", stats["unverified"]),
        ("rejected", stats["rejected"]),
        ("  of them retried next run (environment)", stats["environment"]),
        *((f"  {reason}", n) for reason, n in stats["rejected_by_reason"].items()),
        *((f"  device {device}", n) for device, n in stats["by_device"].items()),
        ("label-table problems", stats["label_problems"]),
        ("seconds", stats["seconds"]),
        ("built volumes/s", "-" if rate is None else rate),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)


def _say(line: str) -> None:
    """One line of the build's, printed as it is (paths hold brackets rich would read)."""
    console.print(line, markup=False, highlight=False)
