"""A Cell Painting cache built straight into a bucket (``--out gs://...`` / ``s3://...``), as
the OCT build does: the twin is read from the S3 double, the fields are written into
fake-gcs-server or the S3 double, the manifest last; ``stage`` then ``verify`` pass, the staged
fields read back (zarr, a second reader) equal to a folder build of the same source, and a
re-run keeps every field instead of uploading it again."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import zarr

from octstage import manifest as mf
from octstage.cache.verify import verify
from octstage.cache.volumestore import array_checksum
from octstage.cellpainting.build import build
from octstage.cellpainting.synth import TwinInfo
from octstage.cli import main
from octstage.stage import run_stage
from octstage.storage import open_storage
from tests.doubles.fixtures import clear_client_caches
from tests.doubles.gcs import GcsDouble


@pytest.fixture
def bucket_url(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, s3_twin: str
) -> str:
    """A fresh cache prefix in fake-gcs-server (``gs``) or the S3 double (``s3``)."""
    scheme: str = request.param
    if scheme == "gs":
        server: GcsDouble = request.getfixturevalue("gcs_server")
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        clear_client_caches()
        return f"gs://{request.getfixturevalue('gcs_bucket')}/cp/cache"
    return f"s3://{request.getfixturevalue('s3_bucket')}/cp/cache"


@pytest.mark.parametrize("bucket_url", ["gs", "s3"], indirect=True)
def test_a_cellpainting_cache_builds_into_a_bucket_stages_and_verifies(
    s3_twin: str,
    twin: tuple[Path, TwinInfo],
    bucket_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, info = twin
    meta = str(root.parent / info.metadata)
    folder = tmp_path / "folder"
    local = build(s3_twin, folder, metadata=meta)[1].load()
    # No scratch: nothing lands in the machine's temp folder.
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    args = ["build-cache", "--kind", "cellpainting", "--source", s3_twin, "--out", bucket_url,
            "--metadata", meta, "--manifest", str(tmp_path / "m.json")]  # fmt: skip
    assert main([*args, "--json", str(tmp_path / "first.json")]) == 1  # the planted bad TIFF
    assert list(scratch_root.iterdir()) == []
    first = json.loads((tmp_path / "first.json").read_text())
    assert (first["written"], first["kept"]) == (info.fields - 1, 0)

    # The manifest went to --manifest and, last, into the bucket, where stage looks for it.
    bucket = open_storage(bucket_url)
    assert bucket.read_bytes("manifest.json") == (tmp_path / "m.json").read_bytes()
    m = mf.load(tmp_path / "m.json")
    assert m.kind == "cellpainting" and len(m.fields) == info.fields - 1
    assert m.fields == local.fields and m.rejected == local.rejected  # the folder build's fields
    names = {o.name for o in bucket.list()}
    paths = {f.zarr_path for f in m.fields}
    stray = {n for n in names if n.partition(".ome.zarr/")[0] + ".ome.zarr" not in paths}
    assert stray == {"manifest.json"}  # the fields and the manifest, no scratch
    assert all(f"{p}/zarr.json" in names for p in paths)

    staged = tmp_path / "staged"
    assert run_stage(bucket_url, staged) == 0
    report = verify(staged / "manifest.json")
    assert report.ok and report.verified == len(m.fields)
    for f in m.fields:
        got = np.asarray(zarr.open_array(str(staged / f.array_path), mode="r")[...])
        want = np.asarray(zarr.open_array(str(folder / f.array_path), mode="r")[...])
        assert np.array_equal(got, want) and array_checksum(got) == f.checksum

    # A re-run keeps every field: nothing is uploaded again (GCS gives each write a new
    # generation; S3's version is its ETag, the MD5 of identical bytes, so the count says it).
    versions = {o.name: o.version for o in bucket.list("fields/")}
    assert all(versions.values())
    assert main([*args, "--json", str(tmp_path / "again.json")]) == 1
    again = json.loads((tmp_path / "again.json").read_text())
    assert (again["written"], again["kept"]) == (0, info.fields - 1)
    assert {o.name: o.version for o in bucket.list("fields/")} == versions
    assert mf.load(tmp_path / "m.json").fields == m.fields
