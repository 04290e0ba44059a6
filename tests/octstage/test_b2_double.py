"""The B2 double itself, driven by the real clients: rclone's b2 backend and b2sdk.

If these fail, every mirror test built on the double is suspect, so each knob the mirror tests
turn (faults, corruption, missing SHA1, list-call counting) is shown to work here first.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from b2sdk.v2 import B2Api, InMemoryAccountInfo, InMemoryCache
from b2sdk.v2.exception import B2Error

from octstage.storage.locations import rclone_binary
from tests.doubles.b2_server import B2Double, _parse_range


def rclone(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [rclone_binary(), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def api_for(b2: B2Double) -> B2Api:
    api = B2Api(InMemoryAccountInfo(), cache=InMemoryCache())
    api.authorize_account(b2.endpoint, b2.key_id, b2.key)
    return api


def test_rclone_lists_sizes_hashes_and_odd_names(cloud_env: dict[str, str], b2: B2Double) -> None:
    names = {"a/b/one.dcm": b"one", "a/two words 'q\" +.dcm": b"two" * 50, "ü/日本.dcm": b"3"}
    for name, data in names.items():
        b2.put("src", name, data, large=name.startswith("a/two"))
    out = rclone(cloud_env, "lsjson", "-R", "--files-only", "--hash", "--fast-list", "b2:src")
    assert out.returncode == 0, out.stderr
    listed = {e["Path"]: e for e in json.loads(out.stdout)}
    assert set(listed) == set(names)
    for name, data in names.items():
        assert listed[name]["Size"] == len(data)
        assert listed[name]["Hashes"]["sha1"] == hashlib.sha1(data).hexdigest()
    cat = rclone(cloud_env, "cat", "b2:src/a/two words 'q\" +.dcm")
    assert cat.stdout == (b"two" * 50).decode()


def test_fast_list_is_one_call_and_folder_listing_one_per_folder(
    cloud_env: dict[str, str], b2: B2Double, tmp_path: Path
) -> None:
    for pid in range(30):
        for eye in "lr":
            b2.put("src", f"oct/dev/{1000 + pid}/{1000 + pid}_{eye}.dcm", b"x")

    def list_calls(*flags: str) -> int:
        before = b2.stats.calls["b2_list_file_names"]
        out = rclone(cloud_env, "copy", "--dry-run", *flags, "b2:src", str(tmp_path / "d"))
        assert out.returncode == 0, out.stderr
        assert out.stderr.count("Skipped copy as --dry-run") == 60
        return b2.stats.calls["b2_list_file_names"] - before

    assert list_calls("--fast-list") == 1
    assert list_calls() == 33  # root, oct/, oct/dev/ and each of the 30 participant folders


def test_b2sdk_uploads_simple_and_large_files_with_their_sha1(b2: B2Double) -> None:
    b2.minimum_part_size = b2.recommended_part_size = 1000  # make 5 kB a large file
    bucket = api_for(b2).get_bucket_by_name("src")
    big = os.urandom(5000)
    bucket.upload_bytes(b"small", "s.bin")
    bucket.upload_bytes(big, "large.bin")
    assert b2.stats.calls["b2_upload_part"] >= 2 and b2.stats.calls["b2_finish_large_file"] == 1
    versions = {v.file_name: v for v, _ in bucket.ls(recursive=True)}
    assert versions["s.bin"].content_sha1 == hashlib.sha1(b"small").hexdigest()
    assert versions["large.bin"].file_info["large_file_sha1"] == hashlib.sha1(big).hexdigest()
    assert b2.read("src", "large.bin") == big


def test_counters_are_widened_past_the_simulators_limits(b2: B2Double) -> None:
    """The stock simulator stops after 200 upload URLs and ~5,000 uploads."""
    for i in range(5200):
        b2.put("src", f"n/{i:05d}", b"")
    bucket = api_for(b2).get_bucket_by_name("src")
    for i in range(210):
        bucket.upload_bytes(b"u", f"url/{i}")  # one upload URL each: b2sdk does not reuse here
    assert len(b2.names("src")) == 5410


def test_injected_errors_are_retried_by_both_clients(
    cloud_env: dict[str, str], b2: B2Double
) -> None:
    b2.put("src", "f.bin", b"payload")
    b2.inject("b2_list_file_names", 503, count=2)
    b2.inject("download", 500, count=1, name="f.bin")
    b2.inject("download", 429, count=1, name="f.bin")
    out = rclone(cloud_env, "cat", "--low-level-retries", "10", "b2:src/f.bin")
    assert out.returncode == 0 and out.stdout == "payload", out.stderr
    assert b2.stats.faults_served == 4
    b2.inject("b2_list_file_names", 503, count=1)
    names = [v.file_name for v, _ in api_for(b2).get_bucket_by_name("src").ls(recursive=True)]
    assert names == ["f.bin"] and b2.stats.faults_served == 5


def test_a_corrupted_download_is_caught_by_rclone_but_left_behind(
    cloud_env: dict[str, str], b2: B2Double, gcs_bucket: str
) -> None:
    """The field-notes hazard, reproduced: rclone notices the SHA1 mismatch at the end of the
    stream, but GCS has already committed the object."""
    data = os.urandom(100_000)
    b2.put("src", "c.bin", data)
    b2.corrupt_downloads("c.bin", count=10)
    out = rclone(cloud_env, "copy", "--retries", "1", "b2:src", f"gcs:{gcs_bucket}")
    assert out.returncode != 0 and "corrupted on transfer" in out.stderr
    lsjson = json.loads(rclone(cloud_env, "lsjson", f"gcs:{gcs_bucket}").stdout)
    assert [(e["Path"], e["Size"]) for e in lsjson] == [("c.bin", len(data))]  # same size...
    got = subprocess.run(
        [rclone_binary(), "cat", f"gcs:{gcs_bucket}/c.bin"],
        env={**os.environ, **cloud_env},
        capture_output=True,
        check=True,
    ).stdout
    assert got != data  # ...other bytes


def test_missing_sha1_and_large_file_sha1_in_listings(b2: B2Double) -> None:
    b2.put("src", "large.bin", b"L" * 300, large=True)
    b2.put("src", "none.bin", b"N" * 300, sha1=False)
    bucket = api_for(b2).get_bucket_by_name("src")
    found = {v.file_name: v for v, _ in bucket.ls(recursive=True)}
    assert found["large.bin"].content_sha1 in (None, "none")
    assert found["large.bin"].file_info["large_file_sha1"] == hashlib.sha1(b"L" * 300).hexdigest()
    assert found["none.bin"].content_sha1 in (None, "none")
    assert "large_file_sha1" not in found["none.bin"].file_info


def test_wrong_key_is_refused(b2: B2Double) -> None:
    api = B2Api(InMemoryAccountInfo(), cache=InMemoryCache())
    with pytest.raises(B2Error):
        api.authorize_account(b2.endpoint, b2.key_id, "wrong-key")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-9", (0, 9)),
        ("bytes=5-", (5, 99)),
        ("bytes=-10", (90, 99)),
        ("bytes=90-500", (90, 99)),
        ("bytes=100-", "invalid"),
    ],
)
def test_range_parsing(header: str | None, expected: object) -> None:
    assert _parse_range(header, 100) == expected
