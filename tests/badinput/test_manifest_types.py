"""A hand-edited manifest value of the wrong type, or a key missing or given twice, in every
consumer: ``octstage verify`` exits 1 naming it as a schema problem (nothing compared, no item
read), ``octtrain doctor``, ``finetune`` and ``embed`` exit 4 (a data error) naming it before any
work; never a traceback, never Python's own words (``'<=' not supported between instances of
'int' and 'str'``, a dataclass's constructor message), and a split given twice is never read as
its last value.

Each case damages a fresh copy of a small real cache's manifest (``tests/octtrain/tiny_cache.py``,
the JSON form or the columnar form written from it; ``tests/octtrain/cell_cache.py`` for Cell
Painting). Add a case: a row in ``CASES`` (the damage, and what the message must name).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from octstage import manifest as mf
from tests.badinput.conftest import Ran, assert_clean
from tests.octtrain.tiny_cache import write_tiny_cache

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "configs" / "pretrain" / "tiny.yaml"
DINO = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"
FINETUNE = ROOT / "configs" / "finetune" / "tiny.yaml"
VOLUME = "volumes[1] (zarr_path 'volumes/1002/k01002.ome.zarr')"  # the volume the cases edit
FIELD = "fields[1] (item_id 'source_0/P0/A01/2')"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small OCT cache (12 volumes, every split) never damaged, in both forms of manifest:
    ``manifest.json`` and ``table.json`` with its ``table.items.parquet``."""
    root = tmp_path_factory.mktemp("types-cache")
    path, cache = write_tiny_cache(root, counts={"train": 1, "val": 1, "test": 1})
    mf.write(mf.load(path), cache / "table.json", form="table")
    return cache


@pytest.fixture(scope="module")
def cell_pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.octtrain.cell_cache import write_cell_cache

    root = tmp_path_factory.mktemp("types-cells")
    write_cell_cache(root, n=8)
    return root


@pytest.fixture(scope="module")
def checkpoint(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A V-JEPA checkpoint of one step on the clean cache, for ``embed`` (in this process)."""
    from octtrain import cli

    run = tmp_path_factory.mktemp("types-run") / "run"
    args = ["pretrain", "--config", PRETRAIN, "--manifest", pristine / "manifest.json"]
    extra = [f"train.run_dir={run}", "train.max_steps=1", "logging.log_every=1"]
    extra.append("data.batch_size=4")  # the 4 training volumes: a batch the split fills
    assert cli.main([*map(str, args), *extra]) == 0
    (found,) = (run / "checkpoints").glob("*.pt")
    return found


def _edit_json(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], Path]:
    def damage(cache: Path) -> Path:
        path = cache / "manifest.json"
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data, indent=1))
        return path

    return damage


def _volume(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], Path]:
    return _edit_json(lambda data: change(data["volumes"][1]))


def _split_twice(cache: Path) -> Path:
    """``"split": "test"`` then the volume's own ``"split": "train"``: JSON keeps the last."""
    path = cache / "manifest.json"
    text = path.read_text()
    volume = json.dumps(json.loads(text)["volumes"][1], indent=1)
    assert '"split": "train"' in volume
    edited = volume.replace('"split": "train"', '"split": "test",\n "split": "train"')
    path.write_text(text.replace(volume.replace("\n", "\n  "), edited.replace("\n", "\n  ")))
    assert path.read_text() != text
    return path


def _column(name: str, change: Callable[[pa.ChunkedArray], pa.Array]) -> Callable[[Path], Path]:
    """The columnar form's item table with one column changed, the header's size and SHA-256
    written to match (a deliberate hand edit, not a damaged copy)."""

    def damage(cache: Path) -> Path:
        header, path = cache / "table.json", cache / "table.items.parquet"
        table = pq.read_table(path)
        at = table.schema.get_field_index(name)
        pq.write_table(table.set_column(at, name, change(table[name])), path)
        data = json.loads(header.read_text())
        data["table"].update(bytes=path.stat().st_size, sha256=mf.file_sha256(path))
        header.write_text(json.dumps(data))
        return header

    return damage


def _null_at_1(column: pa.ChunkedArray) -> pa.Array:
    values = column.to_pylist()
    values[1] = None
    return pa.array(values, column.type)


def _field(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], Path]:
    return _edit_json(lambda data: change(data["fields"][1]))


@dataclass(frozen=True)
class Case:
    name: str
    damage: Callable[[Path], Path]  # edits a copy of the cache; returns the manifest to read
    names: tuple[str, ...]  # what the message must hold: the item, the key, the value
    every: bool = False  # run finetune and embed too (each case runs verify and doctor)
    kind: str = "oct"


CASES = [
    Case(
        "label as text",
        _volume(lambda v: v.update(label="2")),
        (VOLUME, "label is the string '2'", "expected an integer"),
        every=True,
    ),
    Case(
        "split a number",
        _volume(lambda v: v.update(split=5)),
        (VOLUME, "split is the integer 5", "one of 'train', 'val', 'test'"),
    ),
    Case(
        "participant_id a number",
        _volume(lambda v: v.update(participant_id=1002)),
        (VOLUME, "participant_id is the integer 1002", "expected a string"),
    ),
    Case(
        "zarr_path null",
        _volume(lambda v: v.update(zarr_path=None)),
        ("volumes[1] (cache_key 'k01002')", "zarr_path is null", "expected a string"),
    ),
    Case(
        "label 1.0",
        _volume(lambda v: v.update(label=1.0)),
        (VOLUME, "label is the number 1.0", "expected an integer"),
    ),
    Case(
        "split missing",
        _volume(lambda v: v.pop("split")),
        (VOLUME, "no key 'split'", "one of 'train', 'val', 'test'"),
    ),
    Case(
        "split given twice",
        _split_twice,
        (VOLUME, "key 'split' is given 2 times ('test', then 'train')"),
        every=True,
    ),
    Case(
        "columnar: label column as text",
        _column("label", lambda c: c.cast(pa.string())),
        ("table.items.parquet", "column 'label' is string, expected int64"),
        every=True,
    ),
    Case(
        "columnar: participant_id null",
        _column("participant_id", _null_at_1),
        (
            "table.items.parquet row 1 (zarr_path 'volumes/1002/k01002.ome.zarr')",
            "participant_id is null",
            "expected string",
        ),
    ),
    Case(
        "cell painting: label as text",
        _field(lambda f: f.update(label="1")),
        (FIELD, "label is the string '1'", "expected an integer or null"),
        kind="cellpainting",
    ),
    Case(
        "cell painting: split a number",
        _field(lambda f: f.update(split=5)),
        (FIELD, "split is the integer 5", "one of 'train', 'val', 'test'"),
        kind="cellpainting",
    ),
]


def octtrain(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "COLUMNS": "1000"}
    return subprocess.run(
        [sys.executable, "-m", "octtrain.cli", *map(str, args)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip


def assert_data_error(proc: subprocess.CompletedProcess[str], path: Path, names: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """Exit 4, no traceback, one ERROR line naming the manifest, and each name in its lines."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out[-3000:]
    assert "Traceback" not in out and "not supported between" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and str(path) in errors[0], out[-3000:]
    for name in names:
        assert name in out, (name, out[-3000:])


@pytest.fixture
def damaged(
    request: pytest.FixtureRequest, pristine: Path, cell_pristine: Path, tmp_path: Path
) -> tuple[Case, Path]:
    case: Case = request.param
    source = cell_pristine if case.kind == "cellpainting" else pristine
    cache = Path(shutil.copytree(source, tmp_path / "cache"))
    return case, case.damage(cache)


@pytest.mark.parametrize("damaged", CASES, ids=[c.name for c in CASES], indirect=True)
def test_a_mistyped_manifest_is_named_by_verify_and_refused_by_doctor(
    damaged: tuple[Case, Path], octstage_cli: Callable[..., Ran]
) -> None:
    case, path = damaged
    ran = octstage_cli("verify", path)
    assert_clean(ran, 1, *case.names)
    assert "unexpected" not in ran.text and "invalid" in ran.text and "PROBLEMS" in ran.text
    config = DINO if case.kind == "cellpainting" else PRETRAIN
    assert_data_error(octtrain("doctor", "--config", config, "--manifest", path), path, case.names)


EVERY = [c for c in CASES if c.every]


@pytest.mark.parametrize("damaged", EVERY, ids=[c.name for c in EVERY], indirect=True)
def test_finetune_and_embed_stop_on_it_before_any_work(
    damaged: tuple[Case, Path], checkpoint: Path, tmp_path: Path
) -> None:
    case, path = damaged
    runs, out = tmp_path / "runs", tmp_path / "export"
    proc = octtrain(
        "finetune", "--config", FINETUNE, "--manifest", path, "init_encoder=random",
        f"train.output_dir={runs}",
    )  # fmt: skip
    assert_data_error(proc, path, case.names)
    proc = octtrain(
        "embed", "--checkpoint", checkpoint, "--manifest", path, "--out", out,
        "--device", "cpu", "--num-workers", "0",
    )  # fmt: skip
    assert_data_error(proc, path, case.names)
    assert not runs.exists() and not out.exists()  # nothing started, nothing exported
