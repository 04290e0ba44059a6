"""``octtrain evaluate``: metrics JSON (nulls, never NaN), confusion PNG, table, refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from octstage import manifest as mf
from octtrain.cli import main
from octtrain.errors import CheckpointError, DataError
from octtrain.eval.oct.evaluate import resolve_checkpoint, run_evaluate
from octtrain.train.job import RunResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_evaluate_writes_metrics_json_and_confusion_png(
    tiny_cache: tuple[Path, Path], tiny_finetuned: RunResult, tmp_path: Path
) -> None:
    assert tiny_finetuned.run_dir is not None
    checkpoints = str(tiny_finetuned.run_dir / "checkpoints")
    args = ["--checkpoint", checkpoints, "--manifest", str(tiny_cache[0]), "--split", "test"]
    code = main(["evaluate", *args, "--out", str(tmp_path), "--device", "cpu"])
    assert code == 0
    doc = json.loads((tmp_path / "metrics-test.json").read_text())
    assert doc["checkpoint"] == tiny_finetuned.best_checkpoint  # a folder means its best
    assert doc["split"] == "test" and doc["volume"]["num_samples"] == 8
    for key in ("accuracy", "balanced_accuracy", "macro_f1", "kappa", "macro_auroc", "macro_aupr"):
        assert key in doc["volume"] and key in doc["participant"]
    assert set(doc["volume"]["per_class"]) == set(mf.load(tiny_cache[0]).classes)
    cm = np.array(doc["volume"]["confusion_matrix"])
    assert cm.shape == (4, 4) and cm.sum() == 8 and cm.sum(axis=1).tolist() == [2, 2, 2, 2]
    assert len(doc["predictions"]) == 8
    assert all(abs(sum(p["probs"]) - 1) < 1e-4 for p in doc["predictions"])
    assert (tmp_path / "confusion-test.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "groups-test.png").read_bytes()[:8] == PNG_MAGIC
    assert doc["bootstrap"]["unit"] == "participant" and doc["seeds"] == {"bootstrap": 0}
    groups = {(g["grouping"], g["group"]): g for g in doc["groups"]}
    overall = groups["overall", "all volumes"]
    assert (overall["volumes"], overall["participants"]) == (8, 8)
    bacc = overall["metrics"]["balanced_accuracy"]
    assert bacc["ci_low"] <= bacc["value"] <= bacc["ci_high"]
    assert bacc["value"] == pytest.approx(doc["volume"]["balanced_accuracy"], abs=1e-6)
    # The test split's 8 participants sit on two devices, 4 each: too few to score.
    devices = [g for key, g in groups.items() if key[0] == "device"]
    assert [g["participants"] for g in devices] == [4, 4]
    assert all(g["too_small"] and "metrics" not in g for g in devices)
    assert groups["site", "UW"]["participants"] == 8
    table = (tmp_path / "groups-test.md").read_text()
    assert "| device |" in table and "too small" in table and "seed 0" in table


def test_evaluate_same_seed_same_numbers(
    tiny_cache: tuple[Path, Path], tiny_finetuned: RunResult, tmp_path: Path
) -> None:
    assert tiny_finetuned.best_checkpoint is not None
    docs = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        args = ["--checkpoint", tiny_finetuned.best_checkpoint, "--manifest", str(tiny_cache[0])]
        flags = ["--bootstrap", "200", "--seed", str(seed), "--min-participants", "2"]
        assert main(["evaluate", *args, "--out", str(tmp_path / name), *flags]) == 0
        docs.append(json.loads((tmp_path / name / "metrics-test.json").read_text()))
    assert docs[0]["groups"] == docs[1]["groups"] and docs[0]["seeds"] == {"bootstrap": 7}
    assert docs[0]["groups"] != docs[2]["groups"]  # the seed is used, not ignored
    assert main(["evaluate", *args, "--bootstrap", "0"]) == 2  # refused, one line


def test_evaluate_single_class_split_reports_undefined_as_null(
    tiny_cache: tuple[Path, Path], tiny_finetuned: RunResult, tmp_path: Path
) -> None:
    original = mf.load(tiny_cache[0])
    volumes = tuple(v for v in original.volumes if v.split != "test" or v.label == 1)
    path = tmp_path / "manifest.json"
    mf.write(dataclasses.replace(original, volumes=volumes), path)
    assert tiny_finetuned.best_checkpoint is not None
    result = run_evaluate(
        tiny_finetuned.best_checkpoint,
        str(path),
        split="test",
        cache=str(tiny_cache[1]),
        out=str(tmp_path / "out"),
        device="cpu",
    )
    assert result.metrics_json is not None
    text = result.metrics_json.read_text()
    assert "NaN" not in text
    doc = json.loads(text)
    assert doc["volume"]["macro_auroc"] is None
    assert doc["volume"]["per_class"]["healthy"]["recall"] is None
    assert doc["volume"]["per_class"]["pre_diabetes_lifestyle_controlled"]["aupr"] is not None


def test_evaluate_refuses_other_classes_and_missing_checkpoints(
    tiny_cache: tuple[Path, Path], tiny_finetuned: RunResult, tmp_path: Path
) -> None:
    original = mf.load(tiny_cache[0])
    swapped = (original.classes[1], original.classes[0], *original.classes[2:])
    # A consistent manifest of another class order (labels follow their classes): only the
    # comparison with the checkpoint's classes can tell.
    relabelled = tuple(
        dataclasses.replace(v, label={0: 1, 1: 0}.get(v.label, v.label)) for v in original.volumes
    )
    path = tmp_path / "manifest.json"
    mf.write(dataclasses.replace(original, classes=swapped, volumes=relabelled), path)
    assert tiny_finetuned.best_checkpoint is not None
    with pytest.raises(DataError, match="would permute the labels"):
        run_evaluate(tiny_finetuned.best_checkpoint, str(path), cache=str(tiny_cache[1]))
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        resolve_checkpoint(str(tmp_path / "empty"))
    code = main(["evaluate", "--checkpoint", str(tmp_path / "nope.pt"), "--manifest", str(path)])
    assert code == 2


def test_evaluate_raises_the_collapse_alarm(
    tiny_cache: tuple[Path, Path], tiny_finetuned: RunResult, tmp_path: Path
) -> None:
    assert tiny_finetuned.best_checkpoint is not None
    result = run_evaluate(
        tiny_finetuned.best_checkpoint,
        str(tiny_cache[0]),
        split="test",
        out=str(tmp_path / "out"),
        device="cpu",
        max_share=0.2,  # 8 volumes over 4 classes: some class always takes >= 25%
    )
    assert result.collapse is not None and "prediction collapse" in result.collapse
    assert result.metrics_json is not None
    assert json.loads(result.metrics_json.read_text())["collapse"] == result.collapse


def test_evaluate_replaces_an_older_report_of_the_split_whole(
    tiny_cache: tuple[Path, Path], tiny_finetuned: RunResult, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # An older regression report of the test split, and a classification table beside it.
    (out / "metrics-test.json").write_text('{"task": "regression"}')
    (out / "groups-test.md").write_text("| overall | 0.850 |")
    (out / "metrics-val.json").write_text("{}")  # another split's report stays
    assert tiny_finetuned.best_checkpoint is not None
    args = ["--checkpoint", tiny_finetuned.best_checkpoint, "--manifest", str(tiny_cache[0])]
    assert main(["evaluate", *args, "--out", str(out), "--bootstrap", "20"]) == 0
    assert json.loads((out / "metrics-test.json").read_text())["split"] == "test"
    assert "0.850" not in (out / "groups-test.md").read_text()
    (aside,) = out.glob("replaced-*")
    assert sorted(p.name for p in aside.iterdir()) == ["groups-test.md", "metrics-test.json"]
    assert (aside / "groups-test.md").read_text() == "| overall | 0.850 |"
    assert (out / "metrics-val.json").read_text() == "{}"
    assert not list(out.glob(".report-*"))


def test_evaluate_on_a_cache_of_another_shape_names_both_shapes(
    tiny_cache: tuple[Path, Path], tiny_finetuned: RunResult, tmp_path: Path
) -> None:
    original = mf.load(tiny_cache[0])
    wider = tuple(
        dataclasses.replace(v, shape=(v.shape[0], v.shape[1], v.shape[2] * 2))
        for v in original.volumes
    )
    path = tmp_path / "manifest.json"
    mf.write(dataclasses.replace(original, volumes=wider), path)
    assert tiny_finetuned.best_checkpoint is not None
    with pytest.raises(DataError) as refused:
        run_evaluate(tiny_finetuned.best_checkpoint, str(path), cache=str(tiny_cache[1]))
    message = str(refused.value)
    shape = list(original.volumes[0].shape)
    assert str(path) in message and tiny_finetuned.best_checkpoint in message
    assert f"{[*shape[:2], shape[2] * 2]}" in message and f"{shape}" in message
