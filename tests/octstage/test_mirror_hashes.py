"""mirror --hash-missing: SHA1s the source does not list (B2 large files without one, every S3
object), hashed once at the source, recorded, reused while the object is unchanged."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from octstage.mirror.inventory import INVENTORY_NAME
from octstage.mirror.source_hashes import hash_at_source
from octstage.storage import open_storage
from tests.doubles.b2_server import B2Double
from tests.doubles.gcs import GcsDouble
from tests.octstage.mirror_helpers import assert_mirrored, cli_process, gcs_objects, mirror, seed


def test_hash_missing_hashes_unverifiable_objects_once_at_the_source(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    """A large file uploaded without large_file_sha1: exit 1 forever without --hash-missing;
    with it, hashed once at the source, recorded, verified; reused while unchanged; hashed
    again once rewritten."""
    files = seed(b2)
    name = "retinal_oct/nosha.dcm"
    files[name] = os.urandom(5000)
    b2.put("src", f"v3/{name}", files[name], sha1=False)
    assert mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")[0] == 1

    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", hash_missing=True)
    assert code == 0 and report["unverified"] == [] and report["failed"] == []
    assert (report["hashed_at_source"], report["hashed_at_source_bytes"]) == (1, 5000)
    assert_mirrored(gcs_server, gcs_bucket, files)  # source-sha1 recorded on the copy too
    blobs = gcs_objects(gcs_server, gcs_bucket, "m")
    entries = {
        o["name"]: o for o in json.loads(blobs[INVENTORY_NAME].download_as_bytes())["objects"]
    }
    assert entries[name]["sha1"] == hashlib.sha1(files[name]).hexdigest()
    assert entries[name]["sha1_from"] == "hashed" and entries[name]["version"]
    assert {e["sha1_from"] for n, e in entries.items() if n != name} == {"listed"}

    # Unchanged: the recorded hash holds (flag or not), nothing read or copied.
    for flag in (True, False):
        code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", hash_missing=flag)
        assert code == 0 and report["hashed_at_source"] == 0 and report["hash_reused"] == 1
        assert report["copied_bytes"] == 0

    # Rewritten (same size, new version): the old hash is not trusted.
    files[name] = os.urandom(5000)
    b2.put("src", f"v3/{name}", files[name], sha1=False)
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert code == 1 and report["unverified"] == [name] and report["hash_reused"] == 0
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", hash_missing=True)
    assert code == 0 and report["hashed_at_source"] == 1
    assert_mirrored(gcs_server, gcs_bucket, files)


def test_a_bad_read_while_hashing_at_the_source_is_not_kept(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    """The hashing read is checked against nothing: if no copy matches its hash, the hash is
    dropped from the inventory, so the next run hashes again instead of failing forever."""
    files = seed(b2)
    name = "retinal_oct/nosha.dcm"
    files[name] = os.urandom(5000)
    b2.put("src", f"v3/{name}", files[name], sha1=False)
    b2.corrupt_downloads(f"v3/{name}")  # the first read (the hashing one) has a byte flipped
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", hash_missing=True)
    assert code == 1 and [(f["name"], f["status"]) for f in report["failed"]] == [(name, "corrupt")]
    assert report["hashes_dropped"] == [name]
    blobs = gcs_objects(gcs_server, gcs_bucket, "m")
    entries = {
        o["name"]: o for o in json.loads(blobs[INVENTORY_NAME].download_as_bytes())["objects"]
    }
    assert entries[name]["sha1"] is None and entries[name]["sha1_from"] == "listed"

    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", hash_missing=True)
    assert code == 0 and report["hashed_at_source"] == 1 and report["hash_reused"] == 0
    assert report["failed"] == [] and report["hashes_dropped"] == []
    assert_mirrored(gcs_server, gcs_bucket, files)


def test_an_object_rewritten_between_listing_and_hashing_is_not_hashed(
    cloud_env: dict[str, str], b2: B2Double, tmp_path: Path
) -> None:
    """The hashing read opens the newest version by name: if it is not the listed size, the
    hash belongs to another version and must not be recorded under the listed one."""
    b2.put("src", "v3/nosha.dcm", os.urandom(5000), sha1=False)
    b2.put("src", "v3/other.dcm", os.urandom(3000), sha1=False)
    storage = open_storage("b2://src/v3")
    listing = [o for o in storage.list() if not o.sha1]
    assert sorted((o.name, o.size) for o in listing) == [("nosha.dcm", 5000), ("other.dcm", 3000)]
    b2.put("src", "v3/nosha.dcm", os.urandom(6000), sha1=False)  # rewritten after the listing
    found, read = hash_at_source(storage, listing, Console(stderr=True), 4, 3600)
    assert set(found) == {"other.dcm"} and read == 3000 + 6000


def test_hash_missing_dry_run_hashes_and_writes_nothing(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    seed(b2)
    name = "retinal_oct/nosha.dcm"
    b2.put("src", f"v3/{name}", os.urandom(5000), sha1=False)
    code, report = mirror(
        tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", hash_missing=True, dry_run=True
    )
    assert code == 1 and report["would_hash"] == [name] and report["unverified"] == [name]
    assert (report["hashed_at_source"], report["hashed_at_source_bytes"]) == (0, 0)
    assert gcs_objects(gcs_server, gcs_bucket, "m") == {}


def test_hash_missing_prints_progress_lines_without_a_terminal(
    cloud_env: dict[str, str],
    b2: B2Double,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed(b2)
    for n in range(3):
        b2.put("src", f"v3/nosha{n}.bin", os.urandom(4000), sha1=False)
    capsys.readouterr()
    code, report = mirror(
        tmp_path, "b2:src/v3", str(tmp_path / "m"), hash_missing=True, progress_seconds=0
    )
    assert code == 0 and report["hashed_at_source"] == 3
    err = capsys.readouterr().err
    assert err.count("mirror hash-missing: ") >= 3  # one line per read at interval 0
    assert "mirror hash-missing: 0.0 MB/0.0 MB (100%), 3/3 objects hashed" in err


def test_an_s3_source_mirrors_with_hash_missing(
    cloud_env: dict[str, str],
    gcs_server: GcsDouble,
    gcs_bucket: str,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    """S3 lists no SHA1: without --hash-missing every object stays unverified (exit 1); with it
    each is hashed at the source once, copied by rclone from the S3 emulator and verified."""
    source = open_storage(f"s3://{s3_bucket}/v3")
    files = {f"retinal_oct/{n}.dcm": os.urandom(2000 + n) for n in range(5)}
    for name, data in files.items():
        source.write_bytes(name, data)
    code, report = mirror(tmp_path, f"s3://{s3_bucket}/v3", f"gs://{gcs_bucket}/m")
    assert code == 1 and sorted(report["unverified"]) == sorted(files)
    code, report = mirror(
        tmp_path, f"s3://{s3_bucket}/v3", f"gs://{gcs_bucket}/m", hash_missing=True
    )
    assert code == 0 and report["hashed_at_source"] == len(files) and report["failed"] == []
    assert_mirrored(gcs_server, gcs_bucket, files)
    code, report = mirror(tmp_path, f"s3://{s3_bucket}/v3", f"gs://{gcs_bucket}/m")
    assert code == 0 and report["hash_reused"] == len(files) and report["copied_bytes"] == 0


def test_an_s3_mirror_shows_no_aws_key_anywhere(
    cloud_env: dict[str, str],
    gcs_server: GcsDouble,
    gcs_bucket: str,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    from tests.doubles.s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY

    source = open_storage(f"s3://{s3_bucket}/v3")
    for n in range(3):
        source.write_bytes(f"retinal_oct/{n}.dcm", os.urandom(1000 + n))
    src, dst, outputs, codes = f"s3://{s3_bucket}/v3", f"gs://{gcs_bucket}/m", [], []
    for args in (
        ["-v", "mirror", src, dst, "--json", str(tmp_path / "r.json")],
        ["-v", "mirror", src, dst, "--hash-missing", "--json", str(tmp_path / "r.json")],
        ["-v", "mirror", f"s3://{s3_bucket}-gone/v3", dst, "--dry-run"],
    ):
        proc = cli_process(args, cloud_env)
        out, err = proc.communicate(timeout=300)
        outputs += [out, err]
        codes.append(proc.returncode)
    assert codes == [1, 0, 2]
    written = [p.read_bytes().decode(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    for blob in gcs_objects(gcs_server, gcs_bucket, "m").values():
        written.append(blob.download_as_bytes().decode(errors="replace"))
        written.append(json.dumps(blob.metadata))
    assert "3/3 objects hashed" in "".join(outputs)
    for text in outputs + written:
        assert SECRET_ACCESS_KEY not in text and ACCESS_KEY_ID not in text
