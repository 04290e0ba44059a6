"""The process's allocators, set so that a long build's memory does not grow with its items.

Two allocators kept memory a Cell Painting plate build had freed, so that its peak RSS grew
with the plate's fields (~29 MiB from 384 to 3,456 fields at 128 px, none of it live Python
objects; the ~21 KB a field earlier rounds printed was mostly the bench's own measuring):

- glibc's malloc raises its mmap threshold each time a block it had mapped is freed (up to
  32 MiB): after the first field, pixel buffers of hundreds of KB to MBs come from the heap
  instead of their own mappings, and the heap, interleaved with small long-lived blocks,
  fragments and is not given back. ``fix_mmap_threshold`` sets the threshold (which also
  stops its moving): every buffer at or above it (1 MiB) is its own mapping, returned when
  freed.
- Arrow's default pool (mimalloc or jemalloc) keeps the pages a decoded parquet table took (a
  plate's table decodes whole: ~2 KB a field) and takes them from segments much larger than
  asked. ``arrow_system_pool`` makes Arrow's system pool (malloc) the one Python's calls use.
  Arrow's C++ takes some buffers from its own default all the same (~1 KB a field of a
  parquet table): read in the calling thread (no ``pre_buffer``, no ``use_threads``), they
  are in the heap that ``release_unused`` can give back.

Both are settings of this process (glibc's for every thread, Arrow's default pool while the
context lasts): they change where memory comes from, never what a build computes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Iterator
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
# Not glibc's starting 128 KiB: a 256 px field's planes and their temporaries (128 KiB-1 MiB,
# hundreds a field) each mapped, faulted in and unmapped took ~40% more CPU. At 1 MiB a 1,080
# px field's buffers (2-23 MiB) are still mappings of their own.
MMAP_THRESHOLD = 1024 * 1024


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (mallopt's parameters are glibc's), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
    except (OSError, AttributeError):
        return None
    return libc


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``nbytes``; False where the C library is not glibc."""
    libc = _glibc()
    return libc is not None and libc.mallopt(M_MMAP_THRESHOLD, nbytes) == 1


class _ArrowPool:
    """Who reads through the system pool now: the first to enter sets it, the last to leave
    puts the previous pool back (two tables read interleaved must not leave it set)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.previous: Any = None


_ARROW = _ArrowPool()


@contextlib.contextmanager
def arrow_system_pool() -> Iterator[None]:
    """Arrow's default pool is its system pool (malloc) while the context lasts; the previous
    one after, with what the system pool no longer uses handed back to the system."""
    import pyarrow as pa

    with _ARROW.lock:
        if _ARROW.depth == 0:
            _ARROW.previous = pa.default_memory_pool()
            pa.set_memory_pool(pa.system_memory_pool())
        _ARROW.depth += 1
    try:
        yield
    finally:
        with _ARROW.lock:
            _ARROW.depth -= 1
            if _ARROW.depth == 0:
                pa.set_memory_pool(_ARROW.previous)
                _ARROW.previous.release_unused()  # what Arrow's C++ took from it all the same
                _ARROW.previous = None
                pa.system_memory_pool().release_unused()
