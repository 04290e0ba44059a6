"""``octtrain evaluate``: a finetuned checkpoint on one split -> metrics JSON, confusion PNG, table.

The checkpoint carries its config and class names; the manifest's classes must be the same,
in the same order, or the numbers would be silently permuted. Prediction goes through the
exact-once validation path (octtrain/validation.py), so evaluation under torchrun counts every
volume once as well. Output (in ``--out``, default: the run folder of a local checkpoint):

* ``metrics-<split>.json``: volume- and participant-level metrics (undefined values ``null``),
  the collapse verdict, per-device/site/region metrics with participant-bootstrap intervals and
  their counts, the bootstrap seed, the checkpoint and manifest used, and every volume's
  probabilities;
* ``confusion-<split>.png``, ``groups-<split>.md``, ``groups-<split>.png``: the confusion
  matrix and the per-group table and picture (octtrain/eval/oct/results.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from octstage.manifest import Manifest, check_output_folder, replace_report
from octtrain.config.loader import from_dict
from octtrain.config.sections import DataConfig, LabelConfig, SelectConfig
from octtrain.data.dataset import ManifestDataset, Transform, read_manifest, to_model_input
from octtrain.data.loaders import padded_loader
from octtrain.data.select import prepare
from octtrain.data.splits import check_splits
from octtrain.errors import ConfigError, DataError
from octtrain.eval.common import metrics as mt
from octtrain.eval.common.validation import predict
from octtrain.eval.oct.breakdown import BootstrapSpec
from octtrain.eval.oct.results import report_entry, report_files, score, write_report
from octtrain.models.classifier import classifier_from_state
from octtrain.runtime import checkpoint as ckpt
from octtrain.runtime.backend import make_backend
from octtrain.runtime.checkpoint import resolve_checkpoint

log = logging.getLogger("octtrain")
console = Console()


@dataclass(frozen=True)
class EvaluateResult:
    metrics_json: Path | None  # None on processes other than the main one
    confusion_png: Path | None
    volume: mt.ClassificationMetrics
    participant: mt.ClassificationMetrics
    collapse: str | None
    groups_png: Path | None = None


def check_cache_shape(
    state: dict[str, Any], url: str, man: Manifest, manifest: str, split: str
) -> None:
    """DataError naming both when the split's volumes differ in shape from those the checkpoint
    was trained on: the centre crop to the model's input would hide the difference (another
    grid, another field of view) and score it. A checkpoint from before ``cache_shape`` was
    recorded is not compared."""
    trained = state.get("cache_shape")
    volumes = man.split(split)
    if trained is None or not volumes:
        return
    found = sorted({tuple(v.shape) for v in volumes})
    if found != [tuple(trained)]:
        raise DataError(
            f"{manifest}: split {split!r} holds volumes of shape "
            f"{', '.join(str(list(f)) for f in found)}; checkpoint {url} was trained on "
            f"volumes of {list(trained)}: evaluate on a cache built at the same shape"
        )


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
    bootstrap: BootstrapSpec | None = None,
) -> EvaluateResult | None:
    """Evaluate ``checkpoint`` on ``split`` of ``manifest``; writes files on the main process.
    A regression checkpoint is evaluated by ``evaluate_regression`` (result None)."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder; name a folder to write into")
    spec = bootstrap or BootstrapSpec()
    url = resolve_checkpoint(checkpoint)
    # Refused before the work, not after it (the report is written whole at the end).
    check_output_folder(Path(out) if out else default_out(url), ConfigError)
    state = ckpt.load_checkpoint(url)
    ckpt.require_kind(
        state,
        url,
        ("finetune",),
        "evaluate scores a fine-tuned classifier: pass a checkpoint (or the checkpoints/ folder) "
        "of `octtrain finetune`; a pretraining checkpoint is scored by `octtrain probe` (V-JEPA) "
        "or `octtrain profile` (DINO)",
    )
    # The volumes and the target the checkpoint was trained on (data.select, data.label).
    data_cfg = state["config"].get("data", {})
    label = from_dict(LabelConfig, data_cfg.get("label", {}), "data.label.")
    select = from_dict(SelectConfig, data_cfg.get("select", {}), "data.select.")
    man, _ = prepare(read_manifest(manifest, "evaluate"), select, label, [split])
    check_cache_shape(state, url, man, manifest, split)
    if label.regression:
        from octtrain.eval.oct.evaluate_regression import evaluate_regression

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
    log.info("evaluate: %d volumes of split %r, checkpoint %s", n, split, url)
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
    scored = score(dataset.volumes, preds.labels, preds.probs, classes, spec, max_share)
    if not backend.is_main:
        return EvaluateResult(None, None, scored.volume, scored.participant, scored.collapse)

    folder = Path(out) if out else default_out(url)
    header: dict[str, Any] = {
        "checkpoint": url,
        "checkpoint_epoch": state.get("epoch"),
        "manifest": str(manifest),
        "seeds": {"bootstrap": spec.seed},
    }

    def write(tmp: Path) -> None:
        write_report(
            tmp,
            split,
            Path(url).name,
            dataset.volumes,
            preds.labels,
            preds.probs,
            classes,
            scored,
            spec,
            header,
            console,
            max_share,
        )

    aside = replace_report(folder, report_entry(split), write, ConfigError)
    files = report_files(folder, split)
    if aside is not None:
        log.info("the earlier %s report of this folder is now in %s", split, aside)
    log.info("wrote %s, %s and %s", files.metrics_json, files.confusion_png, files.groups_png)
    return EvaluateResult(
        files.metrics_json,
        files.confusion_png,
        scored.volume,
        scored.participant,
        scored.collapse,
        files.groups_png,
    )
