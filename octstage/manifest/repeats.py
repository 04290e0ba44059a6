"""Values an item table lists more than once, found without a Python object per value.

``checks`` refuses a manifest whose items repeat a ``zarr_path``, ``cache_key`` or id, or whose
fields share a source file. Of an item table those columns are counted here: each string
becomes a 64-bit hash in numpy, one row group at a time (a million fields name five million
source files: ~430 MB of paths and a hash table of them, were they read whole and counted in
Arrow), and only the values whose hash occurs more than once are candidates. Equal values have
equal hashes, so the candidates hold every repeated value; ``checks`` compares the candidates'
values exactly (a collision of hashes alone is no finding) in the rows' order, which gives the
findings that comparing every value would.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# splitmix64's finaliser: every bit of a word reaches every bit of the hash.
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S1, _S2, _S3 = np.uint64(30), np.uint64(27), np.uint64(31)
# The low ``k`` bytes of a little-endian word, for the last word of a string of ``8j + k``.
_KEEP = np.array([(1 << (8 * k)) - 1 for k in range(8)], dtype=np.uint64)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of each word (in place, and returned)."""
    x ^= x >> _S1
    x *= _M1
    x ^= x >> _S2
    x *= _M2
    x ^= x >> _S3
    return x


def string_hashes(values: pa.Array) -> np.ndarray:
    """A 64-bit hash of each value of a string (or binary) array; a null's is 0, as is the
    empty string's (a candidate pair, told apart by the exact comparison)."""
    large = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    width = 8 if large else 4
    n = len(values)
    if not n:  # an empty array may come without an offsets buffer
        return np.zeros(0, np.uint64)
    buffers = values.buffers()
    offsets = np.frombuffer(
        buffers[1], dtype=np.int64 if large else np.int32, count=n + 1, offset=values.offset * width
    ).astype(np.int64)
    low, high = int(offsets[0]), int(offsets[-1])
    data = np.zeros(high - low + 8, np.uint8)  # 8 spare bytes: the last word reads past the end
    if high > low:
        data[: high - low] = np.frombuffer(buffers[2], np.uint8, count=high - low, offset=low)
    # The 8 bytes from every byte position, as one (unaligned) word each: a view, not a copy.
    words = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    lengths = np.diff(offsets)
    # Longest first: the strings that still have a word ``k`` are a prefix (views, no copies).
    order = np.argsort(-lengths, kind="stable")
    start, size = offsets[:-1][order] - low, lengths[order]
    hashes = size.astype(np.uint64) * _M1
    for k in range(0, int(size[0]), 8):  # ~11 rounds for 85-byte paths
        alive = int(np.searchsorted(-size, -k, side="left"))  # strings longer than k bytes
        whole = int(np.searchsorted(-size, -(k + 8), side="right"))  # with 8 bytes left
        word = words[start[:alive] + k]
        word[whole:] &= _KEEP[size[whole:alive] - k]  # a string's last, partial word
        part = hashes[:alive]
        part ^= word
        mix(part)
    hashes[order] = hashes.copy()
    if values.null_count:
        hashes[~np.asarray(values.is_valid())] = 0
    return hashes


def repeated(hashes: np.ndarray) -> np.ndarray:
    """Which elements' hash occurs more than once (a boolean mask, all False when none)."""
    ordered = np.sort(hashes)
    twice = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(twice):
        return np.zeros(len(hashes), dtype=bool)
    return np.isin(hashes, twice)


@dataclass(frozen=True)
class ListedStrings:
    """A list-of-strings column hashed: each row's count of values (-1: a null list), and each
    listed value's hash, in the rows' order."""

    lengths: np.ndarray
    hashes: np.ndarray

    def rows_of(self, values: np.ndarray) -> np.ndarray:
        """The row of each listed value (positions in ``hashes``)."""
        ends = np.cumsum(np.maximum(self.lengths, 0))
        return np.searchsorted(ends, values, side="right")


def hash_lists(chunks: Iterable[pa.Array], leaf: str | None = None) -> ListedStrings:
    """Hash a list column read in chunks (of lists of strings, or of structs whose ``leaf``
    field is the string), one chunk at a time."""
    lengths, hashes = [], []
    for chunk in chunks:
        count = pc.fill_null(pc.list_value_length(chunk), -1).to_numpy(zero_copy_only=False)
        values = pc.list_flatten(chunk)
        if leaf is not None:
            values = pc.struct_field(values, leaf)
        lengths.append(np.asarray(count, dtype=np.int64))
        hashes.append(string_hashes(values))
    return ListedStrings(
        np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
        np.concatenate(hashes) if hashes else np.zeros(0, np.uint64),
    )


def hash_strings(chunks: Iterable[pa.Array]) -> np.ndarray:
    """Hash a string column read in chunks, one chunk at a time."""
    parts = [string_hashes(chunk) for chunk in chunks]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)
