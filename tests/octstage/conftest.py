"""Fixtures for octstage tests: the synthetic dataset, one shared build, a dask cluster and the
Cell Painting twin (in a folder and in the S3 double)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from octstage.dataset.synth import SynthInfo, generate

if TYPE_CHECKING:
    from octstage.cellpainting.synth import TwinInfo
    from tests.doubles.s3 import S3Double
    from tests.octstage.build_helpers import Built


@pytest.fixture(scope="session")
def synth_info(tmp_path_factory: pytest.TempPathFactory) -> SynthInfo:
    """The default dataset (60 participants, seed 0, small) and what was planted in it."""
    return generate(tmp_path_factory.mktemp("synth") / "aireadi")


@pytest.fixture(scope="session")
def synth_root(synth_info: SynthInfo) -> Path:
    """Root of the default dataset: participants.tsv and retinal_oct/ (treat as read-only)."""
    return synth_info.root


# ---- build-cache: shared by test_build*.py --------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A real dask cluster on loopback (2 worker processes) that the re-run tests share; the
    first build (``built``) starts its own LocalCluster instead, so both paths are exercised."""
    from dask.distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # loopback, any free port: 8787 may be taken
    ) as cluster:
        yield cluster


@pytest.fixture
def scheduler(cluster: Any) -> str:
    return str(cluster.scheduler_address)


@pytest.fixture(scope="session")
def built(synth_info: SynthInfo, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """One build of a copy of the default dataset (plus pydicom's broken files), shared read-only
    by test_build*.py: tests that change a source, the labels or the parameters work on copies."""
    import pydicom.data

    from octstage import manifest as mf
    from tests.octstage.build_helpers import OCT, PYDICOM_FILES, Built, build

    base = tmp_path_factory.mktemp("build")
    src = base / "src"
    shutil.copytree(synth_info.root, src)
    pid = synth_info.verified[-1]
    folder = next((src / OCT).glob(f"*/{pid}"))
    test_files = Path(pydicom.data.get_testdata_file("CT_small.dcm")).parent  # type: ignore[arg-type]
    planted = {}
    for n, (fname, pattern) in enumerate(PYDICOM_FILES.items()):
        stem = fname.removesuffix(".dcm").lower().replace("_", "")
        target = folder / f"{pid}_pydicom_{stem}_r_1.2.826.0.1.3680043.8.498.99.{n}.dcm"
        shutil.copyfile(test_files / fname, target)
        planted[target.relative_to(src).as_posix()] = pattern
    cache = base / "cache"
    code, summary = build(src, cache)
    manifest = mf.load(cache / "manifest.json")
    return Built(src, cache, cache / "manifest.json", manifest, summary, code, planted)


# ---- the Cell Painting twin: shared by test_cellpainting*.py --------------------------------

CP_PLATES, CP_SITES, CP_SIZE = 2, 1, 64


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TwinInfo]:
    """A small twin of the release (its planted truncated TIFF included) in a local folder:
    returns the dataset root (``.../cpg0016-jump``, holding ``source_4/`` and ``source_10/``) and
    what it holds; its tables' URLs name a bucket of its own (``info.bucket``), where
    ``s3_twin`` uploads it, and its datasets metadata is ``root.parent / info.metadata``."""
    from octstage.cellpainting.synth import generate as generate_cp

    out = tmp_path_factory.mktemp("cp")
    bucket = f"cpg-twin-{uuid.uuid4().hex[:8]}"
    info = generate_cp(
        out, plates=CP_PLATES, sites=CP_SITES, size=CP_SIZE, seed=3, replicates=1, bucket=bucket
    )
    return out / info.dataset, info


@pytest.fixture(scope="module")
def s3_twin(s3_server: S3Double, twin: tuple[Path, TwinInfo]) -> Iterator[str]:
    """The twin uploaded to the bucket its tables name; yields its ``s3://.../cpg0016-jump``
    root (AWS_* point at the double while the module's tests run)."""
    from tests.doubles.fixtures import clear_client_caches

    root, info = twin
    s3_server.create_bucket(info.bucket)
    client = s3_server.client()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        client.put_object(
            Bucket=info.bucket,
            Key=f"{info.dataset}/{path.relative_to(root)}",
            Body=path.read_bytes(),
        )
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        clear_client_caches()
        yield f"s3://{info.bucket}/{info.dataset}"
        clear_client_caches()
