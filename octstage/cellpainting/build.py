"""``octstage build-cache --kind cellpainting``: JUMP load-data tables -> verified uint8 fields.

The tables are found under the root (a source root, or the dataset root holding
``source_*/``: ``find_tables``), narrowed by ``Selection`` (sources, batches, plates from the
tables' folders before any is read; perturbation types after joining the metadata), and read as
parquet, ``.csv.gz`` or CSV (``layout``); absolute ``s3://`` paths in them are mapped onto the
root through the prefix map. The metadata is the datasets repository's folder or one table
(``metadata.py``).

For each plate of the load-data tables: every field's five channel TIFFs (and the plate's
illumination functions) are read through the storage layer (``octstage.storage``: a folder,
``gs://``, ``s3://``...) and SHA1-hashed as read (S3 lists no SHA1: this is the "hashed once at
the source" of mirror's ``--hash-missing``; the manifest records each file's SHA1 and size);
decoded and checked (``normalize.decode_tiff``); divided by the illumination function; counted
into the plate's per-channel histograms, then read again (``plate.py``: no scratch, memory
bounded by the read window). Then each field is normalized with its plate's percentiles and
written as one OME-Zarr field (``fieldstore``), or with ``pack`` K > 1 into packs of K fields
(``packstore``: ~2 objects per K fields instead of 3 per field; ``fieldwriter``), into the
cache, a folder or a bucket prefix (``--out gs://...``, ``s3://...``:
``cache.store.CacheStore``, data objects first, group metadata last). A plate's fields are read
by a thread pool (``--workers`` threads: the work is network reads and C decoders that release
the GIL). The plates run one after the other in this process, or, with ``--scheduler`` (a dask
cluster's address) or ``--processes N`` (a local cluster of N worker processes), as tasks on the
OCT build's dask runner, many at once (``platetask``: plates are independent, each its own
percentiles); the manifest is the same either way.

Failures keep their meaning:
- a data fault (a TIFF that does not decode, a channel of another shape, an illumination function
  that does not fit, a listed file absent at the source) rejects the field, with the reason, in
  the manifest's ``rejected``: deterministic, the same on every run (exit 1);
- an environment fault (a TLS error such as ``[SSL: WRONG_VERSION_NUMBER]``, a reset connection,
  any other storage or OS error while reading) is retried ``retries`` times in the run; if it
  persists, the plate is left out of this run's manifest (a plate's percentiles need all its
  fields) and is never called a bad file; exit 3: the same command again retries it. Fields
  already written are kept (the cache key names their content) and not written again.

Splits are by plate (``plate_splits``): the plates in a fixed pseudo-random order (SHA1 of the
plate name), the first ``round(val_share * n)`` (at least 1 when n >= 2) to val, the next
``round(test_share * n)`` (at least 1 when n >= 3) to test, the rest to train: no plate is in two
splits. The manifest is written last: to ``manifest_path`` when given (atomically), and to
``OUT/manifest.json`` when none is given or the cache is a bucket (where ``octstage stage``
looks), as the OCT build does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from octstage import manifest as mf
from octstage.cache.stale import listed_arrays, tidy
from octstage.cachebuild.lock import exclusive, open_cache
from octstage.cachebuild.plan import capped_workers, usable_cores
from octstage.cellpainting import layout
from octstage.cellpainting.metadata import (
    PERTURBATION_TYPES,
    TABLES,
    Perturbation,
    Unlabelled,
    load_release,
    load_single,
)
from octstage.cellpainting.plate import BuildReport, CellPaintingConfig, build_plate
from octstage.cellpainting.platetask import ClusterRun, build_on_cluster
from octstage.errors import CellPaintingError, ConfigError, ObjectNotFoundError
from octstage.heap import fix_mmap_threshold
from octstage.outputs import MANIFEST, check_cache_folder
from octstage.progress import interval
from octstage.provenance import code_version
from octstage.storage import Storage, open_storage, split_url

console = Console(stderr=True)


def plate_splits(plates: Sequence[str], val_share: float, test_share: float) -> dict[str, str]:
    """plate -> split (the rule in the module docstring)."""
    order = sorted(set(plates), key=lambda p: hashlib.sha1(p.encode()).hexdigest())
    n = len(order)
    n_val = max(1 if n >= 2 else 0, round(val_share * n))
    n_test = max(1 if n >= 3 and test_share > 0 else 0, round(test_share * n))
    n_val = min(n_val, max(0, n - 1))
    n_test = min(n_test, max(0, n - 1 - n_val))
    return {
        p: "val" if i < n_val else "test" if i < n_val + n_test else "train"
        for i, p in enumerate(order)
    }


@dataclass(frozen=True)
class Selection:
    """Which plates and wells to build (empty: all)."""

    sources: tuple[str, ...] = ()
    batches: tuple[str, ...] = ()
    plates: tuple[str, ...] = ()
    types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [t for t in self.types if t not in (*PERTURBATION_TYPES, "unknown")]
        if bad:
            raise ConfigError(
                f"perturbation type(s) {', '.join(bad)}: choose from "
                f"{', '.join(PERTURBATION_TYPES)}, unknown"
            )

    def flags(self) -> str:
        """The selection as its command-line flags (``--select-plate BR1 --select-plate BR2``)."""
        given = (
            ("source", self.sources),
            ("batch", self.batches),
            ("plate", self.plates),
            ("type", self.types),
        )
        return " ".join(f"--select-{flag} {v}" for flag, values in given for v in values)

    def table(self, name: str) -> bool:
        """Whether a table at ``[<source>/]workspace/load_data_csv/<batch>/<plate>/...`` is in."""
        head, _, rest = name.partition(layout.LOAD_DATA_ROOT)
        parts = rest.split("/")
        source = head.strip("/").rpartition("/")[2]
        batch, plate = (parts[0], parts[1]) if len(parts) >= 3 else ("", "")
        return (
            (not self.sources or not source or source in self.sources)
            and (not self.batches or batch in self.batches)
            and (not self.plates or plate in self.plates)
        )

    def row(self, r: layout.FieldRow, pert: Perturbation | None) -> bool:
        kind = (pert.perturbation_type if pert else "") or "unknown"
        return (
            (not self.sources or r.source in self.sources)
            and (not self.batches or r.batch in self.batches)
            and (not self.plates or r.plate in self.plates)
            and (not self.types or kind in self.types)
        )


ALL = Selection()


def _table(url: str, anonymous: bool = False) -> tuple[str, bytes]:
    """A table given as a local path or URL: (name, bytes)."""
    parent, name = split_url(url)
    return url, open_storage(parent, anonymous=anonymous).read_bytes(name)


def _best(names: list[str]) -> list[str]:
    """One table per plate folder, the first of ``layout.LOAD_DATA_NAMES`` there."""
    best: dict[str, str] = {}
    for name in names:
        folder, _, base = name.rpartition("/")
        if base in layout.LOAD_DATA_NAMES:
            rank = layout.LOAD_DATA_NAMES.index(base)
            if folder not in best or rank < layout.LOAD_DATA_NAMES.index(
                best[folder].rpartition("/")[2]
            ):
                best[folder] = name
    return [best[k] for k in sorted(best)]


def find_tables(storage: Storage, select: Selection = ALL) -> list[str]:
    """The load-data tables under ``workspace/load_data_csv/`` of the root (a source root) or,
    when it has none, of each ``<source>/`` under it (a dataset root): with sources selected
    only theirs are listed, and with one batch only its folder (the real bucket is 58 M
    objects: list it no wider than asked)."""
    batch = f"{select.batches[0]}/" if len(select.batches) == 1 else ""
    names = [i.name for i in storage.list(layout.LOAD_DATA_ROOT + batch)]
    if not names:
        prefixes = [f"{s}/{layout.LOAD_DATA_ROOT}{batch}" for s in select.sources] or [""]
        names = [
            i.name
            for p in prefixes
            for i in storage.list(p)
            if f"/{layout.LOAD_DATA_ROOT}" in i.name
            and i.name.count("/") == layout.LOAD_DATA_ROOT.count("/") + 3
        ]
    return [n for n in _best(names) if select.table(n)]


def load_metadata(
    metadata: str, storage: Storage, anonymous: bool = False
) -> dict[tuple[str, str], Perturbation]:
    """The wells' perturbations: the datasets repository's metadata folder (a local folder or a
    URL ending in ``/``), or one table (path, URL or name under the root)."""
    local = Path(metadata)
    if local.is_dir() or ("://" in metadata and metadata.endswith("/")):
        folder = open_storage(metadata.rstrip("/"), anonymous=anonymous)

        def read(name: str) -> tuple[str, bytes]:
            where = f"{metadata.rstrip('/')}/{name}"
            try:
                return where, folder.read_bytes(name)
            except ObjectNotFoundError:
                raise CellPaintingError(
                    f"{where}: not found (the datasets repository's metadata/ folder has "
                    f"{', '.join(TABLES.values())})"
                ) from None

        return load_release(read)
    where, data = (
        _table(metadata, anonymous)
        # An absolute path names a local file, never a key under the source root.
        if ("://" in metadata or local.exists() or local.is_absolute())
        else (metadata, storage.read_bytes(metadata))
    )
    return load_single(layout.read_table(data, where), where)


def build(
    source: str | Storage,
    out: str | os.PathLike[str],
    load_data: Sequence[str] = (),
    metadata: str | None = None,
    config: CellPaintingConfig | None = None,
    workers: int = 8,
    retries: int = 2,
    manifest_path: Path | None = None,
    select: Selection = ALL,
    prefixes: layout.PrefixMap = layout.NO_PREFIXES,
    anonymous: bool = False,
    manifest_form: str = "json",
    pack: int = 0,
    allow_unlabelled: bool = False,
    scheduler: str | None = None,
    processes: int = 0,
    progress_seconds: float | None = None,
) -> tuple[BuildReport, Built]:
    """Build the cache at ``out`` (a folder or a bucket URL) from the root ``source`` (a URL
    or a Storage); ``anonymous``: read ``s3://`` without credentials (the public bucket).
    Fields the ``metadata`` does not list (their plate, or their well) are refused unless
    ``allow_unlabelled``: then they are built with an empty perturbation and counted.
    ``workers``: threads reading one plate's fields; with ``scheduler`` (a dask scheduler's
    address) or ``processes`` (that many local dask worker processes) the plates are tasks on
    the cluster (``platetask``), else built one after the other in this process."""
    started = time.monotonic()
    # Pixel buffers each their own mapping, returned when freed: else glibc's moving threshold
    # puts them in its heap, which fragments, and the peak grows with the plate (``heap``).
    fix_mmap_threshold()
    config = config or CellPaintingConfig()
    if select.types and not metadata:
        raise CellPaintingError("selecting perturbation types needs --metadata")
    storage = open_storage(source, anonymous=anonymous) if isinstance(source, str) else source
    names = list(load_data) or find_tables(storage, select)
    if not names:
        found = ""
        if select != ALL:  # what is there, to choose from (the sources asked for may hold none)
            tables = find_tables(storage, Selection(select.sources))
            found = _found(tables or (find_tables(storage, ALL) if select.sources else []))
        raise CellPaintingError(
            f"{storage.url}: no load-data table under [<source>/]{layout.LOAD_DATA_ROOT}"
            f"{f' for {select.flags()}' if select != ALL else ''}{found}; "
            f"{'select from those, or ' if found else ''}give --load-data"
        )
    # The metadata first: a bad table stops the build before any image is read.
    perturbations = load_metadata(metadata, storage, anonymous) if metadata else {}

    def table_rows(name: str, selected: bool = True) -> Iterator[layout.FieldRow]:
        """The selected fields of one table (every field: ``selected`` False), one at a time (a
        bare name is under the source root; a path or URL is read where it is)."""
        where, data = (
            _table(name, anonymous)
            if ("://" in name or Path(name).is_absolute())
            else (name, storage.read_bytes(name))
        )
        rows = layout.iter_load_data(layout.iter_table(data, where), where, storage.url, prefixes)
        if not selected:
            return rows
        return (r for r in rows if select.row(r, perturbations.get((r.plate, r.well))))

    # Pass over the tables: their plates and field counts, checked, nothing kept per field; each
    # plate's rows are read again when it is built (a whole source is a million rows).
    plate_tables: dict[str, list[str]] = {}
    plate_fields: dict[str, int] = {}
    ids = _ItemIds()
    unlabelled = Unlabelled(perturbations)
    for name in names:
        for r in table_rows(name):
            ids.add(r.item_id)
            if metadata:
                unlabelled.add(name, r.plate, r.well)
            if plate_fields.setdefault(r.plate, 0) == 0 or plate_tables[r.plate][-1] != name:
                plate_tables.setdefault(r.plate, []).append(name)
            plate_fields[r.plate] += 1
    ids.check(lambda: (r.item_id for n in names for r in table_rows(n)))
    if not plate_fields:
        there = sorted({r.plate for n in names for r in table_rows(n, selected=False)})
        raise CellPaintingError(
            f"no field of {len(names)} load-data table(s) is selected by {select.flags()}"
            + _plates(there)
        )
    # Before any image is read: tables that disagree would build fields that silently carry
    # no perturbation (an empty class list, and verify would say OK).
    if unlabelled.count and not allow_unlabelled:
        raise CellPaintingError(unlabelled.refusal(str(metadata)))
    if not metadata:
        console.print(
            f"[yellow]build-cache: no --metadata: the {sum(plate_fields.values())} fields will "
            "carry no perturbation or control labels, so `octtrain profile` cannot score this "
            "cache (pretraining needs none); to label them pass --metadata with the datasets "
            "repository's metadata/ folder or one table of Metadata_Plate, Metadata_Well, "
            "Metadata_JCP2022, Metadata_perturbation_type",
            highlight=False,
        )
    splits = plate_splits(list(plate_fields), config.val_share, config.test_share)
    report = BuildReport(
        fields=sum(plate_fields.values()), plates=len(plate_fields), unlabelled=unlabelled.count
    )
    cache = open_cache(out)
    # Never over another cache (an OCT one, or another source's): its manifest would be replaced.
    written = [p for p in (manifest_path, cache.local and cache.local / "manifest.json") if p]
    check_cache_folder(cache.local, written, "cellpainting", CellPaintingError, storage.url)
    if processes and scheduler is None:
        processes, capped = capped_workers(
            processes, len(plate_fields), usable_cores(), "--processes", "plate"
        )
        if capped:
            console.print(f"build-cache: {capped}", highlight=False)

    @functools.lru_cache(maxsize=1)
    def table_plates(name: str) -> dict[str, list[layout.FieldRow]]:
        """One table's rows by plate, the last table's kept: a lab's one table of many plates
        is read once for them all (in sorted order its plates come one after the other), not
        once per plate."""
        grouped: dict[str, list[layout.FieldRow]] = {}
        for r in table_rows(name):
            grouped.setdefault(r.plate, []).append(r)
        return grouped

    def plate_rows(plate: str) -> list[layout.FieldRow]:
        return [r for n in plate_tables[plate] for r in table_plates(n).get(plate, [])]

    with exclusive(cache), mf.FieldSpool() as spool:
        # What the manifest this build replaces listed: its arrays this one replaces go after it.
        replaced = manifest_path or (cache.local and cache.local / MANIFEST) or None
        earlier = listed_arrays(replaced) if replaced is not None and cache.local else None
        if scheduler is not None or processes:
            build_on_cluster(
                [(p, splits[p]) for p in sorted(plate_fields)],
                plate_rows,
                perturbations,
                # By absolute path: a worker on another machine has another working folder.
                storage.url if "://" in storage.url else str(Path(storage.url).resolve()),
                anonymous,
                cache,
                spool,
                report,
                ClusterRun(scheduler, processes, workers, retries, pack, config),
                interval(progress_seconds),
            )
        else:
            for plate in sorted(plate_fields):
                rows = plate_rows(plate)
                build_plate(
                    storage,
                    rows,
                    cache,
                    splits[plate],
                    perturbations,
                    config,
                    workers,
                    retries,
                    report,
                    spool,
                    pack=pack,
                )
                del rows
                console.print(f"plate {plate}: {plate_fields[plate]} fields read ({splits[plate]})")
        rejected = tuple(mf.Rejected(r["source"], r["reason"]) for r in report.rejected)
        config_dict: dict[str, Any] = {
            **asdict(config),
            "load_data": names,
            "metadata": metadata or "",
            "select": {k: list(v) for k, v in asdict(select).items() if v},
            # Only when asked: the config hash of every other build stays as it was.
            **({"allow_unlabelled": True} if allow_unlabelled else {}),
        }
        header = mf.Header(
            dataset=storage.url,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            code_version=code_version(),
            cache_version=mf.CACHE_VERSION,
            config_hash=hashlib.sha256(
                json.dumps(config_dict, sort_keys=True).encode()
            ).hexdigest()[:16],
            config=config_dict,
            counts={
                **spool.tally.counts(len(rejected)),
                "environment": len(report.environment),
                **({"unlabelled": unlabelled.count} if unlabelled.count else {}),
            },
        )
        head = mf.Manifest(header, spool.classes, (), rejected, kind="cellpainting")
        # Last: a cache with a manifest is complete.
        cache.write_manifest(head, manifest_path, manifest_form, spool.rows)
        if cache.local is not None and replaced is not None:
            own = replaced.resolve() == (cache.local / MANIFEST).resolve()
            tidy(cache.local, earlier, replaced, own, _say)
    report.seconds = time.monotonic() - started
    return report, Built(head, spool.tally.fields, manifest_path or (cache.local and written[-1]))


def _plates(plates: Sequence[str], shown: int = 10) -> str:
    """``: the tables list N plate(s): A, B, ...`` (the first ``shown``), for a refusal."""
    if not plates:
        return ""
    more = f" ... ({len(plates) - shown} more)" if len(plates) > shown else ""
    return f"; the tables list {len(plates)} plate(s): {', '.join(plates[:shown])}{more}"


def _found(tables: Sequence[str]) -> str:
    """The plates (and batches) of the load-data tables found, from their folders alone."""
    places = [t.partition(layout.LOAD_DATA_ROOT)[2].split("/") for t in tables]
    plates = sorted({p[1] for p in places if len(p) >= 3})
    batches = sorted({p[0] for p in places if len(p) >= 3})
    if not plates:
        return "; no load-data table is there at all"
    listed = ", ".join(batches[:5]) + (
        f" ... ({len(batches) - 5} more)" if len(batches) > 5 else ""
    )
    return f"{_plates(plates)} (of batch(es) {listed})"


class _ItemIds:
    """Every field id seen, as 8 bytes of its hash (a million ids: 8 MB, not ~100 MB of
    strings); ``check`` names a repeated id as the tables give it."""

    def __init__(self) -> None:
        self._hashes = array("Q")

    def add(self, item_id: str) -> None:
        self._hashes.append(_id_hash(item_id))

    def check(self, again: Callable[[], Iterable[str]]) -> None:
        hashes = np.frombuffer(self._hashes, dtype=np.uint64)
        values, counts = np.unique(hashes, return_counts=True)
        twice = set(values[counts > 1].tolist())
        if not twice:
            return
        seen: set[str] = set()
        for item_id in again():  # a repeated hash: find the id, and tell a collision apart
            if _id_hash(item_id) in twice:
                if item_id in seen:
                    raise CellPaintingError(
                        f"field {item_id} is listed twice in the load-data tables"
                    )
                seen.add(item_id)


def _id_hash(item_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(item_id.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Built:
    """What a build wrote: the manifest without its items (``head``), how many fields it lists,
    and where its local copy is (None: only in the bucket). ``load`` reads the whole of it."""

    head: mf.Manifest
    fields: int
    path: Path | None

    def load(self) -> mf.Manifest:
        if self.path is None:
            raise CellPaintingError("the manifest was written only into the bucket")
        return mf.load(self.path)


def exit_code(report: BuildReport) -> int:
    """3 environment faults (re-run), 1 rejections only, 0 everything in."""
    return 3 if report.environment else 1 if report.rejected else 0


def run_build_cellpainting(
    source: str,
    out: str | os.PathLike[str],
    load_data: Sequence[str],
    metadata: str | None,
    workers: int,
    json_out: Path | None,
    manifest_path: Path | None = None,
    retries: int = 2,
    config: CellPaintingConfig | None = None,
    on_report: Callable[[BuildReport], None] | None = None,
    select: Selection = ALL,
    prefix_map: Sequence[str] = (),
    anonymous: bool = False,
    manifest_form: str = "json",
    pack: int = 0,
    allow_unlabelled: bool = False,
    scheduler: str | None = None,
    processes: int = 0,
    progress_seconds: float | None = None,
) -> int:
    """CLI: build, print a summary; exit 0 / 1 / 3 (see ``exit_code``)."""
    report, built = build(
        source,
        out,
        load_data,
        metadata,
        config,
        workers,
        retries,
        manifest_path,
        select,
        layout.PrefixMap.parse(prefix_map),
        anonymous,
        manifest_form,
        pack,
        allow_unlabelled,
        scheduler,
        processes,
        progress_seconds,
    )
    if json_out:
        mf.atomic_write_text(json_out, json.dumps(asdict(report), indent=1) + "\n")
    console.print(
        f"build-cache (cellpainting): {built.fields}/{report.fields} fields of "
        f"{report.plates} plates in the manifest ({report.written} written, {report.kept} kept), "
        f"{len(report.rejected)} rejected, {len(report.environment)} environment failures, "
        f"{report.seconds:.1f} s"
    )
    if report.unlabelled:
        console.print(
            f"[yellow]{report.unlabelled} field(s) the metadata does not list built with an "
            "empty perturbation (--allow-unlabelled)"
        )
    for r in report.rejected[:20]:
        console.print(f"[yellow]rejected[/yellow] {r['source']}: {r['reason']}")
    for r in report.environment[:20]:
        console.print(f"[red]not built (run again to retry)[/red] {r['source']}: {r['reason']}")
    if report.plates_left_out:
        console.print(
            f"[red]plates left out for environment failures: {', '.join(report.plates_left_out)}; "
            "run the same command again"
        )
    if on_report:
        on_report(report)
    if not built.fields:  # --help: "2 ... or nothing kept (0 volumes)"
        console.print("[bold red]build-cache: nothing kept: the manifest lists no field")
        return 2
    return exit_code(report)


def _say(line: str) -> None:
    """One line of the build's, printed as it is (paths hold brackets rich would read)."""
    console.print(line, markup=False, highlight=False)
