"""build-cache on a cluster whose workers share no disk with the driver.

A dask scheduler and two workers run as separate processes (``tests/octstage/cluster.py``), each
in its own folder with no storage settings or credentials of its own. The driver is the real
``octstage build-cache`` command: sources come from the B2 double, the cache goes to a bucket of
fake-gcs-server or of the S3 emulator (moto in server mode), and what the workers need to reach
both travels with the run. The result is
then staged to a local folder and verified, and compared volume by volume with the local build
of the same files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from octstage import manifest as mf
from octstage.cachebuild.plan import software_mismatch
from octstage.storage import open_storage
from tests.doubles.b2_server import B2Double
from tests.octstage.build_helpers import SHAPE, Built
from tests.octstage.cluster import separate_cluster

OCTSTAGE = str(Path(sys.executable).parent / "octstage")
PARTICIPANTS = 3


def octstage(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OCTSTAGE, *args],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def upload_subset(built: Built, url: str) -> list[str]:
    """The label table, every file of the first few participants with a volume (and the
    files rejected among them) and their rows of the release's manifest.tsv (the regions come
    from it); returns the uploaded DICOM names."""
    pids = sorted({v.participant_id for v in built.manifest.volumes})[:PARTICIPANTS]
    names = sorted(
        p.relative_to(built.src).as_posix()
        for pid in pids
        for p in built.src.glob(f"retinal_oct/structural_oct/*/{pid}/*")
    )
    store = open_storage(url)
    for name in [*names, "participants.tsv"]:
        store.write_bytes(name, (built.src / name).read_bytes())
    tsv = (built.src / "retinal_oct/manifest.tsv").read_text().splitlines(keepends=True)
    column = tsv[0].rstrip("\n").split("\t").index("filepath")
    rows = [r for r in tsv[1:] if r.rstrip("\n").split("\t")[column].lstrip("/") in names]
    store.write_bytes("retinal_oct/manifest.tsv", "".join([tsv[0], *rows]).encode())
    return names


@pytest.mark.parametrize(
    "store",
    ["gs", pytest.param("s3", marks=pytest.mark.slow)],  # the same path, another SDK
)
def test_a_cluster_without_shared_disk_builds_into_a_bucket_then_stages_and_verifies(
    built: Built,
    cloud_env: dict[str, str],
    b2: B2Double,
    request: pytest.FixtureRequest,
    store: str,
    tmp_path: Path,
) -> None:
    source = "b2://src/aireadi"
    names = upload_subset(built, source)
    bucket_name = request.getfixturevalue(f"{'gcs' if store == 'gs' else 's3'}_bucket")
    cache = f"{store}://{bucket_name}/cache"
    client_dir = tmp_path / "client"
    client_dir.mkdir()
    shape = [str(s) for s in SHAPE]
    build = [
        "build-cache",
        "--source",
        source,
        "--labels",
        f"{source}/participants.tsv",
        "--out",
        cache,
        "--shape",
        *shape,
        "--progress-seconds",
        "0.5",
    ]
    with separate_cluster(tmp_path / "cluster") as cluster:
        first = octstage(
            *build, "--scheduler", cluster.address, "--json", "s1.json", cwd=client_dir
        )
        assert first.returncode in (0, 1), first.stderr[-3000:]
        again = octstage(
            *build, "--scheduler", cluster.address, "--json", "s2.json", cwd=client_dir
        )
        # A lost source index: B2's listed SHA1s rebuild it, no source is read again.
        open_storage(cache).delete("source-index.json")
        lost = octstage(*build, "--scheduler", cluster.address, "--json", "s3.json", cwd=client_dir)
        logs = cluster.log_text()
        worker_files = [p for d in cluster.worker_dirs for p in d.rglob("*") if p.is_file()]

    s1, s2, s3 = (json.loads((client_dir / f"s{n}.json").read_text()) for n in (1, 2, 3))
    assert 0 < s1["read"] <= len(names) and s1["built"] >= PARTICIPANTS
    assert (s2["read"], s2["decoded"], s2["built"]) == (0, 0, 0), s2
    assert (s3["read"], s3["decoded"], s3["reused"]) == (0, 0, s1["built"]), s3
    assert again.returncode == lost.returncode == first.returncode

    # The workers wrote to the bucket, not to their own disks, and the driver kept nothing.
    assert not [p for p in worker_files if p.suffix in (".json", ".png") or "zarr" in str(p)]
    assert sorted(p.name for p in client_dir.iterdir()) == ["s1.json", "s2.json", "s3.json"]

    # The same volumes, byte for byte, as the local build of the same files.
    bucket = open_storage(cache)
    remote = mf.from_dict(json.loads(bucket.read_bytes("manifest.json")), cache)
    local = {v.source_path: v for v in built.manifest.volumes if v.source_path in names}
    assert {v.source_path: v for v in remote.volumes} == local
    local_rejected = {r.source: r.reason for r in built.manifest.rejected if r.source in names}
    assert {r.source: r.reason for r in remote.rejected} == local_rejected
    assert bucket.stat("qc.png").size > 1000

    staged = tmp_path / "ssd"
    stage = octstage("stage", cache, str(staged), cwd=client_dir)
    assert stage.returncode == 0, stage.stderr[-3000:]
    verify = octstage("verify", str(staged / "manifest.json"), cwd=client_dir)
    assert verify.returncode == 0, verify.stdout[-3000:]

    # The keys reached the workers (they read the sources, wrote the cache) but no log, output
    # or file.
    outputs = [first, again, lost, stage, verify]
    for secret in (b2.key, cloud_env["AWS_SECRET_ACCESS_KEY"]):
        assert secret not in logs
        assert not any(secret in p.stdout + p.stderr for p in outputs)
        for name in ("manifest.json", "build-config.json", "source-index.json"):
            assert secret not in bucket.read_bytes(name).decode()


@pytest.mark.parametrize("bad", ["tcp://127.0.0.1:9"])
def test_an_unreachable_scheduler_is_refused_with_exit_2(
    built: Built, tmp_path: Path, bad: str
) -> None:
    result = octstage(
        "build-cache",
        "--source",
        str(built.src),
        "--labels",
        str(built.src / "participants.tsv"),
        "--out",
        str(tmp_path / "cache"),
        "--scheduler",
        bad,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "cannot reach the dask scheduler" in result.stderr


def test_workers_with_other_decoders_are_named_before_any_work() -> None:
    """Pure: a worker with another pydicom would write volumes under keys the driver never
    looks up, and mix two decoders' output in one cache."""
    driver = {"pydicom": "3.0.1", "pylibjpeg-openjpeg": "2.4.0"}
    same = {"tcp://a:1": dict(driver), "tcp://b:1": dict(driver)}
    assert software_mismatch(driver, same) == ""
    other = {**same, "tcp://b:1": {"pydicom": "3.0.2"}}
    why = software_mismatch(driver, other)
    assert "tcp://b:1" in why and "pydicom 3.0.2 (driver 3.0.1)" in why
    assert "pylibjpeg-openjpeg missing (driver 2.4.0)" in why and "tcp://a:1" not in why
