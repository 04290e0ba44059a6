"""``octtrain evaluate``: a finetuned checkpoint on one split -> metrics JSON, confusion PNG, table.

The checkpoint carries its config and class names; the manifest's classes must be the same,
in the same order, or the numbers would be silently permuted. Prediction goes through the
exact-once validation path (octtrain/validation.py), so evaluation under torchrun counts every
volume once as well. Output (in ``--out``, default: the run folder of a local checkpoint):

* ``metrics-<split>.json``: volume- and participant-level metrics (undefined values ``null``),
  the collapse verdict, the checkpoint and manifest used, and every volume's probabilities;
* ``confusion-<split>.png``: the volume-level confusion matrix (true rows, predicted columns).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from octstage.manifest import atomic_write_text
from octtrain.config.loader import from_dict
from octtrain.config.sections import DataConfig, LabelConfig, SelectConfig
from octtrain.data.dataset import ManifestDataset, Transform, read_manifest, to_model_input
from octtrain.data.loaders import padded_loader
from octtrain.data.select import prepare
from octtrain.data.splits import check_splits
from octtrain.errors import CheckpointError, ConfigError, DataError
from octtrain.eval import metrics as mt
from octtrain.eval.report import print_collapse, print_metrics, short, write_confusion_png
from octtrain.eval.validation import predict
from octtrain.models.classifier import classifier_from_state
from octtrain.runtime import checkpoint as ckpt
from octtrain.runtime.backend import make_backend

log = logging.getLogger("octtrain")
console = Console()


@dataclass(frozen=True)
class EvaluateResult:
    metrics_json: Path | None  # None on processes other than the main one
    confusion_png: Path | None
    volume: mt.ClassificationMetrics
    participant: mt.ClassificationMetrics
    collapse: str | None


def resolve_checkpoint(url: str) -> str:
    """A checkpoint file as given; a checkpoint folder means its best checkpoint, else latest."""
    if url.rstrip("/").endswith(".pt"):
        return url
    manager = ckpt.CheckpointManager(url, keep_last=1, keep_best=True)
    found = manager.best() or manager.latest()
    if found is None:
        raise CheckpointError(f"{url}: no checkpoint found (no index.json or it is empty)")
    return found


def default_out(url: str) -> Path:
    """The run folder of a local ``<run>/checkpoints/step_X.pt``; else the current folder."""
    if "://" in url:
        return Path.cwd()
    folder = Path(url).parent
    return folder.parent if folder.name == "checkpoints" else folder


def run_evaluate(
    checkpoint: str,
    manifest: str,
    split: str = "test",
    cache: str | None = None,
    out: str | None = None,
    device: str = "auto",
    batch_size: int = 8,
    num_workers: int = 0,
    max_share: float = 0.8,
) -> EvaluateResult | None:
    """Evaluate ``checkpoint`` on ``split`` of ``manifest``; writes files on the main process.
    A regression checkpoint is evaluated by ``evaluate_regression`` (result None)."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder; name a folder to write into")
    url = resolve_checkpoint(checkpoint)
    state = ckpt.load_checkpoint(url)
    # The volumes and the target the checkpoint was trained on (data.select, data.label).
    data_cfg = state["config"].get("data", {})
    label = from_dict(LabelConfig, data_cfg.get("label", {}), "data.label.")
    select = from_dict(SelectConfig, data_cfg.get("select", {}), "data.select.")
    man, _ = prepare(read_manifest(manifest), select, label, [split])
    if label.regression:
        from octtrain.eval.evaluate_regression import evaluate_regression

        folder = Path(out) if out else default_out(url)
        args = (split, cache, folder, device, batch_size, num_workers)
        evaluate_regression(state, url, man, manifest, label, *args)
        return None
    model, classes = classifier_from_state(state)
    if tuple(man.classes) != classes:
        raise DataError(
            f"{manifest}: classes {list(man.classes)} differ from the checkpoint's "
            f"{list(classes)}; evaluating would permute the labels"
        )
    check_splits(man, [split])
    d, h, w = state["config"]["model"]["input_shape"]
    shape = (int(d), int(h), int(w))
    cache_root = Path(cache) if cache else Path(manifest).parent
    dataset = ManifestDataset(man, cache_root, split, Transform(shape, None))
    n, c = len(dataset), len(classes)
    backend = make_backend(device, str(state["config"]["train"].get("precision", "auto")))
    try:
        model.to(backend.device)  # no data-parallel wrapper: evaluation has no gradients
        workers = DataConfig(num_workers=num_workers, persistent_workers=False)
        loader = padded_loader(
            dataset, n, backend.process_index, backend.process_count, batch_size, workers
        )
        preds = predict(model, backend.wrap_loader(loader), backend, n, c, to_model_input)
    finally:
        backend.close()
    volume = mt.classification_metrics(preds.labels, preds.probs, c)
    pids = [v.participant_id for v in dataset.volumes]
    _, plabels, pprobs = mt.participant_level(pids, preds.labels, preds.probs)
    participant = mt.classification_metrics(plabels, pprobs, c)
    alarm = mt.check_collapse(volume.histogram, max_share)
    collapse = None if alarm is None else alarm.message([short(x) for x in classes])
    if not backend.is_main:
        return EvaluateResult(None, None, volume, participant, collapse)

    folder = Path(out) if out else default_out(url)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {folder}: cannot create the folder: {exc.strerror}") from None
    doc: dict[str, Any] = {
        "checkpoint": url,
        "checkpoint_epoch": state.get("epoch"),
        "manifest": str(manifest),
        "split": split,
        "volume": mt.to_jsonable(volume, classes),
        "participant": mt.to_jsonable(participant, classes),
        "collapse": collapse,
        "collapse_max_share": max_share,
        "predictions": [
            {
                "participant_id": v.participant_id,
                "zarr_path": v.zarr_path,
                "label": int(label),
                "probs": [round(float(p), 6) for p in probs],
            }
            for v, label, probs in zip(dataset.volumes, preds.labels, preds.probs, strict=True)
        ],
    }
    json_path = folder / f"metrics-{split}.json"
    atomic_write_text(json_path, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    png_path = folder / f"confusion-{split}.png"
    title = f"{split}: {n} volumes, balanced accuracy {volume.balanced_accuracy:.3f}"
    write_confusion_png(png_path, volume.confusion, classes, title)
    results = {"volume": volume, "participant": participant}
    print_metrics(console, f"{split} split ({Path(url).name})", results, classes)
    if collapse is not None:
        print_collapse(console, f"{split}: {collapse}")
    log.info("wrote %s and %s", json_path, png_path)
    return EvaluateResult(json_path, png_path, volume, participant, collapse)
