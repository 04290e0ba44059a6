"""The Cell Painting build on a dask cluster: one task per plate, the manifest on the driver.

Plates are independent (each has its own percentiles), so a plate is the unit of work: the
driver reads the load-data tables and the metadata, decides each plate's split, and sends a
``PlateTask`` (the plate's rows and its wells' perturbations, the source and cache by URL, the
settings) through the OCT build's runner (``cachebuild.cluster.run_window``: a bounded window of
tasks in flight, the storage settings and credentials through its worker plugin, never in a task).
A worker opens the source and the cache itself, builds the plate exactly as the one-process build
does (``plate.build_plate``, with ``threads`` reading its fields) and sends back its fields as
the spool stores them (``PlateDone``): the driver puts them into its spool in plate order, so the
manifest lists the fields as the one-process build would, and writes it last.

A worker that dies mid-plate: dask runs the plate again on another worker (its fields already
stored are found by their cache keys and kept; a field cut off mid-write is in a hidden folder,
never under its final name); the dead worker's half is never listed, since only a finished task
sends fields back. A plate whose task fails for good (dask's allowed failures spent, a lost
scheduler) is left out of this run's manifest as an environment fault: exit 3, the same command
retries it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from rich.console import Console

from octstage import manifest as mf
from octstage.cache.store import CacheStore
from octstage.cachebuild.cluster import run_window
from octstage.cachebuild.lock import remove_temporaries
from octstage.cellpainting import layout
from octstage.cellpainting.metadata import Perturbation
from octstage.cellpainting.plate import ENVIRONMENT, BuildReport, CellPaintingConfig, build_plate
from octstage.heap import fix_mmap_threshold
from octstage.progress import DEFAULT_SECONDS, counter
from octstage.provenance import installed_version
from octstage.storage import open_storage
from octstage.storage.locations import credential_env, parse_location

console = Console(stderr=True)
# What decides the bytes a worker writes: the same on the driver and every worker, or the run is
# refused (one cache would mix two encoders' output under the same keys).
SOFTWARE = ("octstage", "numpy", "tifffile", "imagecodecs", "zarr", "numcodecs")


@dataclass(frozen=True)
class PlateTask:
    """Everything a worker needs to build one plate (no credential: see the module doc)."""

    index: int  # the plate's place in the build's order (the manifest keeps it)
    plate: str
    split: str
    rows: tuple[layout.FieldRow, ...]
    perturbations: Mapping[tuple[str, str], Perturbation]  # this plate's wells
    source: str
    anonymous: bool
    cache: str
    config: CellPaintingConfig
    threads: int
    retries: int
    pack: int


@dataclass(frozen=True)
class PlateDone:
    """A plate built (or left out): its part of the report, and its fields as spooled."""

    index: int
    plate: str
    report: BuildReport
    contents: bytes
    tally: mf.FieldTally


def software_versions() -> dict[str, str]:
    """The installed version of each of ``SOFTWARE`` (``"absent"``: not installed)."""
    return {name: installed_version(name) for name in SOFTWARE}


def run_plate(task: PlateTask) -> PlateDone:
    """On a worker: build the plate into the cache; its fields, spooled, go back to the driver."""
    fix_mmap_threshold()  # as on the driver: pixel buffers returned to the system when freed
    storage = open_storage(task.source, anonymous=task.anonymous)
    report = BuildReport()
    with mf.FieldSpool() as spool:
        build_plate(
            storage,
            list(task.rows),
            CacheStore(task.cache),
            task.split,
            dict(task.perturbations),
            task.config,
            task.threads,
            task.retries,
            report,
            spool,
            pack=task.pack,
        )
        return PlateDone(task.index, task.plate, report, spool.contents(), spool.tally)


def plate_failed(task: PlateTask, exc: BaseException) -> PlateDone:
    """A plate whose task failed for good: left out of this run, to be retried (exit 3)."""
    reason = f"{ENVIRONMENT}: worker failed: {type(exc).__name__}: {exc}"
    report = BuildReport(
        environment=[{"source": task.plate, "reason": reason}], plates_left_out=[task.plate]
    )
    return PlateDone(task.index, task.plate, report, b"", mf.FieldTally())


def run_plates(
    tasks: Iterable[PlateTask],
    total: int,
    workers: int,
    scheduler: str | None,
    access: Mapping[str, str],
    console: Console,
    progress_seconds: float = DEFAULT_SECONDS,
) -> Iterator[PlateDone]:
    """Every plate on the cluster (``scheduler``, else ``workers`` local processes), yielded as
    it ends, with a progress line per plate at most every ``progress_seconds``."""
    with counter(console, "build-cache", total, progress_seconds) as advance:
        for done in run_window(
            tasks, run_plate, plate_failed, workers, scheduler, software_versions, access
        ):
            state = "left out" if done.report.plates_left_out else f"{done.tally.fields} fields"
            advance(f"plate {done.plate}: {state}")
            yield done


@dataclass(frozen=True)
class ClusterRun:
    """Where and how the plates run on dask: a scheduler's address, else ``processes`` local
    worker processes; ``threads`` read each plate's fields."""

    scheduler: str | None
    processes: int
    threads: int
    retries: int
    pack: int
    config: CellPaintingConfig


def build_on_cluster(
    plates: list[tuple[str, str]],
    rows: Callable[[str], list[layout.FieldRow]],
    perturbations: dict[tuple[str, str], Perturbation],
    source: str,
    anonymous: bool,
    cache: CacheStore,
    spool: mf.FieldSpool,
    report: BuildReport,
    run: ClusterRun,
    progress_seconds: float,
) -> None:
    """Every plate as a task on the cluster (``platetask``); their fields into ``spool`` in
    plate order. A worker killed mid-write leaves a hidden folder in a folder cache: removed
    once every plate has ended (under the build's lock, so never another build's)."""

    def tasks() -> Iterator[PlateTask]:
        # Drawn only as the window sends them: the driver holds the rows of the plates in
        # flight (about two per worker), never a whole source's.
        for index, (plate, split) in enumerate(plates):
            plate_rows = tuple(rows(plate))
            wells = {(plate, r.well) for r in plate_rows}
            yield PlateTask(
                index,
                plate,
                split,
                plate_rows,
                {w: perturbations[w] for w in wells if w in perturbations},
                source,
                anonymous,
                cache.url,
                run.config,
                run.threads,
                run.retries,
                run.pack,
            )

    access = credential_env([parse_location(source), parse_location(cache.url)])
    for done in run_plates(
        tasks(), len(plates), run.processes, run.scheduler, access, console, progress_seconds
    ):
        report.merge(done.report)
        spool.put(done.index, done.contents, done.tally)
    if cache.local is not None:
        remove_temporaries(cache.local)
