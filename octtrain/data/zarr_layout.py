"""What a cached array's ``zarr.json`` says, for ``data/arrayread.py``: where its chunks are
(a regular grid, sharded or not, the chunk key encoding) and how they are encoded (``bytes``,
one of blosc / zstd / none, an optional crc32c; a shard index of ``bytes`` + an optional
crc32c, little-endian). Parsed once per array; anything octstage does not write is a DataError
naming the array, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from octtrain.errors import DataError

ADVICE = "run `octstage verify` on the manifest, then rebuild or restage the cache"


@dataclass(frozen=True)
class Layout:
    """What ``zarr.json`` says about where an array's chunks are and how they are encoded."""

    shape: tuple[int, ...]
    outer: tuple[int, ...]  # the chunk grid: one data object per outer chunk
    inner: tuple[int, ...]  # the decoded unit: the inner chunk of a shard, or the chunk itself
    sharded: bool
    codec: str  # "blosc", "zstd" or "none"
    chunk_crc: bool  # each chunk's stored bytes end in the crc32c of the rest (newer caches)
    index_crc: bool
    index_at_end: bool
    fill: int
    key_prefix: str  # "c/" (default encoding) or "" (v2 encoding)
    separator: str


def _refuse(where: str, what: str) -> DataError:
    return DataError(f"{where}: {what}; the trainer reads octstage's layout ({ADVICE})")


def _chunk_codec(codecs: Sequence[Any], where: str) -> tuple[str, bool]:
    """``(compressor, crc)`` of a chunk's codecs: ``bytes``, at most one compressor, then an
    optional ``crc32c`` (of the compressed bytes, stored after them)."""
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs]
    crc = bool(names) and names[-1] == "crc32c"
    middle = names[1:-1] if crc else names[1:]
    if not names or names[0] != "bytes" or len(middle) > 1:
        raise _refuse(where, f"codecs {names} are not bytes + one compressor + an optional crc32c")
    codec = middle[0] if middle else "none"
    if codec not in ("blosc", "zstd", "none"):
        raise _refuse(where, f"codec {codec!r} is not read here")
    return str(codec), crc


def parse_layout(meta: dict[str, Any], where: str) -> Layout:
    """The ``Layout`` of a Zarr v3 uint8 array's metadata; DataError for anything else."""
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise _refuse(where, "not a Zarr v3 array")
    if meta.get("data_type") != "uint8":
        raise _refuse(where, f"data type {meta.get('data_type')!r} is not uint8")
    grid = meta.get("chunk_grid", {})
    if grid.get("name") != "regular":
        raise _refuse(where, f"chunk grid {grid.get('name')!r} is not regular")
    shape = tuple(int(s) for s in meta["shape"])
    outer = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
    encoding = meta.get("chunk_key_encoding", {"name": "default"})
    enc_name = encoding.get("name")
    sep = encoding.get("configuration", {}).get("separator", "/" if enc_name == "default" else ".")
    if enc_name not in ("default", "v2"):
        raise _refuse(where, f"chunk key encoding {enc_name!r}")
    codecs = meta.get("codecs", [])
    fill = int(meta.get("fill_value") or 0)
    common = {"fill": fill, "key_prefix": "c/" if enc_name == "default" else "", "separator": sep}
    if codecs and codecs[0].get("name") == "sharding_indexed":
        if len(codecs) != 1:
            raise _refuse(where, "codecs after the sharding codec")
        conf = codecs[0]["configuration"]
        index = [c.get("name") for c in conf.get("index_codecs", [])]
        if index not in (["bytes"], ["bytes", "crc32c"]):
            raise _refuse(where, f"shard index codecs {index}")
        endian = conf["index_codecs"][0].get("configuration", {}).get("endian", "little")
        if endian != "little":
            raise _refuse(where, "a big-endian shard index")
        codec, crc = _chunk_codec(conf["codecs"], where)
        return Layout(
            shape=shape,
            outer=outer,
            inner=tuple(int(c) for c in conf["chunk_shape"]),
            sharded=True,
            codec=codec,
            chunk_crc=crc,
            index_crc=index[-1] == "crc32c",
            index_at_end=conf.get("index_location", "end") == "end",
            **common,
        )
    codec, crc = _chunk_codec(codecs, where)
    return Layout(
        shape=shape,
        outer=outer,
        inner=outer,
        sharded=False,
        codec=codec,
        chunk_crc=crc,
        index_crc=False,
        index_at_end=True,
        **common,
    )
