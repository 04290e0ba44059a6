"""``octstage mirror``: the real rclone (rc daemon), b2sdk and google-cloud-storage, against the
B2 double and fake-gcs-server. The pure parts (plan, deletion guard, inventory, arguments,
locations, scrubbing) are tested without I/O at the end."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from octstage.cli import main as cli_main
from octstage.errors import MirrorError
from octstage.inventory import (
    FORMAT,
    INVENTORY_NAME,
    Entry,
    Inventory,
    check_deletions,
    from_json,
    inventory_from_listing,
    plan_mirror,
    to_json,
)
from octstage.mirror import run_mirror
from octstage.rclone import copy_config, copy_filter
from octstage.remotes import known_secrets, parse_location, scrub
from octstage.storage import ObjectInfo
from tests.doubles.b2_server import B2Double
from tests.doubles.gcs import GcsDouble, client_for

REPO = Path(__file__).resolve().parents[2]
MTIME = 1_700_000_000_000
ODD_NAMES = [
    "odd/with space.dcm",
    "odd/quote'single\"double.dcm",
    "odd/ünïcödé/日本語.dcm",
    "odd/plus+and&$(echo x);.dcm",
]


def seed(b2: B2Double, prefix: str = "v3", participants: int = 4) -> dict[str, bytes]:
    """An AI-READI-like tree (plus odd names) in the B2 double; every third file a large file."""
    files: dict[str, bytes] = {"participants.tsv": b"participant_id\tstudy_group\n"}
    for n in range(participants):
        pid = ("1001", "4150", "7111", "1002", "4151", "7112")[n % 6]
        for eye in "lr":
            name = (
                f"retinal_oct/structural_oct/zeiss_cirrus/{pid}/{pid}_cirrus_mac_{eye}_1.2.{n}.dcm"
            )
            files[name] = os.urandom(3000 + 17 * n)
    for name in ODD_NAMES:
        files[name] = os.urandom(500)
    for i, (name, data) in enumerate(sorted(files.items())):
        b2.put("src", f"{prefix}/{name}", data, large=i % 3 == 0, mtime_ms=MTIME)
    return files


def gcs_objects(server: GcsDouble, bucket: str, prefix: str) -> dict[str, Any]:
    client: Any = client_for(server)
    return {b.name[len(prefix) + 1 :]: b for b in client.list_blobs(bucket, prefix=f"{prefix}/")}


def mirror(tmp_path: Path, src: str, dst: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"report-{time.monotonic_ns()}.json"
    code = run_mirror(src, dst, json_out=out, transfers=4, checkers=8, **kwargs)
    return code, json.loads(out.read_text())


def assert_mirrored(server: GcsDouble, bucket: str, files: dict[str, bytes]) -> None:
    blobs = gcs_objects(server, bucket, "m")
    assert set(blobs) == set(files) | {INVENTORY_NAME}
    for name, data in files.items():
        assert blobs[name].download_as_bytes() == data, name
        assert blobs[name].metadata["source-sha1"] == hashlib.sha1(data).hexdigest()


def test_full_mirror_copies_verifies_records_and_saves_the_inventory(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    files = seed(b2)
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert code == 0, report
    assert report["verified"] == len(files) and report["failed"] == [] and not report["unverified"]
    assert report["copied_files"] == len(files)
    assert_mirrored(gcs_server, gcs_bucket, files)
    inventory = json.loads(
        gcs_objects(gcs_server, gcs_bucket, "m")[INVENTORY_NAME].download_as_bytes()
    )
    assert inventory["format"] == FORMAT and inventory["source"] == "b2://src/v3"
    assert {o["name"]: (o["size"], o["sha1"]) for o in inventory["objects"]} == {
        n: (len(d), hashlib.sha1(d).hexdigest()) for n, d in files.items()
    }
    assert b2.stats.calls["b2_list_file_names"] <= 3  # b2sdk inventory + rclone --fast-list


def test_second_run_over_an_unchanged_source_transfers_nothing(
    cloud_env: dict[str, str], b2: B2Double, gcs_bucket: str, tmp_path: Path
) -> None:
    seed(b2)
    assert mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")[0] == 0
    downloads, downloaded = b2.stats.calls["download"], b2.stats.downloaded_bytes
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert code == 0
    assert report["copied_bytes"] == 0 and report["copied_files"] == 0 and report["verified"] == 0
    assert report["plan"]["in_sync"] == report["source_objects"]
    assert (b2.stats.calls["download"], b2.stats.downloaded_bytes) == (downloads, downloaded)


def test_changed_source_object_is_copied_again(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    """Same size, same modification time, new bytes: only the recorded SHA1 tells."""
    files = seed(b2)
    assert mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")[0] == 0
    name = ODD_NAMES[0]
    files[name] = os.urandom(len(files[name]))
    b2.put("src", f"v3/{name}", files[name], mtime_ms=MTIME)
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert code == 0 and report["plan"]["copy"] == 1
    assert report["recopied"] == [name]  # rclone saw equal size and time and skipped it
    assert_mirrored(gcs_server, gcs_bucket, files)


def test_dry_run_says_what_it_would_do_and_touches_nothing(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    files = seed(b2)
    b2.put("src", "v3/nosha.bin", b"n" * 10, sha1=False)
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", dry_run=True)
    assert code == 1  # the object without SHA1 would stay unverified
    assert sorted(report["would_copy"]) == sorted([*files, "nosha.bin"])
    assert sorted(report["would_verify"]) == sorted(files)
    assert report["unverified"] == ["nosha.bin"]
    assert gcs_objects(gcs_server, gcs_bucket, "m") == {}
    assert b2.stats.calls["download"] == 0
    # With a mirror in place and one extra object, a dry prune only names it.
    assert mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")[0] == 1
    client: Any = client_for(gcs_server)
    client.bucket(gcs_bucket).blob("m/extra.bin").upload_from_string(b"x")
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", dry_run=True, prune=True)
    assert report["would_delete"] == ["extra.bin"] and report["would_copy"] == []
    assert "extra.bin" in gcs_objects(gcs_server, gcs_bucket, "m")


def test_injected_server_errors_are_retried_and_the_mirror_completes(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    files = seed(b2)
    names = sorted(files)
    b2.inject("b2_list_file_names", 503, count=2)
    b2.inject("download", 500, count=2, name=f"v3/{names[0]}")
    b2.inject("download", 429, count=2, name=f"v3/{names[1]}")
    b2.inject("download", 503, count=1, name=f"v3/{names[2]}")
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert b2.stats.faults_served == 7
    assert code == 0 and report["failed"] == []
    assert_mirrored(gcs_server, gcs_bucket, files)


def test_a_same_size_corrupt_copy_is_found_and_copied_again(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    """rclone leaves the corrupt object in GCS (it checks SHA1 after the upload committed);
    hashing at the destination finds it and it is re-copied."""
    files = seed(b2)
    bad = sorted(files)[3]
    b2.corrupt_downloads(f"v3/{bad}", count=1)
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert b2.stats.corrupted_served == 1
    assert code == 0 and report["recopied"] == [bad] and report["failed"] == []
    assert_mirrored(gcs_server, gcs_bucket, files)


def test_a_tampered_destination_object_is_found_on_the_next_run(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    files = seed(b2)
    assert mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")[0] == 0
    name = sorted(files)[1]
    blob = gcs_objects(gcs_server, gcs_bucket, "m")[name]
    blob.metadata = dict(blob.metadata)  # a tool that keeps the metadata, even our SHA1
    blob.upload_from_string(bytes(b ^ 1 for b in files[name]))
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert code == 0 and report["recopied"] == [name]
    assert_mirrored(gcs_server, gcs_bucket, files)


def test_objects_without_a_source_sha1_are_reported_unverified(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    seed(b2)
    b2.put("src", "v3/retinal_oct/nosha.dcm", b"no sha1 here", sha1=False)
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert code == 1
    assert report["unverified"] == ["retinal_oct/nosha.dcm"] and report["failed"] == []
    blob = gcs_objects(gcs_server, gcs_bucket, "m")["retinal_oct/nosha.dcm"]
    assert blob.download_as_bytes() == b"no sha1 here"
    assert "source-sha1" not in (blob.metadata or {})
    inventory = json.loads(
        gcs_objects(gcs_server, gcs_bucket, "m")[INVENTORY_NAME].download_as_bytes()
    )
    assert {o["name"]: o["sha1"] for o in inventory["objects"]}["retinal_oct/nosha.dcm"] is None
    assert mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")[1]["unverified"] == [
        "retinal_oct/nosha.dcm"
    ]


def test_prune_deletes_extras_but_never_the_octstage_folder(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    files = seed(b2)
    client: Any = client_for(gcs_server)
    for extra in ("gone/a.dcm", "gone/b.dcm", "_octstage/keep.json"):
        client.bucket(gcs_bucket).blob(f"m/{extra}").upload_from_string(b"x")
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m", prune=True, max_delete=2)
    assert code == 0 and sorted(report["deleted"]) == ["gone/a.dcm", "gone/b.dcm"]
    left = gcs_objects(gcs_server, gcs_bucket, "m")
    assert set(left) == {*files, INVENTORY_NAME, "_octstage/keep.json"}


@pytest.mark.parametrize("source", ["b2:src/v3-typo", "b2:src/v2"])
def test_empty_or_mistyped_source_with_prune_deletes_nothing(
    cloud_env: dict[str, str],
    b2: B2Double,
    gcs_server: GcsDouble,
    gcs_bucket: str,
    tmp_path: Path,
    source: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``v3-typo`` lists nothing; ``v2`` is a real but other folder (one object): a prune would
    delete most of the mirror. Both are refused before anything is copied or deleted."""
    files = seed(b2)
    b2.put("src", "v2/other.dcm", b"other")
    assert mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")[0] == 0
    code = cli_main(["mirror", source, f"gs://{gcs_bucket}/m", "--prune", "--max-delete", "5"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no objects" in err if source.endswith("typo") else "--max-delete 5" in err
    left = gcs_objects(gcs_server, gcs_bucket, "m")
    assert set(left) == {*files, INVENTORY_NAME}  # nothing deleted, nothing copied


def test_a_local_folder_mirrors_to_gcs_with_hashed_inventory(
    cloud_env: dict[str, str], gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    src = tmp_path / "cache"
    files = {"manifest.json": b"{}", "volumes/1001/k.ome.zarr/zarr.json": b"{}", ODD_NAMES[1]: b"q"}
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    (src / ".hidden-tmp").write_bytes(b"never mirrored")
    code, report = mirror(tmp_path, str(src), f"gs://{gcs_bucket}/m")
    assert code == 0 and report["verified"] == 3
    assert_mirrored(gcs_server, gcs_bucket, files)


def test_mirror_into_a_local_folder(
    cloud_env: dict[str, str], b2: B2Double, tmp_path: Path
) -> None:
    files = seed(b2)
    dst = tmp_path / "mirror"
    code, report = mirror(tmp_path, "b2:src/v3", str(dst))
    assert code == 0 and report["verified"] == len(files)
    for name, data in files.items():
        assert (dst / name).read_bytes() == data
    assert (dst / INVENTORY_NAME).is_file()


def _cli(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "octstage.cli", *args],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # so the test can kill octstage and its rclone together
        **kwargs,
    )


def test_a_killed_mirror_resumes_and_verifies(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    files = {f"retinal_oct/p/{i:03d}/{i}.dcm": os.urandom(2000) for i in range(40)}
    for name, data in files.items():
        b2.put("src", f"v3/{name}", data)
    b2.download_delay = 0.1  # 40 objects, 2 at a time: about 2 s of copying
    args = ["mirror", "b2:src/v3", f"gs://{gcs_bucket}/m", "--transfers", "2"]
    proc = _cli(args, cloud_env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        copied = set(gcs_objects(gcs_server, gcs_bucket, "m")) - {INVENTORY_NAME}
        if len(copied) >= 4:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    copied = set(gcs_objects(gcs_server, gcs_bucket, "m")) - {INVENTORY_NAME}
    assert 4 <= len(copied) < len(files), "the kill must land half way"
    b2.download_delay = 0.0
    code, report = mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")
    assert code == 0 and report["failed"] == []
    assert report["plan"]["copy"] == len(files) - len(copied)
    assert report["verified"] == len(files) - report["plan"]["in_sync"]
    assert_mirrored(gcs_server, gcs_bucket, files)
    assert mirror(tmp_path, "b2:src/v3", f"gs://{gcs_bucket}/m")[1]["copied_bytes"] == 0


def test_no_credential_appears_in_any_output_or_written_file(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    seed(b2)
    b2.put("src", "v3/nosha.bin", b"x", sha1=False)
    b2.corrupt_downloads("v3/odd/with space.dcm")
    b2.inject("download", 503, count=1, name="v3/participants.tsv")
    outputs = []
    for args in (
        ["-v", "mirror", "b2:src/v3", f"gs://{gcs_bucket}/m", "--json", str(tmp_path / "r.json")],
        ["-v", "mirror", "b2:src/v3", f"gs://{gcs_bucket}/m", "--dry-run", "--prune"],
        ["-v", "mirror", "b2:src/missing", f"gs://{gcs_bucket}/m", "--prune"],
        ["-v", "stage", f"gs://{gcs_bucket}/m", str(tmp_path / "staged")],
    ):
        proc = _cli(args, cloud_env)
        out, err = proc.communicate(timeout=300)
        outputs += [out, err]
    written = [p.read_bytes().decode(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    for blob in gcs_objects(gcs_server, gcs_bucket, "m").values():
        written.append(blob.download_as_bytes().decode(errors="replace"))
        written.append(json.dumps(blob.metadata))
    secrets = b2.secrets()
    assert len(secrets) >= 3 and "Serving" not in "".join(outputs)
    for text in outputs + written:
        for secret in secrets:
            assert secret not in text
    assert "source lists no objects" in "".join(outputs)


# -- pure parts ---------------------------------------------------------------------------


def inv(*entries: tuple[str, int, str | None]) -> Inventory:
    return Inventory("b2://b/p", "2026-01-01T00:00:00+00:00", tuple(Entry(*e) for e in entries))


def test_plan_sorts_every_object_into_one_bucket() -> None:
    source = inv(
        ("new", 1, "a" * 40),
        ("resized", 2, "b" * 40),
        ("unverified-copy", 3, "c" * 40),
        ("verified", 4, "d" * 40),
        ("changed", 5, "e" * 40),
        ("no-sha1", 6, None),
    )
    held = [
        ObjectInfo("resized", 3),
        ObjectInfo("unverified-copy", 3),
        ObjectInfo("verified", 4, "d" * 40),
        ObjectInfo("changed", 5, "f" * 40),
        ObjectInfo("no-sha1", 6),
        ObjectInfo("stale", 1),
        ObjectInfo("_octstage/inventory.json", 9),
    ]
    plan = plan_mirror(source, held, prune=True)
    assert [e.name for e in plan.copy] == ["new", "resized", "changed"]  # inventory order
    assert [e.name for e in plan.verify] == ["unverified-copy"]
    assert [e.name for e in plan.unverifiable] == ["no-sha1"]
    assert [e.name for e in plan.in_sync] == ["verified"]
    assert plan.extra == plan.delete == ("stale",)
    assert plan_mirror(source, held, prune=False).delete == ()
    assert plan.counts()["copy_bytes"] == 1 + 2 + 5


def test_deletion_guard() -> None:
    plan = plan_mirror(inv(("a", 1, None)), [ObjectInfo(f"x{i}", 1) for i in range(3)], True)
    check_deletions(plan, source_objects=1, max_delete=3)
    with pytest.raises(MirrorError, match="more than --max-delete 2"):
        check_deletions(plan, source_objects=1, max_delete=2)
    with pytest.raises(MirrorError, match="lists no objects"):
        check_deletions(plan, source_objects=0, max_delete=100)
    check_deletions(plan_mirror(inv(), [], True), source_objects=0, max_delete=0)


def test_inventory_round_trips_and_excludes_its_own_folder() -> None:
    listing = [
        ObjectInfo("b", 2, "A" * 40),
        ObjectInfo("a/ü x", 1, None),
        ObjectInfo("_octstage/inventory.json", 5, None),
    ]
    made = inventory_from_listing(listing, "b2://b/p", "2026-01-01T00:00:00+00:00")
    assert [e.name for e in made.objects] == ["a/ü x", "b"]
    assert made.objects[1].sha1 == "a" * 40
    assert from_json(to_json(made), "x") == made
    with pytest.raises(MirrorError, match="format"):
        from_json(json.dumps({"format": "other"}), "x")
    with pytest.raises(MirrorError, match="not an octstage inventory"):
        from_json("[1, 2]", "x")


def test_rclone_arguments() -> None:
    config = copy_config(32, 64)
    assert config["Transfers"] == 32 and config["Checkers"] == 64 and config["UseListR"] is True
    assert "IgnoreTimes" not in config and copy_config(1, 1, ignore_times=True)["IgnoreTimes"]
    assert copy_config(4, 4, fast_list=False)["UseListR"] is False
    assert copy_filter() == {"ExcludeRule": ["_octstage/**"]}
    with pytest.raises(MirrorError):
        copy_config(0, 4)


def test_locations_from_environment_only_remotes() -> None:
    env = {
        "RCLONE_CONFIG": "/dev/null",
        "RCLONE_CONFIG_B2_TYPE": "b2",
        "RCLONE_CONFIG_B2_ACCOUNT": "kid-secret-1",
        "RCLONE_CONFIG_B2_KEY": "key-secret-2",
        "RCLONE_CONFIG_MYGCS_TYPE": "google cloud storage",
        "RCLONE_CONFIG_MYGCS_ANONYMOUS": "true",
        "OCTSTAGE_GCS_REMOTE": "mygcs",
    }
    b2 = parse_location("b2:bucket/v3/", env)
    assert (b2.kind, b2.bucket, b2.prefix, b2.rclone_fs, b2.url) == (
        "b2", "bucket", "v3", "b2:bucket/v3", "b2://bucket/v3",
    )  # fmt: skip
    assert "secret" not in repr(b2)
    gs = parse_location("gs://mirror/aireadi", env)
    assert (gs.kind, gs.rclone_fs) == ("gcs", "mygcs:mirror/aireadi")
    b2url = parse_location("b2://bucket", env)
    assert b2url.rclone_fs == "b2:bucket"
    local = parse_location("./some/folder", env)
    assert local.kind == "local" and Path(local.prefix).is_absolute()
    with pytest.raises(MirrorError, match="not configured"):
        parse_location("nosuch:bucket/x", env)
    with pytest.raises(MirrorError, match="on-the-fly"):
        parse_location(":b2,account=a,key=b:bucket", env)
    secrets = known_secrets([b2, gs], env)
    assert {"kid-secret-1", "key-secret-2"} <= set(secrets)
    assert scrub("auth kid-secret-1:key-secret-2 failed", secrets) == "auth ***:*** failed"


def test_scheme_urls_without_remotes_use_b2_variables_and_on_the_fly_roots(
    cloud_env: dict[str, str],
    b2: B2Double,
    gcs_server: GcsDouble,
    gcs_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``b2://`` with only B2_APPLICATION_KEY_ID/KEY (+ B2_ENDPOINT): rclone gets a ``:b2:`` root
    and its credentials through its environment, never its command line."""
    for key in [k for k in os.environ if k.startswith("RCLONE_CONFIG_B2_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("B2_APPLICATION_KEY_ID", b2.key_id)
    monkeypatch.setenv("B2_APPLICATION_KEY", b2.key)
    monkeypatch.setenv("B2_ENDPOINT", b2.endpoint)
    loc = parse_location("b2://src/v3")
    assert loc.remote is None and loc.rclone_fs == ":b2:src/v3"
    assert b2.key not in loc.rclone_fs and b2.key not in repr(loc)
    files = seed(b2)
    code, report = mirror(tmp_path, "b2://src/v3", f"gs://{gcs_bucket}/m")
    assert code == 0 and report["verified"] == len(files)
    assert_mirrored(gcs_server, gcs_bucket, files)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("gs://b/x", "gs://b/x/y"),
        ("gs://b", "gs://b/m"),
        ("/tmp/a/b", "/tmp/a"),
        ("b2:s/v", "gs://b/v"),
    ],
)
def test_overlapping_or_unsupported_locations_are_refused(
    src: str, dst: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RCLONE_CONFIG", "/dev/null")
    monkeypatch.setenv("RCLONE_CONFIG_B2_TYPE", "b2")
    monkeypatch.setenv("RCLONE_CONFIG_GCS_TYPE", "google cloud storage")
    if src.startswith("b2:"):
        src, dst = dst, src  # a B2 destination
    with pytest.raises(MirrorError, match=r"overlap|destination must be"):
        run_mirror(src, dst)


def test_remotes_from_the_rclone_config_file(tmp_path: Path) -> None:
    """A remote only in the config file (read with ``rclone config dump``), never echoed."""
    conf = tmp_path / "rclone.conf"
    conf.write_text("[archive]\ntype = b2\naccount = file-kid-123\nkey = file-key-456\n")
    env = {"RCLONE_CONFIG": str(conf), "PATH": os.environ.get("PATH", "")}
    loc = parse_location("archive:bucket/v3", env)
    assert (loc.kind, loc.rclone_fs, loc.url) == ("b2", "archive:bucket/v3", "b2://bucket/v3")
    assert loc.remote is not None and loc.remote.get("key") == "file-key-456"
    assert "file-key-456" not in repr(loc)
    assert {"file-kid-123", "file-key-456"} <= set(known_secrets([loc], env))
