"""The allocator settings that keep a plate build's peak memory flat with its fields
(``octstage.heap``): glibc's mmap threshold stays fixed through a build, and a parquet table
is decoded through Arrow's system pool, the previous pool back after."""

from __future__ import annotations

import ctypes
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from octstage.cellpainting import layout
from octstage.cellpainting.build import build
from octstage.cellpainting.synth import TwinInfo
from octstage.heap import _glibc, arrow_system_pool


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


def _mapped_after_a_larger_block_is_freed() -> bool:
    """Whether a block larger than all the heap's free space is its own mapping once a 30 MiB
    mapped block was freed: glibc's moving threshold would have risen to 30 MiB and grown the
    heap for it instead (a block that fits a free chunk of the heap never asks either)."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc >= 2.33 only")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = _MallInfo2
    raise_to = 30 << 20
    libc.free(libc.malloc(raise_to))
    libc.malloc_trim(0)  # free heap given back first: the less is free, the fewer runs can't tell
    info = libc.mallinfo2()
    size = info.fordblks + (1 << 20)
    if size >= raise_to:
        pytest.skip(f"the heap has {info.fordblks} bytes free: no block size tells")
    block = libc.malloc(size)
    try:
        return bool(libc.mallinfo2().hblkhd - info.hblkhd >= size)
    finally:
        libc.free(block)


def test_a_build_fixes_glibcs_mmap_threshold(twin: tuple[Path, TwinInfo], tmp_path: Path) -> None:
    """After the build, a freed pixel-sized block does not move the threshold: buffers of the
    next fields are their own mappings, not holes in a heap that grows with the plate."""
    root, info = twin
    table = next(
        str(p.relative_to(root)) for p in sorted(root.rglob("load_data_with_illum.parquet"))
    )
    prefixes = layout.PrefixMap.parse([f"s3://{info.bucket}/{info.dataset}/={root}/"])
    _, built = build(str(root), tmp_path / "c", load_data=[table], prefixes=prefixes)
    assert built.fields > 0
    assert _mapped_after_a_larger_block_is_freed()


def _parquet(rows: int) -> bytes:
    buf = io.BytesIO()
    names = [f"source_4/images/plate/r{i:05d}-ch1sk1fk1fl1.tiff" for i in range(rows)]
    pq.write_table(pa.table({"FileName_OrigDNA": names, "Metadata_Site": list(range(rows))}), buf)
    return buf.getvalue()


def test_a_parquet_table_is_decoded_through_arrows_system_pool() -> None:
    """While a table's rows stream, Arrow's buffers are malloc's (its default pool would keep
    them); after, the default pool is the one before."""
    before = pa.default_memory_pool()
    system = pa.system_memory_pool()
    rows = layout.iter_table(_parquet(5000), "t.parquet", batch_rows=100)
    first = next(rows)
    assert first["Metadata_Site"] == "0"
    assert system.bytes_allocated() > 100_000  # the row group, decoded
    assert len(list(rows)) == 4999
    assert pa.default_memory_pool().backend_name == before.backend_name


def test_tables_read_interleaved_give_back_the_pool_they_found() -> None:
    before = pa.default_memory_pool().backend_name
    outer = arrow_system_pool()
    inner = arrow_system_pool()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the first to enter leaves first: the other still reads
    assert pa.default_memory_pool().backend_name == "system"
    inner.__exit__(None, None, None)
    assert pa.default_memory_pool().backend_name == before
