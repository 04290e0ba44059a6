"""Damage that a codec does not notice: one byte flipped inside an inner chunk's compressed
bytes such that blosc still decodes the chunk, to its full size, to other values (a flipped
literal byte of a zstd block, or a byte of a block blosc stored uncompressed). Only a checksum
of the chunk's bytes (the ``crc32c`` codec after blosc) tells such a chunk from a good one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numcodecs.blosc
import numpy as np

BLOSC_HEADER = 16  # blosc's own header: flipping a byte there breaks the decode, not the values
EMPTY = 2**64 - 1


def flip_decodable(array_dir: Path) -> int:
    """Flip one byte of the first stored inner chunk of the one shard (``c/0/0/0``, a pack's
    ``c/0/0/0/0``) of the
    sharded array at ``array_dir`` so that the chunk still decodes, to other values; the shard
    index and the chunk's crc32c (if the layout has one) are left as written. Returns the
    byte's offset in the shard."""
    meta = json.loads((array_dir / "zarr.json").read_text())
    conf = meta["codecs"][0]["configuration"]
    outer = meta["chunk_grid"]["configuration"]["chunk_shape"]
    n = math.prod(math.ceil(o / i) for o, i in zip(outer, conf["chunk_shape"], strict=True))
    crc = 4 if conf["codecs"][-1]["name"] == "crc32c" else 0
    shard = array_dir.joinpath("c", *("0" * len(outer)))  # a field's 3 axes, a pack's 4
    raw = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(raw[-(n * 16 + 4) : -4]), dtype="<u8").reshape(n, 2)
    for offset, length in sorted((int(o), int(s)) for o, s in index if o != EMPTY):
        payload = bytes(raw[offset : offset + length - crc])
        original = numcodecs.blosc.decompress(payload)
        for at in range(BLOSC_HEADER, len(payload)):
            trial = bytearray(payload)
            trial[at] ^= 0x10
            try:
                decoded = numcodecs.blosc.decompress(bytes(trial))
            except Exception:  # noqa: BLE001 - this flip breaks the decode: try the next
                continue
            if len(decoded) == len(original) and decoded != original:
                raw[offset + at] ^= 0x10
                shard.write_bytes(bytes(raw))
                return offset + at
    raise AssertionError(f"{array_dir}: no byte flip that still decodes")
