"""Guards of the Cell Painting cache that no other test noticed, each seen failing without it:
verify's fast path through a pack (a tile of another size, a place past the pack), a member
larger than its pack, a pack named and laid out by its sorted members, plates spooled in the
build's order whatever order they end in; and the pure rules behind the build's lines (stale
arrays, capped worker processes), the twin's splits, and a FIFO refused by the folder backend."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
import zarr
from numcodecs import blosc

from octstage.cache.stale import remove_arrays, stale_arrays
from octstage.cache.store import CacheStore
from octstage.cache.verify import Listed, check_packed
from octstage.cachebuild.plan import capped_workers
from octstage.cellpainting import layout, packread, packstore, platetask
from octstage.cellpainting.build import build
from octstage.cellpainting.fieldwriter import PackWriter
from octstage.errors import StorageError, VerificationError
from octstage.storage import LocalStorage

SHAPE = (5, 70, 60)


def _pack(tmp_path: Path, n: int = 3) -> tuple[str, list[packstore.Member], list[np.ndarray]]:
    rng = np.random.default_rng(1)
    fields = [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(n)]
    writer = PackWriter(CacheStore(str(tmp_path)), "P1", 64, 3, n)
    writer.plan([f"k{i}" for i in range(n)])
    records = [writer.write(f"k{i}", f"k{i}", f, "ABCDE") for i, f in enumerate(fields)]
    writer.close()
    members = [(int(r.pack_index or 0), tuple(r.shape), r.checksum) for r in records]
    return records[0].zarr_path, members, fields


def _opener(root: Path) -> Any:
    return lambda rel: packstore.open_pack(root, rel)


def test_a_tile_decoding_to_another_size_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    """A tile whose crc32c holds but whose blosc frame decodes to fewer bytes than a tile: the
    fast path leaves that member to zarr, whose failure is the member's finding; the others
    verify."""
    rel, members, _ = _pack(tmp_path)
    shard = tmp_path / rel / "0" / packstore.SHARD_KEY
    data = shard.read_bytes()
    k, rows, cols = 3, 2, 1  # 70 x 60 px in 64 px tiles
    size = k * rows * cols * 16
    body = data[: -size - 4]
    index = np.frombuffer(data[-size - 4 : -4], "<u8").reshape(k, rows, cols, 2).copy()
    short = blosc.compress(np.full(5 * 64 * 64 - 64, 7, np.uint8).tobytes(), b"zstd", 5, 1)
    chunk = short + google_crc32c.value(short).to_bytes(4, "little")
    index[1, 0, 0] = (len(body), len(chunk))
    raw = index.tobytes()
    shard.write_bytes(body + chunk + raw + google_crc32c.value(raw).to_bytes(4, "little"))
    direct = packread.fields(tmp_path / rel / "0", [(i, s) for i, s, _ in members])
    assert direct is not None
    assert [v is None for v in direct] == [False, True, False]
    items = [Listed(rel, s, "uint8", c, i) for i, s, c in members]
    found = check_packed(tmp_path, items, _opener(tmp_path))
    assert found[0] is None and found[2] is None
    assert found[1] is not None and found[1][0] == "changed" and "field 1" in found[1][1]


def test_a_place_past_the_pack_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    rel, members, _ = _pack(tmp_path)
    assert packread.fields(tmp_path / rel / "0", [(3, SHAPE)]) is None  # zarr words it
    item = Listed(rel, SHAPE, "uint8", members[0][2], 3)
    (finding,) = check_packed(tmp_path, [item], _opener(tmp_path))
    assert finding == (
        "changed",
        f"no field 3 of shape {list(SHAPE)} in a pack of shape [3, 5, 70, 60]",
    )


def test_a_member_larger_than_its_pack_is_named_so_not_a_checksum(tmp_path: Path) -> None:
    """zarr clips a read past the pack's edge: without the check the finding would be a
    checksum of the clipped values, naming the wrong cause."""
    rel, members, _ = _pack(tmp_path)
    larger = [(members[0][0], (5, 80, 60), members[0][2])]
    with pytest.raises(VerificationError, match=r"does not fit a pack of shape \[3, 5, 70, 60\]"):
        packstore.check_pack(tmp_path, rel, larger)


def test_a_pack_is_named_and_laid_out_by_its_sorted_members(tmp_path: Path) -> None:
    """The same fields planned in another order (a table re-exported) find the same pack, each
    at its own place: kept, never rewritten, and never another field's pixels."""
    assert packstore.pack_key(["b", "a", "c"]) == packstore.pack_key(["a", "b", "c"])
    rel, members, fields = _pack(tmp_path)
    keys = ["k0", "k1", "k2"]
    again = PackWriter(CacheStore(str(tmp_path)), "P1", 64, 3, 3)
    again.plan(keys[::-1])
    pack = zarr.open_array(str(tmp_path / rel / "0"), mode="r")
    for n, key in enumerate(keys):
        stored = again.stored(key)
        assert stored is not None and stored.zarr_path == rel  # the pack there, kept
        place = int(stored.pack_index or 0)
        assert place == members[n][0]
        assert (np.asarray(pack[place]) == fields[n]).all()


@pytest.fixture(scope="module")
def two_plates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from octstage.cellpainting.synth import generate

    out = tmp_path_factory.mktemp("plates") / "twin"
    generate(out, plates=2, sites=1, size=32, traps=False, replicates=1)
    return out / "cpg0016-jump"


def test_plates_are_spooled_in_the_builds_order_whatever_order_they_end(
    two_plates: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster's plates, built here and ending last first (a slow first plate): the
    manifest lists the fields as the one-process build does."""
    prefixes = layout.PrefixMap.parse([f"s3://cellpainting-gallery/cpg0016-jump/={two_plates}/"])
    _, alone = build(str(two_plates), tmp_path / "a", workers=1, prefixes=prefixes)

    def last_first(tasks: Iterator[platetask.PlateTask], *_: object) -> Iterator[Any]:
        yield from reversed([platetask.run_plate(t) for t in tasks])

    monkeypatch.setattr(platetask, "run_plates", last_first)
    _, cluster = build(str(two_plates), tmp_path / "b", workers=1, prefixes=prefixes, processes=2)
    order = [f.item_id for f in alone.load().fields]
    assert len({f.plate for f in alone.load().fields}) == 2
    assert [f.item_id for f in cluster.load().fields] == order


def test_stale_arrays_removed_are_only_those_replaced(tmp_path: Path) -> None:
    old = {"fields/P/a.ome.zarr": {"A"}, "fields/P/b.ome.zarr": {"B"}, "fields/Q/c.ome.zarr": {"C"}}
    new = {"fields/P/a.ome.zarr": {"A"}, "fields/P/b2.ome.zarr": {"B"}}
    stale = stale_arrays(old, new)
    assert stale.superseded == ["fields/P/b.ome.zarr"]  # B stored anew
    assert stale.kept == ["fields/Q/c.ome.zarr"]  # C left out this time: kept for a re-run
    for rel in ("fields/P/b.ome.zarr", "fields/P/a.ome.zarr", "notes/x.ome.zarr"):
        (tmp_path / rel / "0").mkdir(parents=True)
    outside = ["../x", "notes/x.ome.zarr", "fields/P/../../notes/x.ome.zarr", "fields"]
    assert remove_arrays(tmp_path, [*outside, "fields/P/b.ome.zarr"]) == ["fields/P/b.ome.zarr"]
    assert (tmp_path / "fields/P/a.ome.zarr").is_dir() and (tmp_path / "notes/x.ome.zarr").is_dir()


def test_worker_processes_are_capped_at_the_work_and_the_cores() -> None:
    assert capped_workers(64, 2, 2, "--processes", "plate")[0] == 2
    assert capped_workers(64, 2, 16, "--processes", "plate")[0] == 2
    assert capped_workers(8, 100, 4, "--workers", "file")[0] == 4
    assert capped_workers(2, 100, 4, "--workers", "file") == (2, "")  # nothing capped: silent
    assert "64: 2 plate(s) on 2 core(s)" in capped_workers(64, 2, 2, "--processes", "plate")[1]


def test_the_oct_twin_names_the_participants_every_split_needs() -> None:
    from octstage.dataset.synth import fewest_for_every_split, split_sizes, split_warning

    assert split_sizes(16) == {"train": 12, "val": 4, "test": 0}
    n = fewest_for_every_split()
    assert min(split_sizes(n).values()) > 0 and min(split_sizes(n - 1).values()) == 0
    assert split_warning(n) == "" and "no test split" in split_warning(16)


def test_the_folder_backend_refuses_a_fifo_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "a.tiff"
    os.mkfifo(fifo)
    # Without the guard the read waits for a writer: one comes after 5 s and closes at once,
    # so the read ends (empty) and the test fails instead of hanging.
    writer = threading.Timer(5, lambda: os.close(os.open(fifo, os.O_WRONLY)))
    writer.daemon = True
    writer.start()
    try:
        with pytest.raises(StorageError, match=r"a.tiff: not a regular file"):
            LocalStorage(tmp_path).read_bytes("a.tiff")
    finally:
        writer.cancel()
