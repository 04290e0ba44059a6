"""One storage suite, run against every backend: local folder, GCS double, S3 double, B2 double.

The cloud backends run their real clients (google-cloud-storage, s3fs, b2sdk) over HTTP against
the doubles in tests/doubles. What a backend writes is also read back through a SECOND client
that shares no code with it (plain ``open``, gcsfs, boto3, rclone), so a backend that only reads
back its own mistakes (a wrong key, a mangled name) cannot pass. Backend-specific behaviour
(recorded SHA1s on GCS, B2's large-file SHA1) is tested at the end; S3's in test_s3.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from octstage.errors import StorageError, UnsafePathError
from octstage.storage import Storage, open_location, open_storage
from octstage.storage.locations import parse_location, rclone_binary
from tests.doubles.b2_server import B2Double
from tests.doubles.gcs import GcsDouble
from tests.doubles.s3 import S3Double

ODD = [
    "retinal_oct/structural_oct/zeiss_cirrus/7111/7111_cirrus_mac_oct_oct_l_1.2.3.dcm",
    "odd/with space.dcm",
    "odd/quote'single\"double.dcm",
    "odd/ünïcödé/日本語.dcm",
    "odd/plus+and&amp$(x).dcm",
    "a/b/c/d/e/deep.bin",
]
ROOT = "some/root"


@dataclass(frozen=True)
class SecondClient:
    """Another client's view of the store's root: every object name under it, and its bytes."""

    names: Callable[[], list[str]]
    read: Callable[[str], bytes]


@dataclass(frozen=True)
class Backend:
    kind: str
    store: Storage
    second: SecondClient


def _local_second(root: Path) -> SecondClient:
    def names() -> list[str]:
        found = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
        return sorted(n for n in found if not n.split("/")[-1].startswith("."))

    return SecondClient(names, lambda name: (root / name).read_bytes())


def _gcs_second(server: GcsDouble, bucket: str) -> SecondClient:
    """gcsfs, not google-cloud-storage (which the backend uses)."""
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=server.url, skip_instance_cache=True)
    root = f"{bucket}/{ROOT}"

    def names() -> list[str]:
        fs.invalidate_cache()
        return sorted(n[len(root) + 1 :] for n in fs.find(root))

    def read(name: str) -> bytes:
        return bytes(fs.cat_file(f"{root}/{name}"))

    return SecondClient(names, read)


def _s3_second(server: S3Double, bucket: str) -> SecondClient:
    """boto3, not s3fs (which the backend uses)."""
    client = server.client()

    def names() -> list[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{ROOT}/")
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        return sorted(k[len(ROOT) + 1 :] for k in keys)

    def read(name: str) -> bytes:
        return bytes(client.get_object(Bucket=bucket, Key=f"{ROOT}/{name}")["Body"].read())

    return SecondClient(names, read)


def _b2_second(env: dict[str, str]) -> SecondClient:
    """rclone's b2 backend (Go, its own B2 client), not b2sdk (which the backend uses)."""

    def rclone(*args: str) -> bytes:
        out = subprocess.run(
            [rclone_binary(), *args], env={**os.environ, **env}, capture_output=True, check=True
        )
        return out.stdout

    def names() -> list[str]:
        listed = json.loads(rclone("lsjson", "-R", "--files-only", f"b2:src/{ROOT}"))
        return sorted(str(o["Path"]) for o in listed)

    return SecondClient(names, lambda name: rclone("cat", f"b2:src/{ROOT}/{name}"))


@pytest.fixture(params=["local", "gcs", "s3", "b2"])
def backend(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    cloud_env: dict[str, str],
    gcs_server: GcsDouble,
    gcs_bucket: str,
    s3_server: S3Double,
    s3_bucket: str,
) -> Backend:
    kind = request.param
    if kind == "local":
        root = tmp_path / "root"
        return Backend(kind, open_storage(str(root)), _local_second(root))
    if kind == "gcs":
        store = open_storage(f"gs://{gcs_bucket}/{ROOT}")
        return Backend(kind, store, _gcs_second(gcs_server, gcs_bucket))
    if kind == "s3":
        store = open_storage(f"s3://{s3_bucket}/{ROOT}")
        return Backend(kind, store, _s3_second(s3_server, s3_bucket))
    return Backend(kind, open_storage(f"b2://src/{ROOT}"), _b2_second(cloud_env))


@pytest.fixture
def store(backend: Backend) -> Iterator[Storage]:
    yield backend.store


@pytest.fixture
def second(backend: Backend) -> SecondClient:
    return backend.second


def test_a_second_client_reads_back_what_the_backend_wrote(
    store: Storage, second: SecondClient
) -> None:
    payloads = {name: f"payload {n} ".encode() * (n + 1) for n, name in enumerate(ODD)}
    for name, data in payloads.items():
        store.write_bytes(name, data, metadata={"mtime": "1"})
    assert second.names() == sorted(ODD)
    for name, data in payloads.items():
        assert second.read(name) == data, name
    store.write_bytes(ODD[0], b"replaced")
    store.delete(ODD[1])
    assert second.names() == sorted(ODD[0:1] + ODD[2:])
    assert second.read(ODD[0]) == b"replaced"


def test_listed_md5s_are_the_md5_of_the_bytes(store: Storage) -> None:
    """Where a backend lists an MD5 (GCS, single-part S3), it is the content's."""
    data = {"m/one.bin": b"one", "m/two.bin": os.urandom(1000)}
    for name, payload in data.items():
        store.write_bytes(name, payload)
    for obj in [*store.list("m/"), store.stat("m/one.bin")]:
        if obj.md5 is not None:
            assert obj.md5 == hashlib.md5(data[obj.name]).hexdigest()


def test_write_then_read_list_and_stat(store: Storage) -> None:
    for n, name in enumerate(ODD):
        store.write_bytes(name, f"payload {n}".encode())
    listed = list(store.list())
    assert [o.name for o in listed] == sorted(ODD)
    for n, name in enumerate(ODD):
        data = f"payload {n}".encode()
        assert store.read_bytes(name) == data
        assert store.stat(name).size == len(data)
        with store.open(name) as fh:
            assert fh.read() == data


def test_a_rewritten_object_lists_another_version(backend: Backend) -> None:
    """The mirror trusts a hash it took only for the version it hashed (--hash-missing)."""
    store = backend.store
    store.write_bytes("v.bin", b"one")
    (first,) = store.list("v.bin")
    store.write_bytes("v.bin", b"two")
    (second,) = store.list("v.bin")
    if backend.kind == "local":  # a folder lists no versions; local sources are always hashed
        assert first.version is second.version is None
        return
    assert first.version and second.version and first.version != second.version


def test_list_filters_by_prefix_and_never_leaks_siblings(store: Storage) -> None:
    store.write_bytes("a/x.bin", b"1")
    store.write_bytes("a/y/z.bin", b"22")
    store.write_bytes("ab.bin", b"333")
    assert [o.name for o in store.list("a/")] == ["a/x.bin", "a/y/z.bin"]
    assert [o.name for o in store.list("a")] == ["a/x.bin", "a/y/z.bin", "ab.bin"]
    assert [(o.name, o.size) for o in store.list("ab")] == [("ab.bin", 3)]
    assert list(store.list("nothing/")) == []


def test_root_prefix_is_a_folder_not_a_string_prefix(
    backend: Backend, tmp_path: Path, gcs_bucket: str, s3_bucket: str
) -> None:
    """``.../root`` must not list ``.../root2/...``."""
    store = backend.store
    store.write_bytes("inside.bin", b"1")
    sibling = {
        "local": str(tmp_path / "root2"),
        "gcs": f"gs://{gcs_bucket}/some/root2",
        "s3": f"s3://{s3_bucket}/some/root2",
        "b2": "b2://src/some/root2",
    }[backend.kind]
    open_storage(sibling).write_bytes("outside.bin", b"2")
    assert [o.name for o in store.list()] == ["inside.bin"]


def test_streaming_read_of_a_multi_chunk_object_with_seek(store: Storage) -> None:
    data = os.urandom(9 * 1024 * 1024 + 123)  # more than one 8 MiB read chunk
    store.write_bytes("big/volume.dcm", data)
    with store.open("big/volume.dcm") as fh:
        assert fh.read(10) == data[:10]
        fh.seek(8 * 1024 * 1024 - 5)
        assert fh.read(10) == data[8 * 1024 * 1024 - 5 : 8 * 1024 * 1024 + 5]
        fh.seek(0)
        digest = hashlib.sha1()
        while chunk := fh.read(1024 * 1024):
            digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha1(data).hexdigest()


def test_small_chunks_read_the_same_bytes_across_chunk_boundaries(store: Storage) -> None:
    data = os.urandom(300 * 1024 + 7)  # header-sized chunks: many boundaries in one object
    store.write_bytes("dcm/header.dcm", data)
    with store.open("dcm/header.dcm", chunk_size=64 * 1024) as fh:
        assert fh.read(100) == data[:100]
        fh.seek(64 * 1024 - 3)
        assert fh.read(6) == data[64 * 1024 - 3 : 64 * 1024 + 3]
        fh.seek(0)
        assert fh.read() == data


def test_overwrite_replaces_the_whole_object(store: Storage) -> None:
    store.write_bytes("x.bin", b"first version, long")
    store.write_bytes("x.bin", b"second")
    assert store.read_bytes("x.bin") == b"second"
    assert [(o.name, o.size) for o in store.list()] == [("x.bin", 6)]


def test_missing_objects_raise_storage_error(store: Storage) -> None:
    with pytest.raises(StorageError, match="no such object"):
        store.stat("missing.bin")
    with pytest.raises(StorageError):
        store.read_bytes("missing.bin")
    with pytest.raises(StorageError):
        store.open("missing.bin").read()


def test_delete_is_idempotent(store: Storage) -> None:
    store.write_bytes("gone.bin", b"x")
    store.write_bytes("gone.bin", b"y")  # B2 keeps versions: all of them must go
    store.delete("gone.bin")
    store.delete("gone.bin")
    assert list(store.list()) == []
    with pytest.raises(StorageError):
        store.stat("gone.bin")


@pytest.mark.parametrize("name", ["../escape.bin", "/abs.bin", "a/../../b", "a//b", "a\\b", ""])
def test_unsafe_names_are_refused_everywhere(store: Storage, name: str) -> None:
    with pytest.raises(UnsafePathError):
        store.write_bytes(name, b"x")
    with pytest.raises(UnsafePathError):
        store.read_bytes(name)
    assert list(store.list()) == []


def test_remote_names_and_urls_reach_the_same_objects(
    cloud_env: dict[str, str],
    gcs_bucket: str,
    s3_server: S3Double,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gcs:bucket/p`` (rclone remote from RCLONE_CONFIG_GCS_*) and ``gs://bucket/p``; the same
    for b2 and s3 (an s3 remote named ``archive`` whose keys are its own, not AWS_*)."""
    open_storage(f"gs://{gcs_bucket}/p").write_bytes("f.bin", b"abc")
    via_remote = open_location(parse_location(f"gcs:{gcs_bucket}/p"))
    assert via_remote.read_bytes("f.bin") == b"abc"
    via_b2_remote = open_location(parse_location("b2:src/q"))
    via_b2_remote.write_bytes("g.bin", b"def")
    assert open_storage("b2://src/q").read_bytes("g.bin") == b"def"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key)
    for key, value in s3_server.rclone_remote("archive").items():
        monkeypatch.setenv(key, value)
    via_s3_remote = open_location(parse_location(f"archive:{s3_bucket}/r"))
    via_s3_remote.write_bytes("h.bin", b"ghi")
    monkeypatch.setenv("OCTSTAGE_S3_REMOTE", "archive")
    assert open_storage(f"s3://{s3_bucket}/r").read_bytes("h.bin") == b"ghi"


# -- backend specifics ---------------------------------------------------------------------


def test_gcs_lists_a_recorded_sha1_only_while_the_bytes_are_unchanged(
    cloud_env: dict[str, str], gcs_bucket: str
) -> None:
    from octstage.storage.gcs import GcsStorage

    store = open_storage(f"gs://{gcs_bucket}/m")
    assert isinstance(store, GcsStorage)
    data = b"volume bytes"
    store.write_bytes("v.dcm", data, metadata={"mtime": "kept"})
    state = store.state("v.dcm")
    sha1, size = store.sha1_of(state)
    assert (sha1, size) == (hashlib.sha1(data).hexdigest(), len(data))
    store.record_source_sha1(state, sha1)
    assert store.stat("v.dcm").sha1 == sha1
    assert store.state("v.dcm").metadata["mtime"] == "kept"  # other metadata survives
    # Same size, other bytes, and a tool that copies the metadata over: no longer verified.
    meta = dict(store.state("v.dcm").metadata)
    store.write_bytes("v.dcm", b"VOLUME BYTES", metadata=meta)
    assert [o.sha1 for o in store.list()] == [None]


def test_gcs_never_lists_a_sha1_recorded_for_replaced_bytes(
    cloud_env: dict[str, str], gcs_bucket: str
) -> None:
    """The object changes between hashing and recording. Real GCS refuses the patch
    (ifGenerationMatch); fake-gcs-server ignores that precondition, so here the CRC32C recorded
    beside the SHA1 is what keeps the listing honest. Either way: no SHA1 for the new bytes."""
    from octstage.storage.gcs import GcsStorage

    store = open_storage(f"gs://{gcs_bucket}/m")
    assert isinstance(store, GcsStorage)
    store.write_bytes("v.dcm", b"one")
    state = store.state("v.dcm")
    store.write_bytes("v.dcm", b"two")
    try:
        store.record_source_sha1(state, hashlib.sha1(b"one").hexdigest())
    except StorageError as exc:
        assert "replaced while being verified" in str(exc)
    assert store.stat("v.dcm").sha1 is None
    assert [o.sha1 for o in store.list()] == [None]


def test_b2_lists_content_sha1_large_file_sha1_and_none(
    cloud_env: dict[str, str], b2: B2Double
) -> None:
    b2.put("src", "p/simple.bin", b"simple")
    b2.put("src", "p/large.bin", b"large" * 100, large=True)
    b2.put("src", "p/nosha.bin", b"no sha1", sha1=False)
    listed = {o.name: o for o in open_storage("b2://src/p").list()}
    simple = listed["simple.bin"]
    assert (simple.name, simple.size) == ("simple.bin", 6)
    assert simple.sha1 == hashlib.sha1(b"simple").hexdigest()
    assert listed["large.bin"].sha1 == hashlib.sha1(b"large" * 100).hexdigest()
    assert listed["nosha.bin"].sha1 is None
    assert open_storage("b2://src/p").stat("large.bin").sha1 == listed["large.bin"].sha1


def test_b2_listing_takes_one_call_per_10000_names(cloud_env: dict[str, str], b2: B2Double) -> None:
    for i in range(2500):
        b2.put("src", f"many/{i // 10:03d}/{i}.dcm", b"x")
    before = b2.stats.calls["b2_list_file_names"]
    assert len(list(open_storage("b2://src/many").list())) == 2500
    assert b2.stats.calls["b2_list_file_names"] - before == 1


def test_b2_open_reads_ranges_not_the_whole_object(cloud_env: dict[str, str], b2: B2Double) -> None:
    data = os.urandom(3 * 1024 * 1024)
    b2.put("src", "r/big.bin", data)
    store = open_storage("b2://src/r")
    with store.open("big.bin") as fh:
        fh.seek(1024 * 1024)
        assert fh.read(100) == data[1024 * 1024 : 1024 * 1024 + 100]
    assert b2.stats.downloaded_bytes < len(data)


def test_b2_header_read_fetches_one_small_range(cloud_env: dict[str, str], b2: B2Double) -> None:
    data = os.urandom(4 * 1024 * 1024)
    b2.put("src", "r/volume.dcm", data)
    store = open_storage("b2://src/r")
    before = b2.stats.downloaded_bytes
    with store.open("volume.dcm", chunk_size=64 * 1024) as fh:
        assert fh.read(2000) == data[:2000]
    assert b2.stats.downloaded_bytes - before <= 64 * 1024
