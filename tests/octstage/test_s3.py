"""S3 specifics: ETags as MD5s, ranged header reads, missing buckets, s3 locations and remotes,
rclone reaching ``s3://`` through octstage's environment, secrets, and ``credential_env``.

The shared storage suite (test_storage.py) runs the S3 backend against the moto double too.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from octstage.errors import ObjectNotFoundError, StorageError
from octstage.storage import open_location, open_storage
from octstage.storage.locations import (
    credential_env,
    known_secrets,
    parse_location,
    rclone_binary,
    rclone_env,
    s3_credentials,
    scrub,
)
from octstage.storage.s3 import S3Storage, etag_md5
from tests.doubles.s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Double

REPO = Path(__file__).resolve().parents[2]


def test_etag_md5_only_for_single_part_etags() -> None:
    md5 = hashlib.md5(b"x").hexdigest()
    assert etag_md5(f'"{md5}"') == md5
    assert etag_md5(f'"{md5}-2"') is None
    assert etag_md5("") is None and etag_md5(None) is None


def test_a_multipart_object_lists_no_md5(
    cloud_env: dict[str, str], s3_server: S3Double, s3_bucket: str
) -> None:
    """A multipart ETag is an MD5 of MD5s: never reported as the content's MD5."""
    client = s3_server.client()
    parts = [os.urandom(5 * 1024 * 1024), b"tail"]  # S3's minimum part size, then the last
    up = client.create_multipart_upload(Bucket=s3_bucket, Key="p/multi.bin")
    etags = [
        client.upload_part(
            Bucket=s3_bucket, Key="p/multi.bin", PartNumber=n, UploadId=up["UploadId"], Body=body
        )["ETag"]
        for n, body in enumerate(parts, start=1)
    ]
    client.complete_multipart_upload(
        Bucket=s3_bucket,
        Key="p/multi.bin",
        UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n} for n, e in enumerate(etags, 1)]},
    )
    client.put_object(Bucket=s3_bucket, Key="p/single.bin", Body=b"single")
    store = open_storage(f"s3://{s3_bucket}/p")
    listed = {o.name: o for o in store.list()}
    assert listed["multi.bin"].md5 is None and store.stat("multi.bin").md5 is None
    assert listed["multi.bin"].size == sum(len(p) for p in parts)
    assert listed["single.bin"].md5 == hashlib.md5(b"single").hexdigest()
    assert store.read_bytes("multi.bin") == b"".join(parts)


def test_a_header_read_fetches_about_one_chunk(cloud_env: dict[str, str], s3_bucket: str) -> None:
    """chunk_size is the read-ahead block: a 2 kB header read of a 4 MiB object costs one small
    ranged GET, not the object (s3fs's cache counts the bytes it requested)."""
    data = os.urandom(4 * 1024 * 1024)
    store = open_storage(f"s3://{s3_bucket}/r")
    store.write_bytes("volume.dcm", data)
    with store.open("volume.dcm", chunk_size=64 * 1024) as fh:
        assert fh.read(2000) == data[:2000]
        requested = fh._inner.cache.total_requested_bytes  # type: ignore[attr-defined]
    assert 2000 <= requested <= 2000 + 64 * 1024
    with store.open("volume.dcm") as fh:  # the default: 8 MiB blocks, so one GET here
        assert fh.read() == data


def test_a_missing_bucket_is_an_error_not_an_empty_listing(cloud_env: dict[str, str]) -> None:
    store = open_storage("s3://no-such-bucket-here/p")
    with pytest.raises(StorageError, match="s3://no-such-bucket-here/p: no such bucket") as info:
        list(store.list())
    assert not isinstance(info.value, ObjectNotFoundError)
    with pytest.raises(StorageError, match="no such bucket"):
        store.write_bytes("x.bin", b"1")


def test_s3_urls_and_remotes_parse_with_their_credentials(s3_server: S3Double) -> None:
    env = {**s3_server.env(), "AWS_SESSION_TOKEN": "session-token-value"}
    loc = parse_location("s3://bkt/some/prefix/", env)
    assert (loc.kind, loc.bucket, loc.prefix, loc.url) == ("s3", "bkt", "some/prefix",
                                                           "s3://bkt/some/prefix")  # fmt: skip
    assert loc.rclone_fs == ":s3:bkt/some/prefix" and loc.remote is None
    creds = s3_credentials(loc, env)
    assert (creds.key_id, creds.secret, creds.token) == (
        ACCESS_KEY_ID, SECRET_ACCESS_KEY, "session-token-value"
    )  # fmt: skip
    assert (creds.endpoint, creds.region) == (s3_server.url, "us-east-1")
    assert SECRET_ACCESS_KEY not in repr(creds) and ACCESS_KEY_ID not in repr(creds)
    # AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL, AWS_REGION over AWS_DEFAULT_REGION.
    env2 = {**env, "AWS_ENDPOINT_URL_S3": "http://s3only:1", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert s3_credentials(loc, env2).endpoint == "http://s3only:1"
    assert s3_credentials(loc, env2).region == "us-east-1"

    remote_env = {
        **s3_server.rclone_remote("archive"),
        "RCLONE_CONFIG_ARCHIVE_ENDPOINT": "minio.example.org:9000",
        "RCLONE_CONFIG": "/dev/null",
    }
    rloc = parse_location("archive:bkt/p", remote_env)
    assert (rloc.kind, rloc.url, rloc.rclone_fs) == ("s3", "s3://bkt/p", "archive:bkt/p")
    rcreds = s3_credentials(rloc, remote_env)
    assert (rcreds.key_id, rcreds.endpoint) == (ACCESS_KEY_ID, "https://minio.example.org:9000")
    assert SECRET_ACCESS_KEY not in repr(rloc)
    # s3:// picks the remote OCTSTAGE_S3_REMOTE names; an env_auth remote takes AWS_* keys.
    picked = parse_location("s3://bkt/p", {**remote_env, "OCTSTAGE_S3_REMOTE": "archive"})
    assert picked.remote is not None and picked.remote.name == "archive"
    env_auth = {
        "RCLONE_CONFIG_ROLE_TYPE": "s3", "RCLONE_CONFIG_ROLE_ENV_AUTH": "true",
        "RCLONE_CONFIG": "/dev/null", **s3_server.env(),
    }  # fmt: skip
    role = s3_credentials(parse_location("role:bkt", env_auth), env_auth)
    assert (role.key_id, role.anonymous) == (ACCESS_KEY_ID, False)
    anon_env = {"RCLONE_CONFIG_PUB_TYPE": "s3", "RCLONE_CONFIG": "/dev/null"}
    assert s3_credentials(parse_location("pub:open-data", anon_env), anon_env).anonymous


def test_rclone_reaches_s3_urls_through_octstage_environment(
    cloud_env: dict[str, str], s3_bucket: str
) -> None:
    """No rclone remote defined: ``s3://`` becomes ``:s3:`` and rclone_env hands rclone the AWS
    keys and endpoint (as RCLONE_S3_*), which is what the mirror runs rclone with."""
    store = open_storage(f"s3://{s3_bucket}/v3")
    store.write_bytes("a/one.dcm", b"one")
    store.write_bytes("b/two words.dcm", b"two")
    loc = parse_location(f"s3://{s3_bucket}/v3")
    env = rclone_env([loc])
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        env.pop(key)  # rclone must get them from octstage, not find them itself

    def rclone(*args: str) -> str:
        out = subprocess.run([rclone_binary(), *args], env=env, capture_output=True, text=True)
        assert out.returncode == 0, scrub(out.stderr, known_secrets([loc]))
        return out.stdout

    listed = json.loads(rclone("lsjson", "-R", "--files-only", "--hash", loc.rclone_fs))
    assert sorted(o["Path"] for o in listed) == ["a/one.dcm", "b/two words.dcm"]
    assert {o["Hashes"]["md5"] for o in listed} == {
        hashlib.md5(b"one").hexdigest(), hashlib.md5(b"two").hexdigest()
    }  # fmt: skip
    assert rclone("cat", f"{loc.rclone_fs}/b/two words.dcm") == "two"


def test_known_secrets_cover_aws_keys_and_s3_remote_options(s3_server: S3Double) -> None:
    env = {
        **s3_server.env(),
        "AWS_SESSION_TOKEN": "aws-session-token-1234",
        **s3_server.rclone_remote("archive"),
        "RCLONE_CONFIG_ARCHIVE_SESSION_TOKEN": "remote-session-token-5678",
        "RCLONE_CONFIG": "/dev/null",
    }
    secrets = known_secrets([parse_location("archive:bkt/p", env)], env)
    text = f"key {ACCESS_KEY_ID} secret {SECRET_ACCESS_KEY} aws-session-token-1234 " \
        "remote-session-token-5678"  # fmt: skip
    scrubbed = scrub(text, secrets)
    for secret in (ACCESS_KEY_ID, SECRET_ACCESS_KEY, "aws-session-token-1234",
                   "remote-session-token-5678"):  # fmt: skip
        assert secret not in scrubbed
    store = S3Storage.from_location(parse_location("s3://bkt/p", {**s3_server.env()}))
    assert SECRET_ACCESS_KEY not in repr(store)


def test_credential_env_names_what_each_kind_needs(s3_server: S3Double) -> None:
    env = {
        **s3_server.env(),
        "AWS_PROFILE": "a-local-file-means-nothing-elsewhere",
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443",
        "GOOGLE_APPLICATION_CREDENTIALS": "/home/me/key.json",
        "B2_APPLICATION_KEY_ID": "b2id",
        "B2_APPLICATION_KEY": "b2key",
        "UNRELATED": "x",
        "RCLONE_CONFIG": "/dev/null",
    }

    def of(spec: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        e = {**env, **(extra or {})}
        return credential_env([parse_location(spec, e)], e)

    assert of("s3://bkt/p") == s3_server.env()
    assert of("gs://bkt/p") == {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443"}
    assert of("b2://bkt/p") == {"B2_APPLICATION_KEY_ID": "b2id", "B2_APPLICATION_KEY": "b2key"}
    assert of("/tmp/somewhere") == {}
    remote = {**s3_server.rclone_remote("archive"), "OCTSTAGE_S3_REMOTE": "archive"}
    assert of("s3://bkt/p", remote) == {"OCTSTAGE_S3_REMOTE": "archive", **remote}
    assert of("archive:bkt/p", remote) == {"OCTSTAGE_S3_REMOTE": "archive", **remote}
    role = {"RCLONE_CONFIG_ROLE_TYPE": "s3", "RCLONE_CONFIG_ROLE_ENV_AUTH": "true"}
    assert of("role:bkt", role) == {**role, **s3_server.env()}  # env_auth: the AWS keys too


def test_credential_env_is_enough_for_a_process_elsewhere(
    cloud_env: dict[str, str], s3_bucket: str, gcs_bucket: str, tmp_path: Path
) -> None:
    """A fresh process given only credential_env's variables (no HOME state, no config file)
    opens every location and reads what this one wrote."""
    urls = [f"s3://{s3_bucket}/p", f"gs://{gcs_bucket}/p", "b2://src/p", "b2:src/q"]
    locs = [parse_location(u) for u in urls]
    for n, loc in enumerate(locs):
        open_location(loc).write_bytes("f.bin", f"payload {n}".encode())
    home = tmp_path / "elsewhere"
    home.mkdir()
    child_env = {
        "PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(REPO),
        "RCLONE_CONFIG": "/dev/null", **credential_env(locs),
    }  # fmt: skip
    script = (
        "import sys\n"
        "from octstage.storage import open_location\n"
        "from octstage.storage.locations import parse_location\n"
        "for spec in sys.argv[1:]:\n"
        "    print(open_location(parse_location(spec)).read_bytes('f.bin').decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *urls], env=child_env, capture_output=True, text=True
    )
    assert out.returncode == 0, scrub(out.stderr, known_secrets(locs))[-2000:]
    assert out.stdout.splitlines() == [f"payload {n}" for n in range(len(urls))]
