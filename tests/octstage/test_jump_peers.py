"""The Cell Painting Gallery's own tools read the twin as they read the release (slow tier).

- jump-portrait 0.1.1 builds its image index from every plate's ``load_data_with_illum`` table
  (``Metadata_*`` and the absolute ``URL_Orig<Channel>`` URLs) joined with ``well.csv.gz``, and
  GETs each image unsigned from ``cellpainting-gallery``: every field octstage stages from the S3
  double is fetched by it, pixel for pixel the source's.
- cpgdata 0.6.0's key grammar (``key_parser.lark``) accepts every key of the twin (a plate per
  microscope: Phenix, CV8000, Phenix in ``Measurement 1``, ImageXpress), except the CV8000
  image keys, which it rejects exactly as it rejects the release's own CV8000 keys (the release
  stores them with no ``Images/`` level: the grammar's gap, not the twin's).

jump-portrait and cpgdata are installed with --no-deps (``make test-slow``: pyproject's
``peers``). ``jump_portrait.fetch`` imports broad-babel, which downloads a name database from
zenodo on import; its name lookup is not what is tested here, so an empty module stands in for
it and everything called is jump-portrait's own code.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from octstage.cellpainting.build import build
from octstage.cellpainting.normalize import decode_tiff
from octstage.cellpainting.synth import BUCKET, TwinInfo, generate
from tests.doubles.fixtures import clear_client_caches
from tests.doubles.s3 import S3Double

pytestmark = pytest.mark.slow
# A key of the release itself (source_2, a CV8000), as a peer's script lists it.
RELEASE_CV8000_KEY = (
    "cpg0016-jump/source_2/images/20210607_Batch_2/images/1053601756/"
    "1053601756_A01_T0001F001L01A06Z01C06.tif"
)


@pytest.fixture(scope="module")
def gallery(
    s3_server: S3Double, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, TwinInfo]]:
    """The unmodified twin, uploaded to ``cellpainting-gallery`` as the demo uploads it, made
    public as the gallery is (policy; public-read ACLs because moto checks HEAD against them)."""
    out = tmp_path_factory.mktemp("gallery")
    info = generate(out, plates=4, sites=2, size=48, seed=5, replicates=2)  # every microscope
    client = s3_server.client()
    client.create_bucket(Bucket=BUCKET)
    statement = {
        "Effect": "Allow",
        "Principal": "*",
        "Action": ["s3:GetObject", "s3:ListBucket"],
        "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
    }
    policy = {"Version": "2012-10-17", "Statement": [statement]}
    client.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(policy))
    root = out / info.dataset
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = f"{info.dataset}/{path.relative_to(root)}"
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes(), ACL="public-read")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        clear_client_caches()
        yield out, info
        clear_client_caches()


def _jump_portrait() -> Any:
    pytest.importorskip("jump_portrait", reason="make test-slow installs the peers")
    for name in ("broad_babel", "broad_babel.query", "broad_babel.data"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["broad_babel.data"].get_table = None  # type: ignore[attr-defined]
    sys.modules["broad_babel"].query = sys.modules["broad_babel.query"]  # type: ignore[attr-defined]
    from jump_portrait import fetch

    return fetch


def test_jump_portrait_fetches_every_field_octstage_stages(
    gallery: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pv
    import pyarrow.parquet as pq

    fetch = _jump_portrait()
    out, info = gallery
    m = build(
        f"s3://{BUCKET}/{info.dataset}", tmp_path / "cache", metadata=str(out / info.metadata)
    )[1].load()
    assert len(m.fields) == info.fields - 1 and len(m.rejected) == 1  # the planted bad TIFF
    # jump-portrait's index: the plates' load_data_with_illum tables, joined with well.csv.gz.
    tables = [pq.read_table(out / info.dataset / t) for t in info.load_data if t.endswith("quet")]
    index = pa.concat_tables(tables)
    wells = pv.read_csv(
        io.BytesIO(gzip.decompress((out / info.metadata / "well.csv.gz").read_bytes()))
    )
    index = index.join(wells, ["Metadata_Source", "Metadata_Plate", "Metadata_Well"])
    index = index.append_column("standard_key", pc.cast(index["Metadata_JCP2022"], pa.string()))
    staged = {(f.source, f.plate, f.well, f.site) for f in m.fields}
    keep = [
        (s, p, w, int(t)) in staged
        for s, p, w, t in zip(
            *(index[c].to_pylist() for c in ("Metadata_Source", "Metadata_Plate",
                                              "Metadata_Well", "Metadata_Site")),
            strict=True,
        )
    ]  # fmt: skip
    dicts, images = fetch.get_jump_image_batch(index.filter(pa.array(keep)))
    got = {
        (d["Metadata_Source"], d["Metadata_Plate"], d["Metadata_Well"], d["Metadata_Site"],
         d["Metadata_Channel"]): img
        for d, img in zip(dicts, images, strict=True)
    }  # fmt: skip
    want = {
        (f.source, f.plate, f.well, f.site, s.channel): s.path for f in m.fields for s in f.sources
    }
    assert set(got) == set(want)  # fields fetched == fields staged, every channel
    for key, path in want.items():
        source = decode_tiff((out / info.dataset / path).read_bytes(), path)
        assert np.array_equal(np.asarray(got[key]), source), key


def test_cpgdata_parses_every_key_but_the_cv8000_images_as_it_does_the_release(
    gallery: tuple[Path, TwinInfo], s3_server: S3Double
) -> None:
    pytest.importorskip("cpgdata", reason="make test-slow installs the peers")
    from cpgdata.parser import key_parser
    from lark.exceptions import LarkError

    _, info = gallery
    keys = [
        o["Key"]
        for page in s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        for o in page.get("Contents", [])
    ]
    assert len(keys) == info.tiffs + len(info.load_data) + 5 * len(info.plates)
    rejected = []
    for key in keys:
        try:
            key_parser.parse(key)
        except LarkError:
            rejected.append(key)
    cv8000 = [k for k in keys if k.endswith(".tif") and "/source_10/images/" in k]
    assert cv8000 and sorted(rejected) == sorted(cv8000)
    with pytest.raises(LarkError):  # the release's own CV8000 keys: the same
        key_parser.parse(RELEASE_CV8000_KEY)
    # What it parses, it parses whole: source, batch, plate folder and file as the twin wrote.
    phenix = [k for k in keys if k.endswith(".tiff")]
    assert any("-Measurement 1/Images/" in k for k in phenix)  # source_3's spelling
    imagexpress = [k for k in keys if "/Images/HTS_" in k]
    assert imagexpress and all("/source_8/" in k for k in imagexpress)
    for key in phenix + imagexpress:
        parts = {
            t.data: "".join(str(v) for v in t.scan_values(lambda _: True))
            for t in key_parser.parse(key).iter_subtrees()
        }
        _, source, _, batch, _, folder, images, leaf = key.split("/")
        assert images == "Images" and parts["source_id"] == source
        assert (parts["batch_id"], parts["plate_id"]) == (batch, folder)
        assert parts["filename"] + "." + parts["extension"] == leaf
