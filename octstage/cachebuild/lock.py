"""The folder a build writes: opened by URL, locked against a second build, and cleaned of the
temporaries a killed or interrupted run left (under the lock, so never another build's)."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from octstage.cache.store import CacheStore
from octstage.errors import OctstageError


def open_cache(out: str | os.PathLike[str]) -> CacheStore:
    """The cache at ``out``; a folder is made absolute (remote workers get it by name) and
    created."""
    url = os.fspath(out)
    if "://" not in url or url.startswith("file://"):
        folder = Path(url.removeprefix("file://")).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        url = str(folder)
    return CacheStore(url)


@contextmanager
def exclusive(cache: CacheStore) -> Iterator[None]:
    """One build per cache folder at a time (a second one would race on the same keys), and a
    killed run's temporaries removed under the lock. A bucket cache has no temporaries."""
    out = cache.local
    if out is None:
        yield
        return
    with open(out / ".build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise OctstageError(f"{out}: another build-cache is running on this cache") from exc
        remove_temporaries(out)
        try:
            yield
        except BaseException:  # Ctrl-C, a full disk: the cluster is closed by now
            remove_temporaries(out)  # volumes cut off mid-write; finished ones are kept
            raise


def remove_temporaries(out: Path) -> None:
    """Half-written files of a killed run or worker (hidden, never read): safe to drop under
    the lock. ``volumes`` holds OCT volumes, ``fields`` and ``packs`` Cell Painting fields."""
    for tmp in (t for top in ("volumes", "fields", "packs") for t in (out / top).glob("*/.tmp-*")):
        shutil.rmtree(tmp, ignore_errors=True)
    for tmp in [*(out / "records").glob(".*.tmp"), *(out / "rejects").glob(".*.tmp")]:
        tmp.unlink(missing_ok=True)
