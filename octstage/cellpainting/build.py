"""``octstage build-cache --kind cellpainting``: JUMP load-data tables -> verified uint8 fields.

For each plate of the load-data tables: every field's five channel TIFFs (and the plate's
illumination functions) are read once through the storage layer (``octstage.storage``: a folder,
``gs://``, ``s3://``...) and SHA1-hashed as read (S3 lists no SHA1: this is the "hashed once at
the source" of mirror's ``--hash-missing``; the manifest records each file's SHA1 and size);
decoded and checked (``normalize.decode_tiff``); divided by the illumination function; sampled
for the plate's robust percentiles per channel; kept in a scratch folder (beside a folder cache,
in the local temp folder for a bucket cache). Then each field is normalized with its plate's
percentiles and written as one OME-Zarr field (``fieldstore``) into the cache, a folder or a
bucket prefix (``--out gs://...``, ``s3://...``: ``cache.store.CacheStore``, data objects first,
group metadata last). Fields are read by a local thread pool (``--workers`` threads: the work is
network reads and C decoders that release the GIL; the dask runner of the OCT build is not
needed at this size), plate after plate.

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

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from octstage import manifest as mf
from octstage.cachebuild.lock import open_cache
from octstage.cellpainting import layout
from octstage.cellpainting.plate import BuildReport, CellPaintingConfig, build_plate
from octstage.errors import CellPaintingError
from octstage.outputs import check_cache_folder
from octstage.provenance import code_version
from octstage.storage import Storage, open_storage

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


def _table(url: str) -> tuple[str, bytes]:
    """A table given as a local path or URL: (name, bytes)."""
    parent, _, name = url.rstrip("/").rpartition("/")
    return url, open_storage(parent or ".").read_bytes(name)


def find_tables(storage: Storage) -> list[str]:
    """The load-data tables under ``workspace/load_data_csv/`` (one per plate folder, preferring
    ``load_data_with_illum.parquet``, then ``.csv``, then ``load_data.csv``)."""
    best: dict[str, str] = {}
    for info in storage.list(layout.LOAD_DATA_ROOT):
        folder, _, base = info.name.rpartition("/")
        if base in layout.LOAD_DATA_NAMES:
            rank = layout.LOAD_DATA_NAMES.index(base)
            if folder not in best or rank < layout.LOAD_DATA_NAMES.index(
                best[folder].rpartition("/")[2]
            ):
                best[folder] = info.name
    return [best[k] for k in sorted(best)]


def build(
    source: str | Storage,
    out: str | os.PathLike[str],
    load_data: Sequence[str] = (),
    metadata: str | None = None,
    config: CellPaintingConfig | None = None,
    workers: int = 8,
    retries: int = 2,
    manifest_path: Path | None = None,
) -> tuple[BuildReport, mf.Manifest]:
    """Build the cache at ``out`` (a folder or a bucket URL) from the source root ``source``
    (a URL or a Storage)."""
    started = time.monotonic()
    config = config or CellPaintingConfig()
    storage = open_storage(source) if isinstance(source, str) else source
    names = list(load_data) or find_tables(storage)
    if not names:
        raise CellPaintingError(
            f"{storage.url}: no load-data table under {layout.LOAD_DATA_ROOT} (give --load-data)"
        )
    rows: list[layout.FieldRow] = []
    for name in names:
        # A bare name is under the source root; a path or URL is read where it is.
        where, data = (
            _table(name)
            if ("://" in name or Path(name).is_absolute())
            else (name, storage.read_bytes(name))
        )
        rows += layout.parse_load_data(layout.read_table(data, where), where, storage.url)
    ids = [r.item_id for r in rows]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CellPaintingError(f"field {dup} is listed twice in the load-data tables")
    perturbations: dict[tuple[str, str], layout.Perturbation] = {}
    if metadata:
        where, data = (
            _table(metadata)
            if ("://" in metadata or Path(metadata).exists())
            else (metadata, storage.read_bytes(metadata))
        )
        perturbations = layout.parse_perturbations(layout.read_table(data, where), where)
    by_plate: dict[str, list[layout.FieldRow]] = {}
    for r in rows:
        by_plate.setdefault(r.plate, []).append(r)
    splits = plate_splits(list(by_plate), config.val_share, config.test_share)
    report = BuildReport(fields=len(rows), plates=len(by_plate))
    cache = open_cache(out)
    # Never over another cache (an OCT one, or another source's): its manifest would be replaced.
    written = [p for p in (manifest_path, cache.local and cache.local / "manifest.json") if p]
    check_cache_folder(cache.local, written, "cellpainting", CellPaintingError)
    built: list[tuple[mf.Field, str]] = []
    for plate in sorted(by_plate):
        built += build_plate(
            storage,
            by_plate[plate],
            cache,
            splits[plate],
            perturbations,
            config,
            workers,
            retries,
            report,
        )
        console.print(f"plate {plate}: {len(by_plate[plate])} fields read ({splits[plate]})")
    classes = tuple(sorted({p for _, p in built if p}))
    fields = tuple(
        mf.Field(**{**f.__dict__, "label": classes.index(p) if p else None}) for f, p in built
    )
    rejected = tuple(mf.Rejected(r["source"], r["reason"]) for r in report.rejected)
    config_dict: dict[str, Any] = {**asdict(config), "load_data": names, "metadata": metadata or ""}
    header = mf.Header(
        dataset=storage.url,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        code_version=code_version(),
        cache_version=mf.CACHE_VERSION,
        config_hash=hashlib.sha256(json.dumps(config_dict, sort_keys=True).encode()).hexdigest()[
            :16
        ],
        config=config_dict,
        counts={**mf.field_counts(fields, len(rejected)), "environment": len(report.environment)},
    )
    manifest = mf.Manifest(header, classes, (), rejected, kind="cellpainting", fields=fields)
    if manifest_path is not None:
        mf.write(manifest, manifest_path)
    if cache.local is None or manifest_path is None:  # last: a cache with a manifest is complete
        cache.write_json("manifest.json", mf.to_dict(manifest), indent=1)
    report.seconds = time.monotonic() - started
    return report, manifest


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
) -> int:
    """CLI: build, print a summary; exit 0 / 1 / 3 (see ``exit_code``)."""
    report, manifest = build(
        source, out, load_data, metadata, config, workers, retries, manifest_path
    )
    if json_out:
        mf.atomic_write_text(json_out, json.dumps(asdict(report), indent=1) + "\n")
    console.print(
        f"build-cache (cellpainting): {len(manifest.fields)}/{report.fields} fields of "
        f"{report.plates} plates in the manifest ({report.written} written, {report.kept} kept), "
        f"{len(report.rejected)} rejected, {len(report.environment)} environment failures, "
        f"{report.seconds:.1f} s"
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
    if not manifest.fields:  # --help: "2 ... or nothing kept (0 volumes)"
        console.print("[bold red]build-cache: nothing kept: the manifest lists no field")
        return 2
    return exit_code(report)
