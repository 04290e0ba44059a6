"""Running build-cache's tasks on dask: a bounded window of work in flight.

The OCT build sends one task per file (``execute``), the Cell Painting build one per plate
(``cellpainting.platetask``), both through ``run_window``. Tasks are submitted a window at a time
(about two per worker thread) and collected as they finish, so neither the workers nor the driver
ever hold more than a few tasks' worth of work, and a progress bar follows along. The cluster is
either one the user runs (``--scheduler``) or a LocalCluster of single-threaded worker processes
on loopback that lives as long as the run.

Workers on other machines open the source and the cache themselves, so they need the driver's
access to both: ``WorkerAccess``, a dask worker plugin, sets those variables in each worker's
environment for the run (workers that join later get it too) and restores the old values when it
is removed at the end. It travels over dask's own connection; its repr shows names, never values,
and no task argument carries a credential.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from itertools import islice
from typing import Any, TypeVar

from distributed.diagnostics.plugin import WorkerPlugin
from rich.console import Console

from octstage.cachebuild import task as task_module
from octstage.cachebuild.plan import software_mismatch, software_versions
from octstage.cachebuild.task import Outcome, Task, environment, run_task
from octstage.errors import OctstageError
from octstage.progress import DEFAULT_SECONDS, counter

SCHEDULER_TIMEOUT = "20s"
ACCESS_PLUGIN = "octstage-access"
T = TypeVar("T")
R = TypeVar("R")


class WorkerAccess(WorkerPlugin):
    """Environment variables (credentials among them) a worker needs for this run's storage."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = dict(env)
        self._saved: dict[str, str | None] = {}

    def __repr__(self) -> str:
        return f"WorkerAccess({sorted(self._env)})"  # names only

    def setup(self, worker: Any) -> None:
        self._saved = {key: os.environ.get(key) for key in self._env}
        os.environ.update(self._env)
        # A worker kept from an earlier run may hold clients made with other settings.
        task_module.forget_clients()

    def teardown(self, worker: Any) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        task_module.forget_clients()


def execute(
    tasks: list[Task],
    workers: int,
    scheduler: str | None,
    console: Console,
    progress_seconds: float = DEFAULT_SECONDS,
    access: Mapping[str, str] | None = None,
) -> Iterator[Outcome]:
    """Run build-cache's per-file tasks on dask (``run_window``); yield outcomes as they end.

    A task whose worker failed (died, lost) costs that file, as an environmental rejection.
    Progress is a bar on a terminal, else a plain line every ``progress_seconds``.
    """
    if not tasks:
        return

    def failed(task: Task, exc: BaseException) -> Outcome:
        return Outcome(task.name, None, reason=environment(f"worker failed: {exc!r}"))

    with _progress(len(tasks), console, progress_seconds) as advance:
        run = run_window(tasks, run_task, failed, workers, scheduler, software_versions, access)
        for outcome in run:
            advance(outcome)
            yield outcome


def run_window(
    tasks: Iterable[T],
    fn: Callable[[T], R],
    failed: Callable[[T, BaseException], R],
    workers: int,
    scheduler: str | None,
    versions: Callable[[], dict[str, str]],
    access: Mapping[str, str] | None = None,
) -> Iterator[R]:
    """``fn(task)`` for every task on dask, at most ~2 per worker thread in flight (the tasks
    are drawn from the iterable only as they are sent); yields each result as it ends, or
    ``failed(task, exc)`` for a task that raised or whose worker was lost more often than dask
    allows (a worker that dies once: dask runs its task again on another).

    ``versions``: the software that decides what a task writes, the same on the driver and on
    every worker or the run is refused. ``access``: the environment the workers need for the
    source and the cache (see the module doc). ``fn`` and the tasks travel by pickle.
    """
    with dask_client(workers, scheduler) as (dd, client), _worker_access(client, access or {}):
        mismatch = software_mismatch(versions(), client.run(versions))
        if mismatch:
            raise OctstageError(
                f"dask workers decode with other software than this driver: {mismatch}; "
                "install the same octstage environment on every worker"
            )
        window = max(2, 2 * sum(client.nthreads().values()))
        pending = iter(tasks)
        by_future: dict[Any, T] = {}

        def submit(task: T) -> Any:
            future = client.submit(fn, task, pure=False)
            by_future[future] = task
            return future

        queue = dd.as_completed([submit(t) for t in islice(pending, window)])
        for future in queue:
            task = by_future.pop(future)
            try:
                result: R = future.result()
            except Exception as exc:  # noqa: BLE001 - a dead worker costs one task, not the run
                result = failed(task, exc)
            future.release()  # the worker may drop the result now: nothing accumulates
            yield result
            nxt = next(pending, None)
            if nxt is not None:
                queue.add(submit(nxt))


@contextmanager
def _worker_access(client: Any, env: Mapping[str, str]) -> Iterator[None]:
    if not env:
        yield
        return
    client.register_plugin(WorkerAccess(env), name=ACCESS_PLUGIN)
    try:
        yield
    finally:
        # If the cluster went away, its workers' environments went with it.
        with contextlib.suppress(OSError, TimeoutError, ValueError):
            client.unregister_worker_plugin(ACCESS_PLUGIN)


@contextmanager
def dask_client(workers: int, scheduler: str | None) -> Iterator[tuple[Any, Any]]:
    """``(dask.distributed, client)`` for the given scheduler, or for a ``local_cluster``."""
    # dask.distributed is only partly annotated: use it as a dynamic module.
    dd: Any = importlib.import_module("dask.distributed")
    # Scheduler/worker chatter (INFO on connect and close) would tear the progress bar apart.
    chatter = logging.getLogger("distributed")
    level = chatter.level
    chatter.setLevel(logging.ERROR)
    try:
        if scheduler is not None:
            try:
                client = dd.Client(scheduler, timeout=SCHEDULER_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                raise OctstageError(f"cannot reach the dask scheduler {scheduler}: {exc}") from exc
            with client:
                yield dd, client
        else:
            with local_cluster(workers) as cluster, dd.Client(cluster) as client:
                yield dd, client
    finally:
        chatter.setLevel(level)


@contextmanager
def local_cluster(workers: int) -> Iterator[Any]:
    """A LocalCluster of ``workers`` single-threaded processes on loopback, for the block."""
    dd: Any = importlib.import_module("dask.distributed")
    dask_config: Any = importlib.import_module("dask.config")
    # dask starts workers with glibc's MALLOC_TRIM_THRESHOLD_ set, which turns every large
    # temporary of the decoders into a fresh mmap with page faults: measured 30-45% slower
    # per volume. Peak memory stays bounded by the volume in hand either way.
    no_trim = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
    with dask_config.set(no_trim), _sigint_ignored():
        try:
            cluster = dd.LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",  # loopback, any free port (8787 may be taken)
                # Workers log a traceback at ERROR when the scheduler closes under a heartbeat
                # (every rebuild's shutdown may race one): noise, since a task's failure reaches
                # the driver as its outcome and a dead worker as an environmental rejection.
                silence_logs=logging.CRITICAL,
            )
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise OctstageError(f"cannot start a local dask cluster: {exc}") from exc
    with cluster:
        yield cluster


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the worker processes are spawned, so they inherit it ignored (Python
    keeps an ignored SIGINT at start-up): a Ctrl-C at the terminal reaches the whole process
    group, and only the driver should act on it, by closing the cluster and cleaning up, not
    every worker with a traceback of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _progress(total: int, console: Console, seconds: float) -> Iterator[Any]:
    counts = {"built": 0, "rejected": 0}
    with counter(console, "build-cache", total, seconds) as advance:

        def count(outcome: Outcome) -> None:
            counts["built" if outcome.record is not None else "rejected"] += 1
            advance(f"ok {counts['built']} rejected {counts['rejected']}")

        yield count
