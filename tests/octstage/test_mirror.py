"""``octstage mirror``: the real rclone (rc daemon), b2sdk and google-cloud-storage, against the
B2 double and fake-gcs-server. The pure parts (plan, deletion guard, inventory, arguments,
locations, scrubbing) are tested without I/O in test_mirror_plan.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from octstage.cli import main as cli_main
from octstage.mirror.inventory import FORMAT, INVENTORY_NAME
from octstage.storage.locations import parse_location
from tests.doubles.b2_server import B2Double
from tests.doubles.gcs import GcsDouble, client_for
from tests.octstage.mirror_helpers import (
    MTIME,
    ODD_NAMES,
    assert_mirrored,
    cli_process,
    gcs_objects,
    mirror,
    seed,
)


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


def test_a_killed_mirror_resumes_and_verifies(
    cloud_env: dict[str, str], b2: B2Double, gcs_server: GcsDouble, gcs_bucket: str, tmp_path: Path
) -> None:
    files = {f"retinal_oct/p/{i:03d}/{i}.dcm": os.urandom(2000) for i in range(40)}
    for name, data in files.items():
        b2.put("src", f"v3/{name}", data)
    b2.download_delay = 0.1  # 40 objects, 2 at a time: about 2 s of copying
    args = ["mirror", "b2:src/v3", f"gs://{gcs_bucket}/m", "--transfers", "2"]
    proc = cli_process(args, cloud_env)
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
        proc = cli_process(args, cloud_env)
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


def test_without_a_terminal_progress_lines_are_printed(
    cloud_env: dict[str, str],
    b2: B2Double,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    files = seed(b2)
    monkeypatch.setenv("OCTSTAGE_PROGRESS_SECONDS", "0")  # captured stderr is no terminal
    code, _ = mirror(tmp_path, "b2:src/v3", str(tmp_path / "mirror"))
    assert code == 0
    err = capsys.readouterr().err
    assert "mirror copy: " in err and " MB" in err
    assert f"mirror verify: {len(files)}/{len(files)} (100%)" in err
    # A long interval: only the closing line of each phase.
    code, _ = mirror(tmp_path, "b2:src/v3", str(tmp_path / "again"), progress_seconds=3600)
    err = capsys.readouterr().err
    assert err.count("mirror verify: ") == 1 and err.count("mirror copy: ") == 1
