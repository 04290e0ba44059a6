"""``octstage stage``: a real cache in the GCS double (or B2 double, or a folder) pulled to a
local folder, verified volume by volume, resumable, traversal-proof."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from octstage import manifest as mf
from octstage.cache.verify import run_verify
from octstage.cache.volumestore import check_volume
from octstage.cli import main as cli_main
from octstage.errors import VerificationError
from octstage.stage import run_stage, shard_keys
from tests.doubles.b2_server import B2Double
from tests.doubles.gcs import GcsDouble, client_for
from tests.doubles.s3 import S3Double
from tests.octtrain.tiny_cache import write_tiny_cache


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 real volumes (Zarr, sharded) and their manifest."""
    _manifest, cache = write_tiny_cache(
        tmp_path_factory.mktemp("tiny"), shape=(8, 32, 32), counts={"train": 1, "val": 1}
    )
    return cache


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def upload(server: GcsDouble, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    client: Any = client_for(server)
    for name, data in files.items():
        client.bucket(bucket).blob(f"{prefix}/{name}").upload_from_string(data)


def stage(src: str, dst: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "stage-report.json"
    code = run_stage(src, dst, transfers=4, json_out=out)
    return code, json.loads(out.read_text())


def volumes(dst: Path) -> list[mf.Volume]:
    return list(mf.load(dst / "manifest.json").volumes)


def test_stage_pulls_and_verifies_every_volume(
    cloud_env: dict[str, str],
    gcs_server: GcsDouble,
    gcs_bucket: str,
    tiny_cache: Path,
    tmp_path: Path,
) -> None:
    upload(gcs_server, gcs_bucket, "cache", files_of(tiny_cache))
    dst = tmp_path / "ssd"
    code, report = stage(f"gs://{gcs_bucket}/cache", dst, tmp_path)
    assert code == 0 and report["downloaded"] == report["volumes"] == 8
    assert (dst / "manifest.json").read_bytes() == (tiny_cache / "manifest.json").read_bytes()
    for v in volumes(dst):
        check_volume(dst, v.zarr_path, v.checksum)
    assert run_verify(dst / "manifest.json", cache=None, json_out=False) == 0
    # Only what the manifest names: the volumes and the manifest itself.
    assert {p.split("/")[0] for p in files_of(dst)} == {"manifest.json", "volumes"}


def test_stage_from_b2_lists_nothing(
    cloud_env: dict[str, str], b2: B2Double, tiny_cache: Path, tmp_path: Path
) -> None:
    for name, data in files_of(tiny_cache).items():
        b2.put("src", f"cache/{name}", data)
    b2.put("src", "cache/volumes/unlisted-junk.bin", b"not in the manifest")
    code, report = stage("b2://src/cache", tmp_path / "ssd", tmp_path)
    assert code == 0 and report["downloaded"] == 8
    assert b2.stats.calls["b2_list_file_names"] == 0
    assert not (tmp_path / "ssd" / "volumes" / "unlisted-junk.bin").exists()


def test_stage_from_a_local_folder(tiny_cache: Path, tmp_path: Path) -> None:
    code, report = stage(str(tiny_cache), tmp_path / "ssd", tmp_path)
    assert code == 0 and report["downloaded"] == 8


def test_a_second_stage_skips_verified_volumes_and_repairs_the_rest(
    tiny_cache: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "ssd"
    assert stage(str(tiny_cache), dst, tmp_path)[0] == 0
    vols = volumes(dst)
    shutil.rmtree(dst / vols[0].zarr_path)  # lost
    shard_dir = dst / vols[1].zarr_path / "0" / "c"
    shard = next(p for p in shard_dir.rglob("*") if p.is_file())
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))  # same size, other bytes
    stale = dst / "volumes" / vols[2].participant_id / f".stage-{Path(vols[2].zarr_path).name}-dead"
    stale.mkdir(parents=True)
    code, report = stage(str(tiny_cache), dst, tmp_path)
    assert code == 0 and report["downloaded"] == 2 and report["present"] == 6
    for v in volumes(dst):
        check_volume(dst, v.zarr_path, v.checksum)
    assert not stale.exists()


def test_a_corrupt_remote_volume_fails_and_no_manifest_is_written(
    cloud_env: dict[str, str],
    gcs_server: GcsDouble,
    gcs_bucket: str,
    tiny_cache: Path,
    tmp_path: Path,
) -> None:
    files = files_of(tiny_cache)
    bad = next(n for n in files if "/0/c/" in n)
    broken = dict(files)
    broken[bad] = bytes(b ^ 0x55 for b in files[bad])
    upload(gcs_server, gcs_bucket, "cache", broken)
    dst = tmp_path / "ssd"
    code, report = stage(f"gs://{gcs_bucket}/cache", dst, tmp_path)
    assert code == 1 and report["downloaded"] == 7
    assert [f["volume"] for f in report["failed"]] == [bad.split("/0/c/")[0]]
    assert not (dst / "manifest.json").exists()
    assert not (dst / bad.split("/0/c/")[0]).exists()  # never left half-verified
    upload(gcs_server, gcs_bucket, "cache", {bad: files[bad]})
    code, report = stage(f"gs://{gcs_bucket}/cache", dst, tmp_path)
    assert code == 0 and report["downloaded"] == 1 and report["present"] == 7
    assert (dst / "manifest.json").is_file()


@pytest.mark.parametrize("evil", ["../outside/x.ome.zarr", "/tmp/octstage-abs/x.ome.zarr"])
def test_stage_refuses_a_manifest_that_escapes_the_destination(
    cloud_env: dict[str, str],
    gcs_server: GcsDouble,
    gcs_bucket: str,
    tiny_cache: Path,
    tmp_path: Path,
    evil: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = files_of(tiny_cache)
    doc = json.loads(files["manifest.json"])
    victim = doc["volumes"][0]["zarr_path"]
    doc["volumes"][0]["zarr_path"] = evil
    files["manifest.json"] = json.dumps(doc).encode()
    # Make the attack "work" for a naive stager: real volume files where the name points.
    planted = {
        f"x.ome.zarr/{name[len(victim) + 1 :]}": data
        for name, data in files.items()
        if name.startswith(victim + "/")
    }
    upload(gcs_server, gcs_bucket, "cache", files)
    upload(gcs_server, gcs_bucket, "outside", planted)
    work = tmp_path / "work"
    dst = work / "ssd"
    code = cli_main(["stage", f"gs://{gcs_bucket}/cache", str(dst)])
    assert code == 2
    assert "unsafe object name" in capsys.readouterr().err
    assert not (work / "outside").exists() and not Path("/tmp/octstage-abs").exists()
    assert not (dst / "manifest.json").exists()
    assert not dst.exists() or files_of(dst) == {}


@pytest.mark.parametrize(
    ("encoding", "chunks", "shards"),
    [
        ({"name": "default", "separator": "/"}, (10, 40, 25), None),
        ({"name": "default", "separator": "."}, (5, 20, 25), (10, 40, 25)),
        ({"name": "v2", "separator": "."}, (10, 40, 25), None),
        ({"name": "default", "separator": "/"}, (32, 64, 64), None),
    ],
)
def test_shard_keys_name_exactly_the_objects_zarr_writes(
    tmp_path: Path,
    encoding: dict[str, str],
    chunks: tuple[int, int, int],
    shards: tuple[int, int, int] | None,
) -> None:
    """Whatever the chunk key encoding and sharding, the keys are the files zarr wrote."""
    import numpy as np
    import zarr

    folder = tmp_path / "a"
    array = zarr.create_array(
        store=str(folder),
        shape=(20, 40, 50),
        dtype="uint8",
        chunks=chunks,
        shards=shards,
        chunk_key_encoding=encoding,  # type: ignore[arg-type]
    )
    array[:] = np.arange(20 * 40 * 50, dtype=np.uint32).reshape(20, 40, 50) % 251 + 1
    written = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert sorted(shard_keys(folder)) == sorted(written - {"zarr.json"})


def test_shard_keys_refuse_huge_grids_and_unreadable_metadata(tmp_path: Path) -> None:
    import zarr

    zarr.create_array(store=str(tmp_path / "huge"), shape=(100, 100, 100), dtype="uint8",
                      chunks=(1, 1, 1))  # fmt: skip
    with pytest.raises(VerificationError, match="refusing"):
        shard_keys(tmp_path / "huge")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array"}')
    with pytest.raises(VerificationError, match="unreadable"):
        shard_keys(tmp_path / "bad")


@pytest.mark.parametrize(
    "bad", ["volumes/1001/x.zarr", "volumes/1001/sub/x.ome.zarr", "cache/1001/x.ome.zarr"]
)
def test_stage_refuses_a_zarr_path_the_schema_refuses_before_fetching_anything(
    tiny_cache: Path, tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Safe names, but not what the schema allows: the whole manifest is refused, and the
    volumes listed before the bad one are not fetched either."""
    src = tmp_path / "src"
    shutil.copytree(tiny_cache, src)
    doc = json.loads((src / "manifest.json").read_text())
    last = len(doc["volumes"]) - 1
    doc["volumes"][last]["zarr_path"] = bad
    (src / "manifest.json").write_text(json.dumps(doc))
    dst = tmp_path / "ssd"
    assert cli_main(["stage", str(src), str(dst)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"volumes[{last}].zarr_path" in err and bad in err and "manifest.json" in err
    assert not dst.exists() or files_of(dst) == {}


def test_stage_from_s3_then_verify(
    cloud_env: dict[str, str], s3_server: S3Double, s3_bucket: str, tiny_cache: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A cache built locally, uploaded to the S3 double (boto3), staged through s3fs."""
    client = s3_server.client()
    for name, data in files_of(tiny_cache).items():
        client.put_object(Bucket=s3_bucket, Key=f"cache/{name}", Body=data)
    client.put_object(Bucket=s3_bucket, Key="cache/volumes/unlisted.bin", Body=b"junk")
    dst = tmp_path / "ssd"
    report = tmp_path / "stage.json"
    assert cli_main(["stage", f"s3://{s3_bucket}/cache", str(dst), "--json", str(report)]) == 0
    assert json.loads(report.read_text())["downloaded"] == 8
    assert files_of(dst) == files_of(tiny_cache)  # the manifest's volumes, nothing unlisted
    assert cli_main(["verify", str(dst / "manifest.json")]) == 0


def test_b2_to_gcs_to_build_cache_to_stage_end_to_end(
    cloud_env: dict[str, str], b2: B2Double, gcs_bucket: str, tmp_path: Path
) -> None:
    """The demo path: a synthetic dataset uploaded to B2 (b2sdk), mirrored into GCS, the cache
    built from ``gs://`` (streamed reads, SHA1s checked against the mirror's inventory), the
    cache mirrored to GCS, staged to a local folder and verified there."""
    import hashlib

    from octstage.cachebuild.run import run_build
    from octstage.config import BuildConfig
    from octstage.dataset.synth import generate
    from octstage.mirror.run import run_mirror
    from tests.doubles.b2_upload import upload_folder

    synth = generate(tmp_path / "synth", participants=3, traps=False).root
    assert upload_folder(synth, "b2://src/v3") > 0
    assert run_mirror("b2:src/v3", f"gs://{gcs_bucket}/aireadi", transfers=4, checkers=8) == 0
    cache = tmp_path / "cache"
    summary = tmp_path / "build.json"
    run_build(
        source=f"gs://{gcs_bucket}/aireadi",
        labels=synth / "participants.tsv",
        out=cache,
        manifest=cache / "manifest.json",
        config=BuildConfig(shape=(8, 32, 32), chunks=(8, 32, 32)),
        workers=1,
        json_out=summary,
    )
    built = mf.load(cache / "manifest.json")
    assert len(built.volumes) >= 3
    assert json.loads(summary.read_text())["unverified"] == 0  # every SHA1 from the inventory
    for v in built.volumes:
        assert v.source_sha1 == hashlib.sha1((synth / v.source_path).read_bytes()).hexdigest()
    assert run_mirror(str(cache), f"gs://{gcs_bucket}/cache", transfers=4, checkers=8) == 0
    staged = tmp_path / "ssd"
    code, report = stage(f"gs://{gcs_bucket}/cache", staged, tmp_path)
    assert code == 0 and report["downloaded"] == len(built.volumes)
    assert run_verify(staged / "manifest.json", cache=None, json_out=False) == 0


def _change_one_voxel(cache: Path, volume: mf.Volume) -> None:
    """Rewrite one voxel through zarr: the shard still decodes, its values differ."""
    import numpy as np
    import zarr

    arr = zarr.open_array(store=str(cache / volume.array_path), mode="r+")
    arr[1, 2, 3] = (int(np.asarray(arr[1, 2, 3])) + 1) % 256


def test_a_changed_but_decodable_volume_is_caught_at_the_source_and_on_the_ssd(
    tiny_cache: Path, tmp_path: Path
) -> None:
    src = Path(shutil.copytree(tiny_cache, tmp_path / "src"))
    bad = volumes(src)[2]
    _change_one_voxel(src, bad)
    dst = tmp_path / "ssd"
    code, report = stage(str(src), dst, tmp_path)
    assert code == 1 and [f["volume"] for f in report["failed"]] == [bad.zarr_path]
    assert "checksum" in report["failed"][0]["reason"]
    assert not (dst / "manifest.json").exists() and not (dst / bad.zarr_path).exists()
    # A staged volume changed on the SSD the same way is fetched again, not kept as present.
    code, report = stage(str(tiny_cache), dst, tmp_path)
    assert code == 0
    _change_one_voxel(dst, bad)
    assert run_verify(dst / "manifest.json") == 1
    code, report = stage(str(tiny_cache), dst, tmp_path)
    assert code == 0 and report["downloaded"] == 1 and report["present"] == 7
    assert run_verify(dst / "manifest.json") == 0


def columnar_copy(cache: Path, dst: Path) -> Path:
    """A copy of ``cache`` whose manifest is the columnar form (header and item table)."""
    shutil.copytree(cache, dst)
    mf.write(mf.load(dst / "manifest.json"), dst / "manifest.json", form="table")
    return dst


def test_stage_copies_a_columnar_manifest_table_before_its_header(
    tiny_cache: Path, tmp_path: Path
) -> None:
    src = columnar_copy(tiny_cache, tmp_path / "src")
    code, report = stage(str(src), tmp_path / "ssd", tmp_path)
    assert code == 0 and report["downloaded"] == 8
    staged = tmp_path / "ssd"
    assert (staged / "manifest.items.parquet").read_bytes() == (
        src / "manifest.items.parquet"
    ).read_bytes()
    assert mf.load(staged / "manifest.json") == mf.load(tiny_cache / "manifest.json")
    assert run_verify(staged / "manifest.json") == 0


def test_stage_refuses_an_item_table_of_another_build(tiny_cache: Path, tmp_path: Path) -> None:
    src = columnar_copy(tiny_cache, tmp_path / "src")
    header = json.loads((src / "manifest.json").read_text())
    header["table"]["sha256"] = "0" * 64
    (src / "manifest.json").write_text(json.dumps(header))
    with pytest.raises(mf.ManifestError, match=r"SHA-256 .* the header says 0000"):
        run_stage(str(src), tmp_path / "ssd", transfers=2)
    assert not (tmp_path / "ssd").exists()


def test_a_stage_stopped_between_the_table_and_the_header_resumes(
    tiny_cache: Path, tmp_path: Path
) -> None:
    src = columnar_copy(tiny_cache, tmp_path / "src")
    assert stage(str(src), tmp_path / "ssd", tmp_path)[0] == 0
    (tmp_path / "ssd" / "manifest.json").unlink()  # killed after the table, before the header
    code, report = stage(str(src), tmp_path / "ssd", tmp_path)
    assert code == 0 and report["present"] == 8 and report["manifest_written"]


@pytest.mark.parametrize("form", ["json", "table"])
def test_an_array_listed_two_ways_is_refused_before_any_fetch(tmp_path: Path, form: str) -> None:
    """``volume_paths`` (an item table read a row group at a time) still sees every row: one
    folder listed twice with different checksums, or both as one field and as a pack."""
    from dataclasses import replace

    from octstage.stage import volume_paths
    from tests.octstage.test_manifest_cellpainting import make_cp_manifest, make_field

    a, b = make_field(), make_field(well="B02", site=2)
    pack = "packs/P1/x.pack.zarr"
    cases = {
        "listed twice with different checksums": (
            a,
            replace(b, zarr_path=a.zarr_path, checksum="sha256:" + "2" * 64),
        ),
        "listed both as one field and as a pack": (
            replace(a, zarr_path=pack, pack_index=0),
            replace(b, zarr_path=pack),
        ),
    }
    for n, (message, fields) in enumerate(cases.items()):
        path = tmp_path / str(n) / "manifest.json"
        path.parent.mkdir()
        mf.write(make_cp_manifest(fields), path, form)
        with pytest.raises((VerificationError, mf.ManifestError), match=message):
            volume_paths(mf.load(path), "m")
    fields = (replace(a, zarr_path=pack, pack_index=0), replace(b, zarr_path=pack, pack_index=1))
    path = tmp_path / "ok" / "manifest.json"
    path.parent.mkdir()
    mf.write(make_cp_manifest(fields), path, form)
    assert {k: list(v) for k, v in volume_paths(mf.load(path), "m").items()} == {pack: [0, 1]}
