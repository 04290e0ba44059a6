"""Where a region lies in its chunks (``data/chunk_regions.py``): pure arithmetic, checked against
numpy slicing of a known array."""

from __future__ import annotations

import numpy as np
import pytest

from octtrain.data.chunk_regions import axis_pieces, axis_steps, region_of


@pytest.mark.parametrize(
    ("lo", "hi", "count"),
    [(0, 64, 1), (16, 48, 1), (0, 1, 1), (3, 9, 2), (31, 33, 2), (8, 20, 2), (5, 37, 3)],
)
def test_axis_pieces_copy_exactly_the_span_in_at_most_three_pieces(
    lo: int, hi: int, count: int
) -> None:
    """A partial first chunk, the whole chunks, a partial last chunk: each piece only where the
    span has it (a span of whole chunks is one copy)."""
    chunk, line = 8, np.arange(64)
    first, n, pieces = axis_pieces(lo, hi, chunk, at=2)
    chunks = line[first * chunk : (first + n) * chunk].reshape(n, chunk)
    out = np.full(2 + hi - lo, -1)
    for (rows, cols), where in pieces:
        out[where] = chunks[rows, cols].reshape(-1)
    assert len(pieces) == count
    np.testing.assert_array_equal(out[2:], line[lo:hi])
    assert (out[:2] == -1).all()


def test_axis_steps_name_every_chunk_a_region_touches_and_where_it_lands() -> None:
    data = np.arange(20 * 30).reshape(20, 30)
    region = (slice(3, 17), slice(10, 29))
    out = np.zeros((14, 19), data.dtype)
    rows, cols = axis_steps(region, (0, 0), data.shape, (8, 8))
    assert [r[0] for r in rows] == [0, 1, 2] and [c[0] for c in cols] == [1, 2, 3]
    for ny, in_y, out_y in rows:
        for nx, in_x, out_x in cols:
            block = data[ny * 8 : ny * 8 + 8, nx * 8 : nx * 8 + 8]
            out[out_y, out_x] = block[in_y, in_x]
    np.testing.assert_array_equal(out, data[region])


def test_region_of_fills_none_and_refuses_what_a_read_cannot_take() -> None:
    assert region_of(None, (2, 3)) == (slice(0, 2), slice(0, 3))
    assert region_of((slice(None), slice(-2, None)), (2, 3)) == (slice(0, 2), slice(1, 3))
    with pytest.raises(ValueError, match="2 slices for a 3-d array"):
        region_of((slice(None), slice(None)), (1, 2, 3))
    with pytest.raises(ValueError, match="non-empty step-1"):
        region_of((slice(0, 4, 2),), (8,))
    with pytest.raises(ValueError, match="non-empty step-1"):
        region_of((slice(5, 5),), (8,))
