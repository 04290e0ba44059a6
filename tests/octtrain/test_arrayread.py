"""The trainer's reader of cached arrays: zarr's values for any region of what octstage writes
(volumes and fields, sharded) and of plain chunked arrays; a region reads only its chunks; a
missing or damaged data object is a DataError, never zeros."""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BloscShuffle, Crc32cCodec, ZstdCodec

from octstage.cache.volumestore import write_volume
from octstage.cellpainting.fieldstore import write_field
from octtrain.data import arrayread
from octtrain.data.arrayread import open_array
from octtrain.data.zarr_layout import parse_layout
from octtrain.errors import DataError
from tests.octstage.chunk_damage import flip_decodable

SHARD = Path("c/0/0/0")


@pytest.fixture(params=["runs, kept buffers", "chunk by chunk, fresh buffers"], autouse=True)
def shard_access(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: chunks stored next to each other read in one preadv (a run) into the
    thread's kept buffers; and one preadv per chunk (what a run past ``RUN_MAX`` bytes does: a
    whole volume) into fresh buffers (what a read of more than ``SCRATCH_MAX`` bytes uses)."""
    if request.param.startswith("chunk by chunk"):
        monkeypatch.setattr(arrayread, "RUN_MAX", 0)
        monkeypatch.setattr(arrayread, "SCRATCH_MAX", 0)
    return str(request.param)


def volume(tmp_path: Path, shape: tuple[int, int, int] = (9, 40, 44)) -> tuple[Path, np.ndarray]:
    """A volume as build-cache writes it, chunks (4, 16, 16): a 3 x 3 x 3 grid in one shard.
    Smooth plus noise, so that blosc compresses it (a stored, uncompressed block has no
    structure that a damaged byte could break)."""
    ramp = np.indices(shape).sum(axis=0) * 3
    noise = np.random.default_rng(0).integers(0, 8, shape)
    data = ((ramp + noise) % 256).astype(np.uint8)
    write_volume(tmp_path, "v.ome.zarr", data, (1.0, 1.0, 1.0), {}, chunks=(4, 16, 16))
    return tmp_path / "v.ome.zarr" / "0", data


def field(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A field as build-cache writes it, chunks (5, 32, 32): a 3 x 3 grid in one shard."""
    data = np.random.default_rng(1).integers(0, 255, (5, 70, 90), dtype=np.uint8)
    write_field(tmp_path, "f.ome.zarr", data, ["a", "b", "c", "d", "e"], {}, chunk=32)
    return tmp_path / "f.ome.zarr" / "0", data


def plain(tmp_path: Path, compressors: object = "auto") -> tuple[Path, np.ndarray]:
    """An unsharded array (zarr's default codecs: zstd), chunks (5, 32, 32)."""
    data = np.random.default_rng(2).integers(0, 255, (5, 70, 90), dtype=np.uint8)
    path = tmp_path / "plain"
    array = zarr.create_array(
        store=str(path),
        shape=data.shape,
        chunks=(5, 32, 32),
        dtype="uint8",
        compressors=compressors,  # type: ignore[arg-type]
    )
    array[...] = data
    return path, data


def regions(shape: tuple[int, ...], n: int, seed: int) -> list[tuple[slice, ...]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        starts = [int(rng.integers(0, s)) for s in shape]
        stops = [int(rng.integers(a + 1, s + 1)) for a, s in zip(starts, shape, strict=True)]
        out.append(tuple(slice(a, b) for a, b in zip(starts, stops, strict=True)))
    return out


@pytest.mark.parametrize("make", [volume, field, plain], ids=["volume", "field", "plain zstd"])
def test_every_region_reads_what_zarr_reads(make: object, tmp_path: Path) -> None:
    path, data = make(tmp_path)  # type: ignore[operator]
    array = open_array(path, "x")
    np.testing.assert_array_equal(array.read(), data)
    for region in regions(data.shape, 40, seed=3):
        np.testing.assert_array_equal(array.read(region), data[region])


def test_plain_uncompressed_chunks_read_too(tmp_path: Path) -> None:
    path, data = plain(tmp_path, compressors=None)
    np.testing.assert_array_equal(
        open_array(path, "x").read((slice(None), slice(3, 50), slice(31, 33))), data[:, 3:50, 31:33]
    )


def shard_index(path: Path, n: int) -> np.ndarray:
    raw = (path / SHARD).read_bytes()
    return np.frombuffer(raw[-(n * 16 + 4) : -4], dtype="<u8").reshape(n, 2)


def test_a_region_reads_the_shard_index_and_its_chunks_only(tmp_path: Path) -> None:
    path, data = field(tmp_path)
    array = open_array(path, "x")
    index = shard_index(path, 9)  # inner chunks in C order of the (1, 3, 3) grid
    cases = [
        ((slice(None), slice(0, 10), slice(0, 10)), [0]),
        ((slice(None), slice(30, 40), slice(40, 70)), [1, 2, 4, 5]),
        ((slice(1, 2), slice(64, 70), slice(0, 90)), [6, 7, 8]),
    ]
    for region, chunks in cases:
        array.bytes_read = array.objects_read = 0
        np.testing.assert_array_equal(array.read(region), data[region])
        assert array.objects_read == 1
        assert array.bytes_read == 9 * 16 + 4 + sum(int(index[c, 1]) for c in chunks)


def test_a_plain_region_opens_only_the_chunks_it_covers(tmp_path: Path) -> None:
    path, _ = plain(tmp_path)
    array = open_array(path, "x")
    array.read((slice(None), slice(33, 40), slice(10, 40)))  # chunk rows 1, columns 0 and 1
    assert array.objects_read == 2
    assert array.bytes_read == sum((path / f"c/0/1/{c}").stat().st_size for c in (0, 1))


def test_a_chunk_the_writer_left_empty_reads_as_the_fill_value(tmp_path: Path) -> None:
    data = np.random.default_rng(4).integers(1, 255, (8, 32, 32), dtype=np.uint8)
    data[:4, :16, :16] = 0  # one whole chunk of fill value: zarr writes no bytes for it
    write_volume(tmp_path, "v.ome.zarr", data, (1.0, 1.0, 1.0), {}, chunks=(4, 16, 16))
    path = tmp_path / "v.ome.zarr" / "0"
    assert (shard_index(path, 8)[0] == 2**64 - 1).all()
    np.testing.assert_array_equal(open_array(path, "x").read(), data)


def test_a_missing_shard_is_a_data_error_for_a_whole_read_and_a_crop(tmp_path: Path) -> None:
    path, _ = volume(tmp_path)
    (path / SHARD).unlink()
    array = open_array(path, "volume k1 at here")
    for region in (None, (slice(0, 1), slice(0, 1), slice(0, 1))):
        with pytest.raises(
            DataError,
            match=r"volume k1 at here: data object c/0/0/0 is missing; run `octstage verify`",
        ):
            array.read(region)


def test_a_missing_plain_chunk_is_a_data_error(tmp_path: Path) -> None:
    path, _ = plain(tmp_path)
    (path / "c/0/1/2").unlink()
    array = open_array(path, "x")
    with pytest.raises(DataError, match="data object c/0/1/2 is missing"):
        array.read()
    with pytest.raises(DataError, match="data object c/0/1/2 is missing"):
        array.read((slice(None), slice(40, 41), slice(80, 81)))


def damage_index(path: Path) -> None:
    raw = bytearray((path / SHARD).read_bytes())
    raw[-20] ^= 0xFF  # a byte of the last index entry: its crc32c no longer matches
    (path / SHARD).write_bytes(bytes(raw))


def damage_chunk(path: Path) -> None:
    raw = bytearray((path / SHARD).read_bytes())
    raw[40:80] = bytes(40)  # inside the first chunk's compressed bytes; the index is intact
    (path / SHARD).write_bytes(bytes(raw))


def truncate_below_index(path: Path) -> None:
    (path / SHARD).write_bytes((path / SHARD).read_bytes()[:100])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (damage_index, "does not decode .*index checksum"),
        (damage_chunk, "does not decode"),
        (truncate_below_index, r"is 100 bytes, shorter than its 436-byte index"),
    ],
    ids=["index crc", "chunk bytes", "shorter than the index"],
)
def test_a_damaged_shard_is_a_data_error(damage: object, message: str, tmp_path: Path) -> None:
    path, _ = volume(tmp_path)
    damage(path)  # type: ignore[operator]
    with pytest.raises(DataError, match=message):
        open_array(path, "x").read()


def test_no_metadata_and_layouts_not_read_here_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not in the cache"):
        open_array(tmp_path / "nothing", "x")
    wide = zarr.create_array(store=str(tmp_path / "u16"), shape=(4,), chunks=(2,), dtype="uint16")
    wide[...] = 1
    with pytest.raises(DataError, match="data type 'uint16' is not uint8"):
        open_array(tmp_path / "u16", "x")
    gz = zarr.create_array(
        store=str(tmp_path / "gz"),
        shape=(4,),
        chunks=(2,),
        dtype="uint8",
        compressors=zarr.codecs.GzipCodec(),
    )
    gz[...] = 1
    with pytest.raises(DataError, match="codec 'gzip' is not read here"):
        open_array(tmp_path / "gz", "x")


def test_metadata_changed_since_it_was_parsed_is_parsed_again(tmp_path: Path) -> None:
    """Parsed layouts are kept per zarr.json (a pack's is ~50 KB): a file rewritten since (a
    restaged or rebuilt cache) is read again, never its old layout."""
    zarr.create_array(store=str(tmp_path / "a"), shape=(4,), chunks=(2,), dtype="uint8")[...] = 1
    assert open_array(tmp_path / "a", "x").shape == (4,)
    meta = tmp_path / "a" / "zarr.json"
    doc = json.loads(meta.read_text())
    meta.write_text(json.dumps({**doc, "data_type": "int8"}))
    with pytest.raises(DataError, match="data type 'int8' is not uint8"):
        open_array(tmp_path / "a", "x")
    meta.unlink()
    with pytest.raises(DataError, match="not in the cache"):
        open_array(tmp_path / "a", "x")


def edge_regions(shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """Per axis, spans that end on, start on, cross and stay inside chunk edges (and the
    array's last, partial chunk), combined across axes."""
    per_axis = []
    for n, c in zip(shape, chunks, strict=True):
        spans = {(0, n), (0, 1), (n - 1, n), (c - 1, c + 1), (c, 2 * c), (1, n - 1)}
        spans |= {(c + 1, min(n, 3 * c - 1)), (min(c + 3, n - 1), n), (0, min(c, n))}
        per_axis.append(sorted((a, b) for a, b in spans if 0 <= a < b <= n))
    return [tuple(slice(a, b) for a, b in spans) for spans in itertools.product(*per_axis)]


@pytest.mark.parametrize("make", [volume, field], ids=["volume", "field"])
def test_crops_on_and_off_chunk_edges_read_what_zarr_reads(make: object, tmp_path: Path) -> None:
    """The sharded read decodes a crop's chunks side by side, then copies at most three pieces
    per axis (a partial first chunk, whole chunks, a partial last chunk) into the output."""
    path, _ = make(tmp_path)  # type: ignore[operator]
    array, reference = open_array(path, "x"), zarr.open_array(str(path), mode="r")
    values = reference[...]  # zarr's values, sliced: a zarr read per region takes ~1 ms
    for region in edge_regions(array.shape, array.layout.inner):
        np.testing.assert_array_equal(array.read(region), values[region], err_msg=str(region))
    for region in regions(array.shape, 20, seed=7):
        np.testing.assert_array_equal(array.read(region), reference[region], err_msg=str(region))


def test_an_empty_chunk_inside_a_crop_reads_as_the_fill_value(tmp_path: Path) -> None:
    data = np.random.default_rng(5).integers(1, 255, (8, 48, 48), dtype=np.uint8)
    data[4:8, 16:32, 16:32] = 0  # the chunk at (1, 1, 1): zarr writes no bytes for it
    write_volume(tmp_path, "v.ome.zarr", data, (1.0, 1.0, 1.0), {}, chunks=(4, 16, 16))
    path = tmp_path / "v.ome.zarr" / "0"
    assert (shard_index(path, 18)[9 + 3 + 1] == 2**64 - 1).all()
    other, _ = volume(tmp_path / "other")
    for region in [
        (slice(2, 8), slice(10, 40), slice(5, 30)),
        (slice(4, 8), slice(16, 32), slice(20, 21)),
    ]:
        open_array(other, "y").read()  # this thread's buffers now hold another array's values
        np.testing.assert_array_equal(open_array(path, "x").read(region), data[region])


def test_a_chunk_whose_header_gives_another_size_is_a_data_error(tmp_path: Path) -> None:
    """A chunk that would decode to fewer bytes than its place would leave stale bytes there."""
    path, _ = volume(tmp_path)
    raw = bytearray((path / SHARD).read_bytes())
    offset, length = (int(v) for v in shard_index(path, 27)[4])
    raw[offset + 4 : offset + 8] = (1000).to_bytes(4, "little")  # blosc's decoded size
    # The chunk's crc32c made to agree (as a writer with a bug would store it): the size
    # check, not the checksum, is what refuses this chunk.
    payload = bytes(raw[offset : offset + length - 4])
    raw[offset + length - 4 : offset + length] = google_crc32c.value(payload).to_bytes(4, "little")
    (path / SHARD).write_bytes(bytes(raw))
    array = open_array(path, "x")
    for region in (None, (slice(0, 4), slice(16, 20), slice(16, 20))):
        with pytest.raises(DataError, match=r"does not decode .*a chunk of 1000 bytes, not 1024"):
            array.read(region)


def test_threads_reading_at_once_each_read_their_own_values(tmp_path: Path) -> None:
    """Each thread decodes into buffers of its own: loader threads read at once, and blosc
    releases the GIL while it decodes."""
    (vpath, vdata), (fpath, fdata) = volume(tmp_path / "v"), field(tmp_path / "f")
    jobs = [(vpath, vdata, r) for r in regions(vdata.shape, 60, seed=8)]
    jobs += [(fpath, fdata, r) for r in regions(fdata.shape, 60, seed=9)]

    def read(job: tuple[Path, np.ndarray, tuple[slice, ...]]) -> bool:
        path, data, region = job
        return bool(np.array_equal(open_array(path, "x").read(region), data[region]))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, jobs * 5))


CHANGED = r"x: data does not decode \(object c/0/0/0: .*fails its crc32c checksum.*octstage verify"


@pytest.mark.parametrize("make", [volume, field], ids=["volume", "field"])
def test_a_chunk_changed_yet_still_decodable_is_a_data_error(make: object, tmp_path: Path) -> None:
    """A byte of a chunk's compressed bytes flipped so that blosc still decodes the chunk (to
    other values): the chunk's crc32c, checked before it decodes, refuses it, for a whole read
    and for a crop of that chunk alone; a crop of other chunks still reads."""
    path, data = make(tmp_path)  # type: ignore[operator]
    assert open_array(path, "x").layout.chunk_crc  # octstage writes the chunk checksum
    flip_decodable(path)
    array = open_array(path, "x")
    inner = array.layout.inner
    first = tuple(slice(0, c) for c in inner)  # the flipped chunk is stored first: chunk 0
    for region in (None, first):
        with pytest.raises(DataError, match=CHANGED):
            array.read(region)
    last = tuple(slice(s - 1, s) for s in array.shape)
    np.testing.assert_array_equal(array.read(last), data[last])


def old_layout(tmp_path: Path, data: np.ndarray, shuffle: BloscShuffle) -> Path:
    """``data`` as octstage wrote caches before the chunk checksum: sharded, each chunk
    ``bytes`` + ``blosc`` only (the index has its crc32c)."""
    array = zarr.create_array(
        store=str(tmp_path / "old"),
        shape=data.shape,
        chunks=(data.shape[0], 32, 32),
        shards=(data.shape[0], 96, 96),  # the inner chunks' multiple, as octstage's writers
        dtype="uint8",
        compressors=BloscCodec(cname="zstd", clevel=3, shuffle=shuffle),
    )
    array[...] = data
    return tmp_path / "old"


@pytest.mark.parametrize("shuffle", [BloscShuffle.shuffle, BloscShuffle.bitshuffle])
def test_a_cache_written_without_chunk_checksums_reads_as_before(
    shuffle: BloscShuffle, tmp_path: Path
) -> None:
    """Every region reads zarr's values; a flipped byte that still decodes reads as other
    values there, as it always did (only ``octstage verify``'s checksum of the values sees it)."""
    data = field(tmp_path)[1]
    path = old_layout(tmp_path, data, shuffle)
    array = open_array(path, "x")
    assert not array.layout.chunk_crc
    np.testing.assert_array_equal(array.read(), data)
    for region in edge_regions(array.shape, array.layout.inner):
        np.testing.assert_array_equal(array.read(region), data[region], err_msg=str(region))
    flip_decodable(path)
    assert not np.array_equal(open_array(path, "x").read(), data)


def test_plain_chunks_with_a_crc32c_read_and_a_changed_one_is_a_data_error(tmp_path: Path) -> None:
    path, data = plain(tmp_path, compressors=[ZstdCodec(), Crc32cCodec()])
    array = open_array(path, "x")
    assert array.layout.chunk_crc and array.layout.codec == "zstd"
    np.testing.assert_array_equal(array.read(), data)
    chunk = path / "c/0/1/2"
    raw = bytearray(chunk.read_bytes())
    raw[-1] ^= 0x01  # the stored crc32c itself: the bytes before it no longer match it
    chunk.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"object c/0/1/2: .*fails its crc32c checksum"):
        array.read((slice(None), slice(40, 41), slice(80, 81)))
    corner = (slice(None), slice(0, 3), slice(0, 3))  # another chunk: it still reads
    np.testing.assert_array_equal(array.read(corner), data[corner])


def test_a_checksum_before_the_compressor_is_not_read_here(tmp_path: Path) -> None:
    meta = json.loads((volume(tmp_path)[0] / "zarr.json").read_text())
    codecs = meta["codecs"][0]["configuration"]["codecs"]
    codecs[1], codecs[2] = codecs[2], codecs[1]  # bytes, crc32c, blosc
    with pytest.raises(DataError, match=r"codecs \['bytes', 'crc32c', 'blosc'\] are not"):
        parse_layout(meta, "x")


def test_a_short_read_is_named_as_an_object_cut_short_never_decoded_from_stale_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shard shrank between the index read and the data read (a copy over it, a network
    file system): the system call returns fewer bytes than asked; the rest of the buffer holds
    an earlier read's bytes, which must never be decoded (with crc32c: the wrong cause)."""
    import os

    path, data = volume(tmp_path)
    array = open_array(path, "volume k1 at here")
    np.testing.assert_array_equal(array.read(), data)  # the thread's buffers hold these bytes
    real = os.preadv

    def short(fd: int, buffers: list[memoryview], offset: int) -> int:
        (buffer,) = buffers
        return real(fd, [memoryview(buffer)[: len(buffer) // 2]], offset)

    monkeypatch.setattr(os, "preadv", short)
    with pytest.raises(DataError, match=r"volume k1 at here: data object c/0/0/0 was cut short"):
        array.read()
