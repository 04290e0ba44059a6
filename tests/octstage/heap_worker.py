"""Run by test_heap.py in a fresh process (a long test session's heap has too much free space
for the check to tell): build a plate table, then say whether glibc's mmap threshold moved.

``python heap_worker.py ROOT BUCKET DATASET TABLE OUT`` prints ``mapped`` (a freed large block
left the threshold where the build fixed it), ``heap`` (it moved) or ``cannot tell: ...``.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

from octstage.cellpainting import layout
from octstage.cellpainting.build import build
from octstage.heap import _glibc


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )  # glibc's struct mallinfo2
    ]


def mapped_after_a_larger_block_is_freed() -> str:
    """Whether a block larger than all the heap's free space is its own mapping once a 30 MiB
    mapped block was freed: glibc's moving threshold would have risen to 30 MiB and grown the
    heap for it instead (a block that fits a free chunk of the heap never asks either)."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return "cannot tell: glibc >= 2.33 only"
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = _MallInfo2
    raise_to = 30 << 20  # glibc's threshold moves up to 32 MiB at most
    libc.free(libc.malloc(raise_to))
    libc.malloc_trim(0)  # free heap given back first: the less is free, the fewer runs can't tell
    info = libc.mallinfo2()
    size = info.fordblks + (1 << 20)
    if size >= raise_to:
        return f"cannot tell: the heap has {info.fordblks} bytes free: no block size tells"
    block = libc.malloc(size)
    try:
        return "mapped" if libc.mallinfo2().hblkhd - info.hblkhd >= size else "heap"
    finally:
        libc.free(block)


def main(root: str, bucket: str, dataset: str, table: str, out: str) -> None:
    prefixes = layout.PrefixMap.parse([f"s3://{bucket}/{dataset}/={root}/"])
    _, built = build(root, Path(out), load_data=[table], prefixes=prefixes)
    assert built.fields > 0
    print(mapped_after_a_larger_block_is_freed())


if __name__ == "__main__":
    main(*sys.argv[1:6])
