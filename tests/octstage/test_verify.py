"""verify: checksums recomputed, missing / changed / extra volumes found, schema checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from octstage import manifest as mf
from octstage.cache import volumestore
from octstage.cache.verify import SCHEMA, validate_schema, verify
from octstage.cli import main
from octstage.config import BuildConfig
from octstage.dataset.labels import STUDY_GROUPS
from tests.octstage.chunk_damage import flip_decodable
from tests.octtrain.cell_cache import write_cell_cache


def make_cache(root: Path, n: int = 3) -> Path:
    """A small real cache (volumes written by volumestore) and its manifest, without a build."""
    rng = np.random.default_rng(0)
    volumes = []
    for i in range(n):
        pid, key = ("1001", "4002", "7003")[i % 3], f"{i:032x}"
        array = rng.integers(0, 256, size=(4, 8, 8), dtype=np.uint8)
        rel = volumestore.volume_relpath(pid, key)
        checksum = volumestore.write_volume(root, rel, array, (0.1, 0.01, 0.01), {"device": "d"})
        volumes.append(
            mf.Volume(
                participant_id=pid,
                device="topcon_triton",
                laterality="L",
                protocol="triton_3d_macula_oct",
                split="train",
                study_group=STUDY_GROUPS[i % 4],
                label=i % 4,
                source_path=f"retinal_oct/structural_oct/topcon_triton/{pid}/{pid}_x_l_1.2.{i}.dcm",
                source_sha1=f"{i:040x}",
                source_size=100,
                transfer_syntax="1.2.840.10008.1.2.1",
                source_shape=(8, 16, 16),
                spacing_mm=(0.05, 0.005, 0.005),
                zarr_path=rel,
                shape=(4, 8, 8),
                dtype="uint8",
                normalization=mf.Normalization(1.0, 99.0, 2.0, 250.0),
                checksum=checksum,
                cache_key=key,
            )
        )
    config = BuildConfig(shape=(4, 8, 8))
    header = mf.Header(
        dataset="test",
        created="2026-01-01T00:00:00Z",
        code_version="test",
        cache_version=mf.CACHE_VERSION,
        config_hash=config.params_hash(),
        config=config.as_dict(),
        counts=mf.count_summary(volumes, 0),
    )
    path = root / "manifest.json"
    mf.write(mf.Manifest(header, STUDY_GROUPS, tuple(volumes), ()), path)
    return path


def test_clean_cache_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_cache(tmp_path)
    report = verify(path)
    assert report.ok and report.verified == 3 and report.schema == "valid"
    assert main(["verify", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["verified"] == 3
    assert {"missing", "changed", "extra", "schema", "schema_errors"} <= set(out)


def test_one_changed_voxel_is_found(tmp_path: Path) -> None:
    path = make_cache(tmp_path)
    target = mf.load(path).volumes[1]
    arr = zarr.open_array(store=str(tmp_path / target.array_path), mode="r+")
    arr[2, 3, 4] = (int(arr[2, 3, 4]) + 1) % 256
    report = verify(path)
    assert not report.ok and report.verified == 2
    assert [c["zarr_path"] for c in report.changed] == [target.zarr_path]
    assert "checksum" in report.changed[0]["why"]
    assert main(["verify", str(path)]) == 1


def test_missing_extra_and_leftover_temporaries(tmp_path: Path) -> None:
    path = make_cache(tmp_path)
    volumes = mf.load(path).volumes
    shutil.rmtree(tmp_path / volumes[0].zarr_path)
    extra = tmp_path / "volumes" / "1001" / ("f" * 32 + ".ome.zarr")
    shutil.copytree(tmp_path / volumes[1].zarr_path, extra)
    report = verify(path)
    assert report.missing == [volumes[0].zarr_path]
    assert report.extra == [extra.relative_to(tmp_path).as_posix()]
    assert not report.ok
    # A killed build's hidden temporary is reported but is no problem: it is not a volume.
    shutil.rmtree(extra)
    (tmp_path / volumes[0].zarr_path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "volumes" / "1001" / ".tmp-x.ome.zarr-1234").mkdir()
    report = verify(path)
    assert report.temporaries == ["volumes/1001/.tmp-x.ome.zarr-1234"]
    assert report.extra == [] and report.missing == [volumes[0].zarr_path]


def test_shape_disagreeing_with_the_manifest_is_a_change(tmp_path: Path) -> None:
    path = make_cache(tmp_path)
    data = json.loads(path.read_text())
    data["volumes"][0]["shape"] = [8, 4, 8]  # same number of voxels, same bytes, wrong shape
    path.write_text(json.dumps(data))
    report = verify(path)
    assert [c["zarr_path"] for c in report.changed] == [data["volumes"][0]["zarr_path"]]
    assert "stored uint8(4, 8, 8)" in report.changed[0]["why"]


def test_schema_violations_are_problems(tmp_path: Path) -> None:
    path = make_cache(tmp_path)
    data = json.loads(path.read_text())
    data["volumes"][0]["participant_id"] = "0001"  # the loader takes it, the schema does not
    path.write_text(json.dumps(data))
    report = verify(path)
    assert report.schema == "invalid" and not report.ok
    assert any("participant_id" in e for e in report.schema_errors)
    assert report.verified == 3  # the volumes themselves are fine


def test_the_schema_ships_inside_the_package() -> None:
    """A plain (non-editable) install has the schema: it is package data, not a repo file."""
    import tomllib

    import octstage

    assert SCHEMA.parent == Path(octstage.__file__).parent and SCHEMA.is_file()
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert SCHEMA.name in pyproject["tool"]["setuptools"]["package-data"]["octstage"]
    status, errors = validate_schema({})
    assert status == "invalid" and errors


def test_verify_needs_nothing_beyond_the_base_dependencies() -> None:
    """``octstage verify`` imports jsonschema for the schema check: a plain install has it."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    assert "jsonschema" in names
    assert not any(d.startswith("jsonschema") for d in project["optional-dependencies"]["dev"])


# Run in a fresh process with the extras' modules hidden from the import system, as if not
# installed (zarr, for one, imports fsspec only when it finds it).
_HIDDEN_RUN = """
import importlib.machinery, json, sys
hidden = set(json.loads(sys.argv[2]))
class Hide(importlib.machinery.PathFinder):
    # A subclass, so package metadata (find_distributions) is still found, as on a plain install.
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)
sys.meta_path = [Hide if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from octstage.cli import main
code = main(["verify", sys.argv[1]])
print(json.dumps([code, sorted(hidden & {m.split(".")[0] for m in sys.modules})]))
"""


def test_verify_runs_with_no_optional_extra_installed(tmp_path: Path) -> None:
    """A plain install (no extras) runs ``octstage verify`` to the end: every module that only
    an extra of pyproject.toml brings in is hidden from a real run in a fresh process."""
    import importlib.metadata
    import subprocess
    import sys
    import tomllib

    from packaging.requirements import Requirement

    def names(requirements: list[str]) -> set[str]:
        return {Requirement(r).name.lower().replace("_", "-") for r in requirements}

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    base = names(project["dependencies"])
    extras = set().union(*(names(v) for v in project["optional-dependencies"].values())) - base
    hidden = sorted(
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if {d.lower().replace("_", "-") for d in dists} <= extras
    )
    assert {"fsspec", "s3fs", "b2sdk", "jsonschema"} & set(hidden) == {"fsspec", "s3fs", "b2sdk"}
    path = make_cache(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", _HIDDEN_RUN, str(path), json.dumps(hidden)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    code, loaded = json.loads(proc.stdout.splitlines()[-1])
    assert code == 0 and loaded == []


@pytest.mark.parametrize("kind", ["oct", "cellpainting"])
def test_a_chunk_changed_yet_still_decodable_is_a_change_named_by_its_checksum(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte of a chunk's compressed bytes flipped so that blosc still decodes it: zarr's
    read checks the chunk's crc32c, and verify says so in words, one line, exit 1."""
    if kind == "oct":
        path = make_cache(tmp_path)
    else:
        write_cell_cache(tmp_path, n=4, splits=("train",))
        path = tmp_path / "manifest.json"
    assert verify(path).ok
    target = mf.load(path).items[1]
    flip_decodable(tmp_path / target.zarr_path / "0")
    report = verify(path)
    assert [c["zarr_path"] for c in report.changed] == [target.zarr_path]
    assert report.changed[0]["why"] == (
        "unreadable: a chunk or shard index fails its crc32c checksum "
        "(its bytes changed after they were written)"
    )
    capsys.readouterr()
    assert main(["verify", str(path)]) == 1
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert f"changed {target.zarr_path}: unreadable: a chunk" in err and "Traceback" not in err
