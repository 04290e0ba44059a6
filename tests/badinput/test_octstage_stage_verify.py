"""octstage stage and verify with bad input: a folder holding another cache, missing data told
from changed data, a manifest that contradicts itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.badinput.conftest import Ran, assert_clean
from tests.octstage.chunk_damage import flip_decodable

CLI = Callable[..., Ran]


# ---- stage: a folder holding another cache is refused, or replaced only when asked ------------


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two different tiny caches: A (8 volumes) and B (4 volumes, other bytes, same names)."""
    from tests.octtrain.tiny_cache import write_tiny_cache

    base = tmp_path_factory.mktemp("caches")
    _, a = write_tiny_cache(base / "a", shape=(8, 32, 32), counts={"train": 1, "val": 1})
    _, b = write_tiny_cache(base / "b", shape=(8, 32, 32), counts={"train": 1}, seed=1)
    return a, b


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_stage_refuses_a_folder_holding_another_cache_unless_replace(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two_caches
    dst = tmp_path / "ssd"
    assert octstage_cli("stage", a, dst).code == 0
    before = {n: (dst / n).read_bytes() for n in _files(dst)}
    (dst / "notes.txt").write_text("left by hand")

    ran = octstage_cli("stage", b, dst)
    assert_clean(ran, 2, dst, "holds another cache", "--replace")
    before["notes.txt"] = b"left by hand"
    assert {n: (dst / n).read_bytes() for n in _files(dst)} == before  # untouched

    ran = octstage_cli("stage", b, dst, "--replace", "--json", tmp_path / "r.json")
    assert_clean(ran, 0, "kept in place", "notes.txt")
    assert _files(dst) == _files(b) | {"notes.txt"}  # A's other volumes gone, the user's file not
    assert (dst / "notes.txt").read_text() == "left by hand"
    assert (dst / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["removed"] > 0 and report["kept"] == ["notes.txt"]
    assert octstage_cli("verify", dst / "manifest.json").code == 0

    again = octstage_cli("stage", b, dst, "--json", tmp_path / "r2.json")  # idempotent
    assert_clean(again, 0)
    report = json.loads((tmp_path / "r2.json").read_text())
    assert report["present"] == report["volumes"] == 4 and report["downloaded"] == 0


def test_stage_replace_keeps_and_names_everything_the_old_manifest_does_not_list(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    """A user's folder, a note among the volumes and an export written inside the cache all stay
    (named once each); only the files the replaced cache's manifest lists go."""
    a, b = two_caches
    dst = tmp_path / "ssd"
    assert octstage_cli("stage", a, dst).code == 0
    (dst / "analysis").mkdir()
    (dst / "analysis" / "fig.png").write_bytes(b"png")
    (dst / "volumes" / "NOTES.md").write_text("which scans looked odd")
    listed = {v["zarr_path"] for v in json.loads((dst / "manifest.json").read_text())["volumes"]}
    ran = octstage_cli("stage", b, dst, "--replace", "--json", tmp_path / "r.json")
    assert_clean(ran, 0, "analysis/", "volumes/NOTES.md")
    assert (dst / "analysis" / "fig.png").read_bytes() == b"png"
    assert (dst / "volumes" / "NOTES.md").read_text() == "which scans looked odd"
    assert json.loads((tmp_path / "r.json").read_text())["kept"] == [
        "analysis/",
        "volumes/NOTES.md",
    ]
    new = {v["zarr_path"] for v in json.loads((dst / "manifest.json").read_text())["volumes"]}
    assert not any((dst / p).exists() for p in listed - new)  # A's own files did go
    assert not (dst / ".stage-replacing.json").exists()
    assert octstage_cli("verify", dst / "manifest.json").code == 0


def test_an_interrupted_replace_is_finished_by_the_next_one_and_refused_without_replace(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    """A replace stopped after the old manifest went (here: a volume of the new cache failed)
    still knows the old cache's files: a plain stage is refused saying how to finish, the next
    --replace removes them and keeps the user's note."""
    import shutil

    a, b = two_caches
    broken = Path(shutil.copytree(b, tmp_path / "b"))
    vol = json.loads((broken / "manifest.json").read_text())["volumes"][0]
    _flip_data(broken, vol)
    dst = tmp_path / "ssd"
    assert octstage_cli("stage", a, dst).code == 0
    (dst / "notes.txt").write_text("mine")
    assert octstage_cli("stage", broken, dst, "--replace").code == 1
    assert_clean(octstage_cli("stage", b, dst), 2, "stopped before it finished", "--replace")
    assert_clean(octstage_cli("stage", b, dst, "--replace"), 0, "notes.txt")
    assert _files(dst) == _files(b) | {"notes.txt"}


def test_stage_replace_refuses_when_the_old_manifest_cannot_be_read(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    """Without a readable list of the old cache's files nothing is removed on a guess."""
    a, b = two_caches
    dst = tmp_path / "ssd"
    assert octstage_cli("stage", a, dst).code == 0
    (dst / "manifest.json").write_text('{"kind": "oct", "volumes": 3}')
    before = _files(dst)
    ran = octstage_cli("stage", b, dst, "--replace")
    assert_clean(ran, 2, "manifest.json", "cannot be read", "nothing was changed")
    assert _files(dst) == before and (dst / "manifest.json").exists()


def test_a_failed_replace_leaves_no_manifest_over_the_new_bytes(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    import shutil

    a, b = two_caches
    broken = Path(shutil.copytree(b, tmp_path / "b"))
    vol = json.loads((broken / "manifest.json").read_text())["volumes"][0]
    _flip_data(broken, vol)  # one of B's volumes no longer matches its checksum
    dst = tmp_path / "ssd"
    assert octstage_cli("stage", a, dst).code == 0
    ran = octstage_cli("stage", broken, dst, "--replace")
    assert ran.code == 1
    # Neither A's manifest (it would describe B's bytes as A's) nor B's (a volume failed).
    assert not (dst / "manifest.json").exists()
    assert octstage_cli("verify", dst / "manifest.json").code != 0


def test_stage_never_writes_into_a_folder_that_holds_no_cache(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    dst = tmp_path / "home"
    dst.mkdir()
    (dst / "thesis.tex").write_text("mine")
    for extra in ([], ["--replace"]):
        ran = octstage_cli("stage", two_caches[0], dst, *extra)
        assert_clean(ran, 2, dst, "holds no cache manifest", "thesis.tex")
        assert _files(dst) == {"thesis.tex"}


# ---- verify: missing told from changed; a manifest that contradicts itself -------------------


def _drop_data(cache: Path, vol: dict[str, object]) -> None:
    for shard in (cache / str(vol["zarr_path"]) / "0" / "c").rglob("*"):
        if shard.is_file():
            shard.unlink()


def _flip_data(cache: Path, vol: dict[str, object]) -> None:
    shard = next(p for p in (cache / str(vol["zarr_path"]) / "0" / "c").rglob("*") if p.is_file())
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def _flip_decodable(cache: Path, vol: dict[str, object]) -> None:
    flip_decodable(cache / str(vol["zarr_path"]) / "0")  # blosc still decodes it: other values


def _drop_volume(cache: Path, vol: dict[str, object]) -> None:
    import shutil

    shutil.rmtree(cache / str(vol["zarr_path"]))


DAMAGE = [
    # (case, damage, the line verify prints)
    ("data objects deleted", _drop_data, "missing {zarr_path}: data object(s) 0/c/0/0/0 gone"),
    ("shard bytes changed", _flip_data, "changed {zarr_path}: "),
    (
        "a chunk changed yet still decodable",
        _flip_decodable,
        "changed {zarr_path}: unreadable: a chunk or shard index fails its crc32c checksum",
    ),
    ("volume folder deleted", _drop_volume, "missing {zarr_path}: not in the cache"),
]


@pytest.fixture
def small_cache(tmp_path: Path) -> Path:
    from tests.octtrain.tiny_cache import write_tiny_cache

    return write_tiny_cache(tmp_path, shape=(8, 32, 32), counts={"train": 1, "val": 1})[1]


@pytest.mark.parametrize(("case", "damage", "line"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_verify_tells_missing_data_from_changed_data(
    octstage_cli: CLI, small_cache: Path, case: str, damage: Callable[..., None], line: str
) -> None:
    vol = json.loads((small_cache / "manifest.json").read_text())["volumes"][3]
    damage(small_cache, vol)
    ran = octstage_cli("verify", small_cache / "manifest.json")
    assert_clean(ran, 1, line.format(**vol))
    kind = line.split()[0]
    report = json.loads(octstage_cli("verify", small_cache / "manifest.json", "--json").out)
    assert report[kind] and not report["changed" if kind == "missing" else "missing"]


def _duplicate(doc: dict[str, list[dict[str, object]]]) -> None:
    doc["volumes"].append(dict(doc["volumes"][0]))


def _two_splits(doc: dict[str, list[dict[str, object]]]) -> None:
    twin = dict(doc["volumes"][0])
    twin.update(split="val", zarr_path=str(twin["zarr_path"]).replace(".ome", "b.ome"))
    twin.update(source_path="other.dcm", cache_key="other")
    doc["volumes"].append(twin)


def _label_out_of_range(doc: dict[str, list[dict[str, object]]]) -> None:
    doc["volumes"][1]["label"] = 7


def _label_of_another_class(doc: dict[str, list[dict[str, object]]]) -> None:
    doc["volumes"][1]["label"] = (int(str(doc["volumes"][1]["label"])) + 1) % 4


CONTRADICTIONS = [
    ("a volume listed twice", _duplicate, "already listed at volumes[0]"),
    ("a participant in two splits", _two_splits, "in 2 splits: train, val"),
    ("a label outside the classes", _label_out_of_range, "label 7 outside the 4 classes"),
    ("a label naming another class", _label_of_another_class, "study_group says"),
]


@pytest.mark.parametrize(
    ("case", "edit", "says"), CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS]
)
def test_verify_refuses_a_manifest_that_contradicts_itself(
    octstage_cli: CLI, small_cache: Path, case: str, edit: Callable[..., None], says: str
) -> None:
    path = small_cache / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    ran = octstage_cli("verify", path)
    assert_clean(ran, 1, f"manifest {path}: ", says)


def test_a_failed_stage_replace_never_leaves_the_old_manifest_over_new_bytes(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    import shutil

    a, b = two_caches
    dst = tmp_path / "ssd"
    assert octstage_cli("stage", a, dst).code == 0
    broken = Path(shutil.copytree(b, tmp_path / "b"))
    shard = sorted(broken.glob("volumes/*/*.ome.zarr/0/c/0/0/0"))[-1]
    shard.write_bytes(shard.read_bytes()[:-7] + b"\x00" * 7)  # fails its checksum
    ran = octstage_cli("stage", broken, dst, "--replace")
    assert ran.code == 1, ran.text
    # B's bytes are partly in; A's manifest must not describe them (nor B's, unverified).
    assert not (dst / "manifest.json").exists()


def test_verify_names_the_way_out_of_extra_arrays_and_it_works(
    octstage_cli: CLI, two_caches: tuple[Path, Path], tmp_path: Path
) -> None:
    import shutil

    a, _ = two_caches
    cache = Path(shutil.copytree(a, tmp_path / "cache"))
    kept = next((cache / "volumes").glob("*/*.ome.zarr"))
    earlier = kept.with_name("earlier-shape.ome.zarr")  # what a build at another --shape left
    shutil.copytree(kept, earlier)
    ran = octstage_cli("verify", cache / "manifest.json")
    rel = earlier.relative_to(cache).as_posix()
    assert_clean(ran, 1, f"extra {rel}", "1 volumes the manifest does not list",
                 f"octstage stage {cache} NEW_FOLDER")  # fmt: skip
    # The way out: a copy holds only what the manifest lists, and verifies clean.
    assert octstage_cli("stage", cache, tmp_path / "clean").code == 0
    assert octstage_cli("verify", tmp_path / "clean" / "manifest.json").code == 0
