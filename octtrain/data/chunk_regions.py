"""Where a region of a chunked array lies in its chunks (pure arithmetic, no I/O): the chunks
each axis of a region touches (``axis_steps``), a run of decoded chunks cut into at most three
pieces per axis for the copy into the output (``axis_pieces``), and a read's slices checked
against the array's shape (``region_of``). ``data/arrayread.py`` reads and decodes by them.
"""

from __future__ import annotations

from collections.abc import Sequence

Region = tuple[slice, ...]


Step = tuple[int, slice, slice]  # on one axis: a chunk's number, its part in the chunk, in out


def axis_steps(
    region: Region, origin: Sequence[int], extent: Sequence[int], chunk: Sequence[int]
) -> list[list[Step]]:
    """Per axis, the chunks of size ``chunk`` tiling the box at ``origin`` of ``extent`` that
    ``region`` (array coordinates) touches: their number in the box, the part of each that the
    region takes (in chunk coordinates) and where that part goes in the region's output."""
    axes = []
    for s, o, e, c in zip(region, origin, extent, chunk, strict=True):
        lo, hi = max(s.start, o), min(s.stop, o + e)  # the region's part of the box, this axis
        steps = []
        for n in range((lo - o) // c, (hi - 1 - o) // c + 1):
            a = o + n * c
            first, last = max(a, lo), min(a + c, hi)
            steps.append((n, slice(first - a, last - a), slice(first - s.start, last - s.start)))
        axes.append(steps)
    return axes


# On one axis, a piece of a run of decoded chunks: which chunks, which part of each (the same
# part of every chunk in the piece) and where the piece goes in out.
Piece = tuple[tuple[slice, slice], slice]


def axis_pieces(lo: int, hi: int, chunk: int, at: int) -> tuple[int, int, list[Piece]]:
    """On one axis, the chunks that cover ``[lo, hi)`` (shard coordinates), as the first and
    the number of them, and that span cut into at most three pieces: a partial first chunk,
    the whole chunks, a partial last chunk; ``at`` is where ``lo`` goes in out. Copying piece
    by piece (at most 3 per axis) instead of chunk by chunk (a crop of 4 x 4 chunks: 9 copies,
    a whole volume: one) leaves numpy the loop over chunks."""
    first, stop = lo // chunk, (hi - 1) // chunk + 1
    u, v = lo - first * chunk, hi - first * chunk  # the span in the chunks' own coordinates
    n = stop - first
    if n == 1:
        return first, n, [((slice(0, 1), slice(u, v)), slice(at, at + v - u))]
    pieces: list[Piece] = []
    k, pos = 0, at
    if u:
        pieces.append(((slice(0, 1), slice(u, chunk)), slice(pos, pos + chunk - u)))
        k, pos = 1, pos + chunk - u
    whole = n if v == n * chunk else n - 1
    if whole > k:
        pieces.append(((slice(k, whole), slice(0, chunk)), slice(pos, pos + (whole - k) * chunk)))
        pos += (whole - k) * chunk
    if whole < n:
        tail = v - (n - 1) * chunk
        pieces.append(((slice(n - 1, n), slice(0, tail)), slice(pos, pos + tail)))
    return first, n, pieces


def region_of(key: Sequence[slice] | None, shape: Sequence[int]) -> Region:
    """``key`` (slices with steps of 1, one per axis, or None: everything) inside ``shape``."""
    if key is None:
        return tuple(slice(0, s) for s in shape)
    if len(key) != len(shape):
        raise ValueError(f"{len(key)} slices for a {len(shape)}-d array")
    out = []
    for s, n in zip(key, shape, strict=True):
        start, stop, step = s.indices(n)
        if step != 1 or stop <= start:
            raise ValueError(f"slice {s} of an axis of {n}: need a non-empty step-1 slice")
        out.append(slice(start, stop))
    return tuple(out)
