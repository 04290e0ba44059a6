"""build-cache's inputs and workers: source inventory, dask schedulers, a GCS bucket, spooling.

The inventory's SHA1 check, a build on an existing (or unreachable) scheduler and a bucket as
the source start from the shared build (``built`` in conftest.py); the spool test needs none.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from octstage import manifest as mf
from octstage.cachebuild import cluster as builddask
from octstage.cachebuild.run import run_build
from octstage.cachebuild.sourceindex import INDEX_NAME
from octstage.cli import main
from octstage.dataset.synth import SynthInfo
from octstage.errors import StorageError
from octstage.storage import LocalStorage
from tests.octstage.build_helpers import (
    CONFIG,
    OCT,
    Built,
    build,
    copy_cache,
    rejected,
)


def write_inventory(src: Path, path: Path, edit: dict[str, dict[str, Any] | None]) -> None:
    """An octstage-inventory/1 of every file under src; ``edit`` overrides or drops entries."""
    objects = []
    for f in sorted((src / OCT).rglob("*.dcm")):
        name = f.relative_to(src).as_posix()
        entry: dict[str, Any] = {
            "name": name,
            "size": f.stat().st_size,
            "sha1": hashlib.sha1(f.read_bytes()).hexdigest(),
        }
        if name in edit:
            change = edit[name]
            if change is None:
                continue
            entry.update(change)
        objects.append(entry)
    doc = {"format": "octstage-inventory/1", "source": str(src), "created": "", "objects": objects}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_sha1_mismatch_against_the_inventory_is_rejected(
    built: Built, tmp_path: Path, scheduler: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(built.src, src)
    cache = copy_cache(built, tmp_path / "cache")
    (cache / "manifest.json").unlink()  # the source moved: the way out build-cache names
    vols = built.manifest.volumes
    bad, no_sha1, wrong_size, absent = (v.source_path for v in vols[:4])
    edit: dict[str, dict[str, Any] | None] = {
        bad: {"sha1": "0" * 40},
        no_sha1: {"sha1": None},
        wrong_size: {"size": 1},
        absent: None,
    }
    write_inventory(src, src / "_octstage" / "inventory.json", edit)  # the default place
    _, summary = build(src, cache, scheduler=scheduler)
    reasons = rejected(mf.load(cache / "manifest.json"))
    assert reasons[bad].startswith("SHA1 mismatch: ") and "0" * 40 in reasons[bad]
    assert reasons[wrong_size].startswith("inventory: size ")
    assert no_sha1 not in reasons and absent not in reasons
    assert summary["unverified"] == 2 and summary["decoded"] == 0
    assert summary["volumes"] == len(vols) - 2
    assert summary["source_verification"] == "sha1-inventory"
    assert mf.load(cache / "manifest.json").header.config["source_verification"] == "sha1-inventory"

    # The same verdict when the file has to be read and hashed (no index), via --inventory.
    (cache / INDEX_NAME).unlink()
    elsewhere = tmp_path / "inventory.json"
    shutil.move(src / "_octstage" / "inventory.json", elsewhere)
    _, summary = build(src, cache, inventory=str(elsewhere), scheduler=scheduler)
    assert summary["read"] > 0 and summary["decoded"] == 0
    assert rejected(mf.load(cache / "manifest.json"))[bad] == reasons[bad]


def test_without_an_inventory_every_source_counts_as_unverified(built: Built) -> None:
    assert built.summary["source_verification"] == "none"
    assert built.manifest.header.config["source_verification"] == "none"
    # Every file that reached the SHA1 check had nothing to be checked against.
    assert built.summary["unverified"] >= len(built.manifest.volumes)


@pytest.mark.parametrize("damage", ["not JSON", "malformed entry", "unreadable", "backend error"])
def test_a_damaged_inventory_stops_the_build_unless_told_not_to_verify(
    built: Built,
    tmp_path: Path,
    scheduler: str,
    damage: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = tmp_path / "src"
    shutil.copytree(built.src, src)
    cache = copy_cache(built, tmp_path / "cache")  # reused volumes: only the verdict matters
    (cache / "manifest.json").unlink()
    inventory = src / "_octstage" / "inventory.json"
    inventory.parent.mkdir()
    if damage == "not JSON":
        inventory.write_text('{"format": "octstage-inventory/1", "objects": [')  # cut short
    elif damage == "malformed entry":
        inventory.write_text(json.dumps({"format": "octstage-inventory/1", "objects": [{}]}))
    elif damage == "unreadable":
        inventory.mkdir()  # exists, but reading it fails (EISDIR; permissions would not stop root)
    else:  # a bucket answering 503: once read as "no inventory", every SHA1 check skipped
        inventory.write_text("{}")
        real = LocalStorage.read_bytes

        def failing(self: LocalStorage, name: str) -> bytes:
            if name.endswith("inventory.json"):
                raise StorageError(f"{self.url}/{name}: ServiceUnavailable: 503")
            return real(self, name)

        monkeypatch.setattr(LocalStorage, "read_bytes", failing)
    argv = ["build-cache", "--source", str(src), "--out", str(cache), "--scheduler", scheduler]
    argv += ["--labels", str(src / "participants.tsv"), "--manifest", str(cache / "manifest.json")]
    argv += ["--shape", *(str(s) for s in CONFIG.shape)]
    assert main(argv) == 2
    said = "".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert str(inventory).replace(" ", "") in said and "--no-verify-sources" in said
    assert not (cache / "manifest.json").exists()

    assert main([*argv, "--no-verify-sources"]) == 1
    m = mf.load(cache / "manifest.json")
    assert m.header.config["source_verification"] == "none"
    assert m.volumes == built.manifest.volumes


def test_fresh_build_on_an_existing_scheduler_matches(
    built: Built, cluster: Any, tmp_path: Path
) -> None:
    done = cluster.scheduler.task_prefixes
    before = done["run_task"].state_counts["memory"] if "run_task" in done else 0
    code, summary = build(built.src, tmp_path / "cache", scheduler=cluster.scheduler_address)
    assert code == 1 and summary["built"] == len(built.manifest.volumes)
    # The cluster's own workers ran every file (the driver started no cluster of its own)...
    assert done["run_task"].state_counts["memory"] - before == summary["read"]
    # ...and produced exactly the same volumes (same keys, same checksums) and rejections.
    m = mf.load(tmp_path / "cache" / "manifest.json")
    assert m.volumes == built.manifest.volumes and m.rejected == built.manifest.rejected


def test_unreachable_scheduler_is_refused_with_exit_2(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(builddask, "SCHEDULER_TIMEOUT", "2s")
    cache = tmp_path / "cache"
    argv = ["build-cache", "--source", str(built.src), "--out", str(cache)]
    argv += ["--labels", str(built.src / "participants.tsv")]
    argv += ["--manifest", str(cache / "manifest.json")]
    argv += ["--shape", "8", "32", "32", "--scheduler", f"tcp://127.0.0.1:{port}"]
    assert main(argv) == 2
    assert not (cache / "manifest.json").exists()


# ---- a bucket as the source ----------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_build_from_a_bucket_matches_the_local_build(
    built: Built,
    synth_info: SynthInfo,
    cloud_env: dict[str, str],
    request: pytest.FixtureRequest,
    scheme: str,
    tmp_path: Path,
) -> None:
    """Workers stream from fake-gcs-server (google-cloud-storage) or the S3 double (s3fs),
    spooled to a temp file: the same volumes and rejections as locally; a re-run reuses by the
    listed size and MD5 without reading or decoding."""
    from octstage.storage import open_storage

    # A few participants' files (good ones and traps), the labels and the release's
    # manifest.tsv (which gives the volumes their regions), uploaded to the bucket.
    keep = set(synth_info.labelled[:12])
    names = [f for f in synth_info.files if f.split("/")[-2] in keep]
    bucket_name = request.getfixturevalue("gcs_bucket" if scheme == "gs" else "s3_bucket")
    url = f"{scheme}://{bucket_name}/aireadi"
    bucket = open_storage(url)
    for name in [*names, "participants.tsv", "retinal_oct/manifest.tsv"]:
        bucket.write_bytes(name, (built.src / name).read_bytes())
    cache = tmp_path / "cache"
    code = run_build(url, f"{url}/participants.tsv", cache, cache / "m.json", CONFIG, workers=1)
    assert code == 1
    m = mf.load(cache / "m.json")
    local = {v.source_path: v for v in built.manifest.volumes if v.source_path in set(names)}
    assert local and {v.source_path: v for v in m.volumes} == local
    local_rejected = {r.source: r.reason for r in built.manifest.rejected if r.source in names}
    assert {r.source: r.reason for r in m.rejected} == local_rejected
    assert m.header.dataset == url

    summary_path = tmp_path / "again.json"
    run_build(
        url, f"{url}/participants.tsv", cache, cache / "m.json", CONFIG, json_out=summary_path
    )
    summary = json.loads(summary_path.read_text())
    assert (summary["read"], summary["decoded"], summary["reused"]) == (0, 0, len(local))


def test_spool_hashes_in_one_pass_and_notices_a_rewrite(tmp_path: Path) -> None:
    from octstage.cachebuild.task import spooled
    from octstage.storage import LocalStorage

    data = bytes(range(256)) * 50_000  # several read chunks
    (tmp_path / "a.dcm").write_bytes(data)
    with spooled(LocalStorage(tmp_path), "a.dcm") as spool:
        assert spool.sha1 == hashlib.sha1(data).hexdigest() and spool.size == len(data)
        assert spool.unchanged()
        path = tmp_path / "a.dcm"
        path.write_bytes(data[::-1])  # same size, new bytes
        os.utime(path, ns=(0, path.stat().st_mtime_ns + 1))
        assert not spool.unchanged()  # its SHA1 no longer describes what a decode would read
