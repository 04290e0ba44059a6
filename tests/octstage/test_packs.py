"""Packed Cell Painting caches (``build-cache --pack K``): K fields in one Zarr array of two
objects, each field addressed by its pack and place; built from the S3 double into a folder and
into a bucket, kept on a re-run, staged, verified, read by the trainer, and damage found."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr

from octstage import manifest as mf
from octstage.cache.store import CacheStore
from octstage.cache.verify import Listed, check_packed, validate_schema, verify
from octstage.cellpainting import packread, packstore
from octstage.cellpainting.build import build
from octstage.cellpainting.fieldwriter import PackWriter
from octstage.cellpainting.synth import TwinInfo
from octstage.errors import VerificationError
from octstage.manifest.tablechecks import suspect_rows
from octstage.stage import run_stage
from octstage.storage import open_storage
from octtrain.data.arrayread import open_item
from octtrain.data.cellpainting import CellPaintingDataset
from octtrain.errors import DataError
from tests.doubles.s3 import S3Double
from tests.octstage.chunk_damage import flip_decodable
from tests.octstage.test_cellpainting import FlakyStorage, _rows


def _objects(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())


def _fields(rng: np.random.Generator, shapes: list[tuple[int, int, int]]) -> list[np.ndarray]:
    out = [rng.integers(0, 256, s, dtype=np.uint8) for s in shapes]
    out[-1][:, 64:, :] = 0  # whole chunks of fill value: zarr stores none of them
    return out


def test_packs_are_balanced_and_cover_every_field_once() -> None:
    assert packstore.plan_packs(72, 64) == [range(0, 36), range(36, 72)]
    assert packstore.plan_packs(64, 64) == [range(0, 64)]
    assert packstore.plan_packs(0, 64) == []
    plan = packstore.plan_packs(1001, 64)
    assert [i for r in plan for i in r] == list(range(1001)) and max(map(len, plan)) <= 64


def test_a_pack_of_fields_of_different_sizes_reads_each_field_back(tmp_path: Path) -> None:
    """Written in any order, padded to the largest field; zarr and the trainer's reader give
    each field back, and the trainer reads a crop's chunks and its own part of the index."""
    cache = CacheStore(str(tmp_path))
    fields = _fields(np.random.default_rng(0), [(5, 130, 100), (5, 100, 140), (5, 128, 128)])
    writer = PackWriter(cache, "P1", 64, 3, 8)
    keys = ["k0", "k1", "k2"]
    writer.plan(keys)
    records = {
        k: writer.write(k, f"id{k}", fields[i], "ABCDE")
        for i, k in [(2, "k2"), (0, "k0"), (1, "k1")]
    }
    writer.close()
    rel = records["k0"].zarr_path
    assert rel.startswith("packs/P1/") and rel.endswith(".pack.zarr")
    assert _objects(tmp_path) == 2  # zarr.json and one shard, for three fields
    pack = zarr.open_array(str(tmp_path / rel / "0"), mode="r")
    assert pack.shape == (3, 5, 130, 140)
    for k, field in zip(keys, fields, strict=True):
        r = records[k]
        assert r.shape == field.shape and r.zarr_path == rel
        _, y, x = field.shape
        assert (np.asarray(pack[r.pack_index, :, :y, :x]) == field).all()
        item = open_item(tmp_path / rel / "0", f"field {k}", int(r.pack_index or 0), field.shape)
        assert (item.read() == field).all()
        got = packread.fields(tmp_path / rel / "0", [(int(r.pack_index or 0), r.shape)])
        (direct,) = got or [None]  # verify's read, tiles and all
        assert direct is not None and (direct == field).all()
        assert (
            item.read((slice(None), slice(3, 70), slice(60, 90))) == field[:, 3:70, 60:90]
        ).all()
    # A crop of one chunk of the last field: that chunk (random bytes: stored as they are,
    # with blosc's header and the crc) and its field's part of the index (3 x 3 entries of 16
    # bytes), not the pack's whole index (27 entries and its crc: 292 bytes more).
    item = open_item(tmp_path / rel / "0", "f", 2, fields[2].shape)
    item.read((slice(None), slice(0, 10), slice(0, 10)))
    assert item.array.bytes_read == 3 * 3 * 16 + 5 * 64 * 64 + 16 + 4
    # The members' records are in the pack's attributes: a re-run keeps it without its data.
    again = PackWriter(cache, "P1", 64, 3, 8)
    again.plan(keys)
    assert {k: again.stored(k) for k in keys} == records


def test_members_swapped_in_a_pack_with_valid_crc32c_are_a_checksum_mismatch(
    tmp_path: Path,
) -> None:
    """Every chunk's crc32c holds (the pack is whole), but the manifest's rows name each
    member's place the other way round (another build's pack, members swapped): each member's
    values are checked against its manifest checksum, so stage and verify name the change."""
    cache = CacheStore(str(tmp_path))
    fields = _fields(np.random.default_rng(3), [(5, 64, 64), (5, 64, 64)])
    writer = PackWriter(cache, "P1", 64, 2, 8)
    writer.plan(["a", "b"])
    a, b = (writer.write(k, k, f, "ABCDE") for k, f in zip("ab", fields, strict=True))
    writer.close()
    members = [(int(r.pack_index or 0), tuple(r.shape), r.checksum) for r in (a, b)]
    packstore.check_pack(tmp_path, a.zarr_path, members)  # as written: whole
    swapped = [(m[0], m[1], other[2]) for m, other in zip(members, members[::-1], strict=True)]
    with pytest.raises(
        VerificationError, match=rf"{a.zarr_path}: field {members[0][0]}: checksum .* != manifest"
    ):
        packstore.check_pack(tmp_path, a.zarr_path, swapped)


def test_a_field_outside_its_pack_is_a_data_error_naming_it(tmp_path: Path) -> None:
    cache = CacheStore(str(tmp_path))
    writer = PackWriter(cache, "P1", 64, 3, 8)
    writer.plan(["a", "b"])
    field = np.ones((5, 70, 70), np.uint8)
    rel = writer.write("a", "a", field, "ABCDE").zarr_path
    writer.write("b", "b", field, "ABCDE")
    with pytest.raises(DataError, match=r"field P1/A01/1: .*field 2 of shape \[5, 70, 70\]"):
        open_item(tmp_path / rel / "0", "field P1/A01/1", 2, (5, 70, 70))
    with pytest.raises(DataError, match=r"field 1 of shape \[5, 80, 70\] is not in a pack"):
        open_item(tmp_path / rel / "0", "x", 1, (5, 80, 70))


def test_an_incomplete_pack_leaves_nothing_behind(tmp_path: Path) -> None:
    cache = CacheStore(str(tmp_path))
    writer = PackWriter(cache, "P1", 64, 3, 8)
    writer.plan(["a", "b"])
    writer.write("a", "a", np.ones((5, 64, 64), np.uint8), "ABCDE")
    assert _objects(tmp_path) == 1  # the spooled shard, in a hidden folder
    writer.close()  # "b" never came (the plate is left out): no pack, no temporary
    assert _objects(tmp_path) == 0
    assert writer.stored("a") is None


def _build(s3_twin: str, twin: tuple[Path, TwinInfo], out: str, **kw: object) -> mf.Manifest:
    root, info = twin
    _, built = build(s3_twin, out, metadata=str(root.parent / info.metadata), **kw)  # type: ignore[arg-type]
    if built.path is None:  # written into the bucket only: read it from there
        local = Path(tempfile.mkdtemp()) / "manifest.json"
        local.write_bytes(open_storage(out).read_bytes("manifest.json"))
        return mf.load(local)
    return built.load()


def test_a_packed_cache_builds_verifies_stages_and_trains(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path, s3_server: S3Double
) -> None:
    _, info = twin
    cache = tmp_path / "cache"
    m = _build(s3_twin, twin, str(cache), pack=4, manifest_form="table")
    n = len(m.fields)
    assert n == info.fields - 1
    assert all(f.pack_index is not None and f.zarr_path.startswith("packs/") for f in m.fields)
    packs = {f.zarr_path for f in m.fields}
    assert len(packs) == sum(
        -(-len([f for f in m.fields if f.plate == p]) // 4) for p in info.plates
    )
    assert len(packs) > len(info.plates)  # a plate in more than one pack
    assert _objects(cache / "packs") == 2 * len(packs)
    assert mf.check(m, "cellpainting") == []
    # Counted in Arrow, a packed field is no suspect of the per-row rules (a million would be).
    table = mf.load(cache / "manifest.json").fields
    assert isinstance(table, mf.ItemTable)
    assert list(suspect_rows(table, "cellpainting", m.classes)) == []
    report = verify(cache / "manifest.json")
    assert report.ok and report.verified == n and report.schema == "valid", report
    # The same values as the per-field form of the same build.
    alone = _build(s3_twin, twin, str(tmp_path / "alone"))
    by_id = {f.item_id: f for f in alone.fields}
    assert all(by_id[f.item_id].checksum == f.checksum for f in m.fields)
    assert all(by_id[f.item_id].intensity == f.intensity for f in m.fields)
    # A re-run keeps every pack (their attributes, not their data).
    root, info = twin
    report2, built2 = build(
        s3_twin,
        str(cache),
        metadata=str(root.parent / info.metadata),
        pack=4,
        manifest_form="table",
    )
    m2 = built2.load()
    assert report2.kept == n and report2.written == 0
    assert [f.checksum for f in m2.fields] == [f.checksum for f in m.fields]
    # Staged from a bucket copy: one fetch per pack object, each member checked.
    bucket = s3_twin.split("/")[2]
    client = s3_server.client()
    for path in sorted(p for p in cache.rglob("*") if p.is_file()):
        client.put_object(
            Bucket=bucket, Key=f"packed/{path.relative_to(cache)}", Body=path.read_bytes()
        )
    staged = tmp_path / "staged"
    json_out = tmp_path / "stage.json"
    assert run_stage(f"s3://{bucket}/packed", staged, json_out=json_out) == 0
    assert json.loads(json_out.read_text())["downloaded"] == len(packs)
    assert mf.load(staged / "manifest.json") == mf.load(cache / "manifest.json")
    assert verify(staged / "manifest.json").ok
    # The trainer reads a packed field's crops from the staged copy.
    from octtrain.config.dino import CropConfig

    crops = CropConfig(global_size=32, local_size=16, n_local=2)
    loaded = mf.load(staged / "manifest.json")
    data = CellPaintingDataset(loaded.fields, staged, crops, patch=8)
    item = data[(3, 7)]
    assert item["global"].shape == (2, 5, 32, 32)
    whole = data.open(3).read()
    stored = zarr.open_array(str(staged / loaded.fields[3].array_path), mode="r")
    assert (whole == np.asarray(stored[loaded.fields[3].pack_index])).all()


def test_build_into_a_bucket_writes_packs_that_stage(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    bucket = s3_twin.split("/")[2]
    out = f"s3://{bucket}/packed-direct"
    m = _build(s3_twin, twin, out, pack=16)
    names = [o.name for o in open_storage(out).list("packs/")]
    packs = {f.zarr_path for f in m.fields}
    assert len(names) == 2 * len(packs)
    assert all(n.endswith(("/0/zarr.json", "/0/c/0/0/0/0")) for n in names)
    assert run_stage(out, tmp_path / "staged") == 0
    assert verify(tmp_path / "staged" / "manifest.json").ok


def test_damage_to_a_pack_is_found_and_named(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    m = _build(s3_twin, twin, str(cache), pack=8)
    f = m.fields[0]
    array_dir = cache / f.array_path
    flip_decodable(array_dir)  # the first stored chunk: one member's
    report = verify(cache / "manifest.json")
    changed = [c for c in report.changed if c["zarr_path"] == f.zarr_path]
    assert len(changed) == 1 and "crc32c" in changed[0]["why"], report.changed
    assert report.verified == len(m.fields) - 1
    # stage says it in the same words (zarr's own text names two byte strings, not the cause)
    out = tmp_path / "stage.json"
    assert run_stage(str(cache), tmp_path / "staged", json_out=out) == 1
    (failed,) = json.loads(out.read_text())["failed"]
    assert "fails its crc32c checksum (its bytes changed" in failed["reason"], failed
    crops = _crops()
    data = CellPaintingDataset(m.fields, cache, crops, patch=8)
    bad = next(
        i
        for i, g in enumerate(m.fields)
        if g.zarr_path == f.zarr_path and f"field {g.pack_index} " in changed[0]["why"]
    )
    with pytest.raises(
        DataError, match=rf"field {f.zarr_path} \[{m.fields[bad].pack_index}\].*crc32c"
    ):
        data.open(bad).read()
    # The shard gone: every member is missing (zarr alone would read zeros).
    (array_dir / packstore.SHARD_KEY).unlink()
    report = verify(cache / "manifest.json")
    members = [g for g in m.fields if g.zarr_path == f.zarr_path]
    assert report.missing.count(f.zarr_path) == len(members)
    assert "data object 0/c/0/0/0/0 gone" in report.missing_why[f.zarr_path]
    with pytest.raises(
        DataError,
        match=rf"field {f.zarr_path} \[{members[0].pack_index}\].*data object c/0/0/0/0 is missing",
    ):
        data.open(m.fields.index(members[0])).read()


def _crops():  # type: ignore[no-untyped-def]
    from octtrain.config.dino import CropConfig

    return CropConfig(global_size=32, local_size=16, n_local=2)


class FailSecondRead(FlakyStorage):
    """Reads of ``name`` succeed once (pass 1), then fail (pass 2): a pack left incomplete."""

    def read_bytes(self, name: str) -> bytes:
        if name == self.name:
            self.calls += 1
            if self.calls > 1:
                raise self.inner.fail(name, OSError("connection reset"))  # type: ignore[attr-defined]
        return self.inner.read_bytes(name)


def test_a_pack_left_incomplete_by_an_environment_fault_is_written_by_the_next_run(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    root, info = twin
    meta = str(root.parent / info.metadata)
    first = _rows(s3_twin)[0]
    flaky = FailSecondRead(open_storage(s3_twin), first.images[1][1], times=0)
    cache = tmp_path / "cache"
    report, _ = build(flaky, str(cache), metadata=meta, pack=8, retries=0)
    assert report.plates_left_out == [first.plate]
    assert not list((cache / "packs").glob(f"{first.plate}/.tmp-*"))  # no spool left behind
    report2, built2 = build(open_storage(s3_twin), str(cache), metadata=meta, pack=8)
    m2 = built2.load()
    assert not report2.environment and len(m2.fields) == info.fields - 1
    assert verify(cache / "manifest.json").ok


def test_the_schema_ties_a_pack_path_to_its_index() -> None:
    schema = json.loads(mf.SCHEMA_PATH.read_text())
    item = {"$defs": schema["$defs"], "$ref": "#/$defs/field"}
    row = {
        "item_id": "s/P/A01/1", "split": "train", "label": None, "zarr_path": "packs/P/k.pack.zarr",
        "shape": [5, 8, 8], "dtype": "uint8", "checksum": "sha256:" + "0" * 64, "cache_key": "k",
        "sources": [{"channel": "DNA", "path": "a.tif", "sha1": "0" * 40, "size": 1}],
        "source": "s", "batch": "b", "plate": "P", "well": "A01", "site": 1, "channels": ["DNA"],
        "perturbation": "", "perturbation_type": "", "is_control": False,
        "normalization": [{"p_low": 0.1, "p_high": 99.9, "low": 0.0, "high": 1.0}],
    }  # fmt: skip
    assert validate_schema({**row, "pack_index": 3}, _write(item))[0] == "valid"
    status, errors = validate_schema(row, _write(item))
    assert status == "invalid" and "'pack_index' is a required property" in errors[0]
    alone = {**row, "zarr_path": "fields/P/k.ome.zarr"}
    assert validate_schema(alone, _write(item))[0] == "valid"
    assert validate_schema({**alone, "pack_index": 0}, _write(item))[0] == "invalid"


def _write(schema: Mapping[str, object]) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "schema.json"
    path.write_text(json.dumps(schema))
    return path


def test_a_table_written_before_packs_still_loads(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    """An item table without the ``pack_index`` column (octstage before packs) loads, checks
    and feeds the trainer: every field is its own array."""
    cache = tmp_path / "cache"
    _build(s3_twin, twin, str(cache), manifest_form="table")
    table_path = cache / "manifest.items.parquet"
    table = pq.read_table(table_path)
    old = table.drop_columns(["pack_index"])
    pq.write_table(old, table_path, compression="zstd")
    header = json.loads((cache / "manifest.json").read_text())
    header["table"].update(bytes=table_path.stat().st_size, sha256=mf.file_sha256(table_path))
    (cache / "manifest.json").write_text(json.dumps(header))
    m = mf.load(cache / "manifest.json")
    assert all(f.pack_index is None for f in m.fields)
    assert m.fields.common().pack_index is None
    assert verify(cache / "manifest.json").ok
    data = CellPaintingDataset(m.fields, cache, _crops(), patch=8)
    assert data[(0, 1)]["global"].shape == (2, 5, 32, 32)


def test_two_fields_at_one_place_of_a_pack_are_a_duplicate(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    m = _build(s3_twin, twin, str(tmp_path / "cache"), pack=8)
    assert mf.check(m) == []
    first = m.fields[0]
    assert m.fields[1].zarr_path == first.zarr_path  # the same pack, another place
    # Field 1 now names field 0's place: it would read field 0's values.
    fields = (first, replace(m.fields[1], pack_index=first.pack_index), *m.fields[2:])
    edited = mf.Manifest(m.header, m.classes, (), m.rejected, kind="cellpainting", fields=fields)
    for form in ("json", "table"):
        path = tmp_path / form / "manifest.json"
        path.parent.mkdir()
        mf.write(edited, path, form)
        found = [f.message for f in mf.check(mf.load(path))]
        assert found == [
            f"fields[1]: zarr_path {first.zarr_path!r} pack_index {first.pack_index} already "
            "listed at fields[0]"
        ], (form, found)


def test_two_fields_of_one_cache_key_are_one_member(tmp_path: Path) -> None:
    """The same source bytes twice (one cache key): stored once, both fields its record, as the
    per-field form stores them in one group (the manifest's check reports the duplicate)."""
    writer = PackWriter(CacheStore(str(tmp_path)), "P1", 64, 3, 8)
    writer.plan(["a", "a", "b"])
    field = np.full((5, 64, 64), 7, np.uint8)
    first = writer.write("a", "x", field, "ABCDE")
    assert writer.write("a", "y", field, "ABCDE") == first
    writer.write("b", "z", field, "ABCDE")
    writer.close()
    pack = zarr.open_array(str(tmp_path / first.zarr_path / "0"), mode="r")
    assert pack.shape == (2, 5, 64, 64)


def _pack_of(tmp_path: Path, n: int) -> tuple[str, list[packstore.Member], list[np.ndarray]]:
    fields = _fields(np.random.default_rng(1), [(5, 70, 60)] * n)
    writer = PackWriter(CacheStore(str(tmp_path)), "P1", 64, 3, n)
    writer.plan([f"k{i}" for i in range(n)])
    records = [writer.write(f"k{i}", f"k{i}", f, "ABCDE") for i, f in enumerate(fields)]
    writer.close()
    members = [(int(r.pack_index or 0), tuple(r.shape), r.checksum) for r in records]
    return records[0].zarr_path, members, fields


def test_a_healthy_pack_is_checked_a_run_of_members_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zarr read costs ~1.7 ms whatever its size: a million small fields read one by one
    take half an hour to stage or verify. An intact pack is read in runs, never a member."""
    rel, members, _ = _pack_of(tmp_path, 6)

    def one_by_one(*_: object) -> np.ndarray:
        raise AssertionError("a member read alone")

    monkeypatch.setattr(packstore, "read_member", one_by_one)
    packstore.check_pack(tmp_path, rel, members[::-1])  # any order: runs follow the places


def test_verify_reads_a_packs_members_from_its_shard_and_leaves_damage_to_zarr(
    tmp_path: Path,
) -> None:
    """zarr reads a shard's tiles at ~0.5 ms each: verify reads a healthy pack's members from the
    shard itself (``packread``), never through zarr; a member whose tile fails its crc32c is
    read through zarr alone, which words the damage, and the others still verify."""
    rel, members, fields = _pack_of(tmp_path, 4)
    items = [Listed(rel, shape, "uint8", checksum, i) for i, shape, checksum in members]

    def no_zarr(_: str) -> zarr.Array:  # type: ignore[type-arg]
        raise AssertionError("a healthy pack opened through zarr")

    assert check_packed(tmp_path, items, no_zarr) == [None] * 4
    direct = packread.fields(tmp_path / rel / "0", [(i, shape) for i, shape, _ in members])
    assert direct is not None
    assert all((v == fields[m[0]]).all() for m, v in zip(members, direct, strict=True))
    flip_decodable(tmp_path / rel / "0")
    opened = []

    def opener(relpath: str) -> zarr.Array:  # type: ignore[type-arg]
        opened.append(relpath)
        return packstore.open_pack(tmp_path, relpath)

    found = [f for f in check_packed(tmp_path, items, opener) if f is not None]
    assert opened == [rel] and len(found) == 1, found
    assert found[0][0] == "changed" and "crc32c" in found[0][1], found


def test_member_values_in_runs_give_each_member_its_own_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs end at a gap in the places and at READ_BYTES; a member without a place is its own
    error and the others still read."""
    rel, members, fields = _pack_of(tmp_path, 7)
    pack = packstore.open_pack(tmp_path, rel)
    monkeypatch.setattr(packstore, "READ_BYTES", 2 * 5 * 70 * 60)  # two members a read
    asked = [members[6], members[0], members[1], members[2], members[4], (9, (5, 70, 60), "x")]
    got = dict(packstore.member_values(pack, rel, asked))
    assert sorted(got) == list(range(len(asked)))
    for n, member in enumerate(asked[:-1]):
        assert (got[n] == fields[member[0]]).all()
    assert isinstance(got[5], VerificationError) and "no field 9" in str(got[5])
    assert packstore._runs(asked[:-1], 5 * 70 * 60) == [[1, 2], [3], [4], [0]]
