"""The Cell Painting build on a dask cluster: one task per plate (``cellpainting.platetask``).

The twin is read from the S3 double by a scheduler and two workers that run as separate
processes with no storage settings or credentials of their own (``tests/octstage/cluster.py``):
what they need travels with the run. The cluster's cache (built into a bucket of the S3 double,
then staged and verified) must equal the one-process build's
(every manifest item, checksums included, and the rejections); a worker killed mid-plate (SIGKILL
from inside its own write, a real death of a real process) must leave a complete, verified cache
with nothing half-written listed or left behind. A local cluster (``--processes 2``) gives the
same manifest through the command line.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from distributed.diagnostics.plugin import WorkerPlugin

from octstage import manifest as mf
from octstage.cache.verify import verify
from octstage.cellpainting.build import build
from octstage.cellpainting.plate import BuildReport
from octstage.cellpainting.platetask import PlateTask, plate_failed
from octstage.cellpainting.synth import TwinInfo
from octstage.cli import main
from octstage.stage import run_stage
from tests.octstage.cluster import Cluster, separate_cluster

# The workers have no tests package on their path: this module's plugin travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
KILL_AFTER = 3  # fields a worker writes of its first plate before it is killed


class DieMidPlate(WorkerPlugin):
    """The first worker to have written ``after`` fields' data: SIGKILL itself inside that
    write, its field's chunks in the hidden folder and not yet renamed into place, once (the
    marker file, created exclusively, says who died and in which plate)."""

    def __init__(self, marker: str, after: int) -> None:
        self.marker, self.after = marker, after

    def setup(self, worker: Any) -> None:
        from octstage.cache import volumestore

        original = volumestore._fsync_tree
        marker, after = self.marker, self.after
        written = itertools.count(1)
        lock = threading.Lock()

        def fsync_then_die(tmp: Path) -> None:
            original(tmp)
            with lock:
                if next(written) != after:
                    return
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    return  # a worker died already: this one lives
                died = {"pid": os.getpid(), "plate": tmp.parent.name, "tmp": str(tmp)}
                os.write(fd, json.dumps(died).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)

        volumestore._fsync_tree = fsync_then_die


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with separate_cluster(tmp_path_factory.mktemp("cp-cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def local_build(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path_factory: pytest.TempPathFactory
) -> mf.Manifest:
    """The one-process build of the twin from the S3 double, every other build's reference."""
    root, info = twin
    folder = tmp_path_factory.mktemp("cp-local")
    report, built = build(s3_twin, folder, metadata=str(root.parent / info.metadata))
    assert len(report.rejected) == 1 and not report.environment  # the planted bad TIFF
    return built.load()


def test_plates_on_a_cluster_of_two_workers_build_the_local_cache(
    s3_twin: str,
    s3_bucket: str,
    twin: tuple[Path, TwinInfo],
    cluster: Cluster,
    local_build: mf.Manifest,
    tmp_path: Path,
) -> None:
    """Into a bucket of the S3 double: the workers write it with keys that reach them only
    through the run (their own environment has none)."""
    root, info = twin
    cache = f"s3://{s3_bucket}/cluster-cache"
    report, built = build(
        s3_twin,
        cache,
        metadata=str(root.parent / info.metadata),
        scheduler=cluster.address,
        manifest_path=tmp_path / "m.json",
    )
    m = built.load()
    assert (report.written, report.kept, report.environment) == (info.fields - 1, 0, [])
    assert m.fields == local_build.fields and m.rejected == local_build.rejected
    assert m.header.counts == local_build.header.counts
    assert run_stage(cache, tmp_path / "staged") == 0
    assert verify(tmp_path / "staged" / "manifest.json").ok
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in cluster.log_text()


def test_a_worker_killed_mid_plate_leaves_a_complete_verified_cache(
    s3_twin: str,
    twin: tuple[Path, TwinInfo],
    cluster: Cluster,
    local_build: mf.Manifest,
    tmp_path: Path,
) -> None:
    from dask.distributed import Client

    root, info = twin
    marker = tmp_path / "killed.json"
    with Client(cluster.address, timeout="30s") as client:
        client.register_plugin(DieMidPlate(str(marker), KILL_AFTER), name="die-mid-plate")
        try:
            out = tmp_path / "cache"
            report, built = build(
                s3_twin,
                out,
                metadata=str(root.parent / info.metadata),
                scheduler=cluster.address,
                workers=1,  # one field at a time: the kill comes after exactly KILL_AFTER
            )
        finally:
            client.unregister_worker_plugin("die-mid-plate")
            client.wait_for_workers(2, timeout=60)  # the nanny's restart, for the next test
    killed = json.loads(marker.read_text())  # a worker did die, mid-plate, mid-field
    plate_fields = sum(1 for f in local_build.fields if f.plate == killed["plate"])
    assert plate_fields > KILL_AFTER
    m = built.load()
    # Its plate ran again elsewhere: every field listed, as the local build lists them.
    assert not report.environment and not report.plates_left_out
    assert m.fields == local_build.fields and m.rejected == local_build.rejected
    assert report.written + report.kept == len(m.fields)
    result = verify(out / "manifest.json")
    assert result.ok and result.verified == len(m.fields), result
    # The dead worker's half-written field was dropped (under the build's lock) once every plate
    # had ended, and its field written again by the plate's second run.
    assert not Path(killed["tmp"]).exists() and not result.temporaries


def test_a_local_cluster_of_processes_gives_the_same_manifest(
    s3_twin: str, twin: tuple[Path, TwinInfo], local_build: mf.Manifest, tmp_path: Path
) -> None:
    root, info = twin
    args = ["build-cache", "--kind", "cellpainting", "--source", s3_twin,
            "--out", str(tmp_path / "cache"), "--metadata", str(root.parent / info.metadata),
            "--processes", "2", "--progress-seconds", "0"]  # fmt: skip
    assert main(args) == 1  # the planted bad TIFF, as the one-process build
    m = mf.load(tmp_path / "cache" / "manifest.json")
    assert m.fields == local_build.fields and m.rejected == local_build.rejected


def test_a_plate_whose_task_failed_for_good_is_left_out_to_retry() -> None:
    task = PlateTask(4, "P1", "train", (), {}, "s3://b/x", False, "/c", None, 2, 2, 1)  # type: ignore[arg-type]
    done = plate_failed(task, RuntimeError("KilledWorker: worker tcp://127.0.0.1:1 died"))
    report = BuildReport(written=3)
    report.merge(done.report)
    assert (done.index, done.contents, done.tally.fields) == (4, b"", 0)
    assert report.plates_left_out == ["P1"] and report.written == 3
    assert report.environment[0]["source"] == "P1"
    assert (
        "environment: worker failed: RuntimeError: KilledWorker" in report.environment[0]["reason"]
    )


def test_plates_from_many_workers_join_the_spool_in_plate_order() -> None:
    def part(plate: str, n: int) -> tuple[bytes, mf.FieldTally]:
        with mf.FieldSpool() as one:
            spool = one.plate()
            for k in range(n):
                spool.add(_field(plate, k))
            spool.commit()
            return one.contents(), one.tally

    with mf.FieldSpool() as spool:
        a, b, c = part("A", 2), part("B", 0), part("C", 1)
        spool.put(2, *c)
        spool.put(0, *a)
        assert [r["plate"] for r in spool.rows()] == ["A", "A"]  # C waits for B
        spool.put(1, b"", b[1])
        assert [r["item_id"] for r in spool.rows()] == ["A-0", "A-1", "C-0"]
        assert spool.tally.fields == 3 and spool.tally.by_plate == {"A": 2, "C": 1}


def _field(plate: str, k: int) -> mf.Field:
    return mf.Field(
        item_id=f"{plate}-{k}", split="train", label=None, zarr_path=f"fields/{plate}/{k}.ome.zarr",
        shape=(5, 8, 8), dtype="uint8", checksum="0" * 64, cache_key=f"{k:032d}", sources=(),
        source="source_4", batch="b", plate=plate, well="A01", site=1,
        channels=("DNA", "ER", "RNA", "AGP", "Mito"), perturbation="", perturbation_type="",
        is_control=False, normalization=(), illum=(), source_dtype="uint16", intensity=None,
        pack_index=None,
    )  # fmt: skip
