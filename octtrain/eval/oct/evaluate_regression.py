"""``octtrain evaluate`` of a regression checkpoint (``data.label.task: regression``).

The same exact-once prediction path as a classification (eval/common/validation.py), on the
volumes the
checkpoint's own ``data.select`` and ``data.label`` choose from the manifest; predictions are
mapped back to the concept's unit with the training split's standardizer stored in the
checkpoint. Writes ``metrics-<split>.json`` (volume- and participant-level MAE, RMSE, R^2 and
every volume's prediction) and prints the figures.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rich.console import Console

from octstage.manifest import Manifest, atomic_write_text, replace_report
from octtrain.config.sections import DataConfig, LabelConfig
from octtrain.data.dataset import ManifestDataset, Transform, to_model_input
from octtrain.data.loaders import padded_loader
from octtrain.errors import CheckpointError, ConfigError
from octtrain.eval.oct import regression as rg
from octtrain.eval.oct.results import report_entry
from octtrain.models.classifier import classifier_from_state
from octtrain.runtime.backend import make_backend

log = logging.getLogger("octtrain")
console = Console()


def evaluate_regression(
    state: dict[str, Any],
    url: str,
    man: Manifest,
    manifest: str,
    label: LabelConfig,
    split: str,
    cache: str | None,
    folder: Path,
    device: str,
    batch_size: int,
    num_workers: int,
) -> Path | None:
    """Predict ``split`` of the (selected, relabelled) manifest; the JSON's path on the main
    process, None elsewhere."""
    scale_data = state.get("regression")
    if not isinstance(scale_data, dict):
        raise CheckpointError(f"{url}: a regression checkpoint without its target standardizer")
    scale = rg.Standardizer(float(scale_data["mean"]), float(scale_data["std"]))
    model, _ = classifier_from_state(state)
    d, h, w = state["config"]["model"]["input_shape"]
    root = Path(cache) if cache else Path(manifest).parent
    dataset = ManifestDataset(
        man, root, split, Transform((int(d), int(h), int(w)), None), target_concept=label.concept
    )
    n = len(dataset)
    backend = make_backend(device, str(state["config"]["train"].get("precision", "auto")))
    try:
        model.to(backend.device)
        workers = DataConfig(num_workers=num_workers, persistent_workers=False)
        loader = padded_loader(
            dataset, n, backend.process_index, backend.process_count, batch_size, workers
        )
        pred, target = rg.predict_values(
            model, backend.wrap_loader(loader), backend, n, scale, to_model_input
        )
    finally:
        backend.close()
    if not backend.is_main:
        return None
    volume = rg.regression_metrics(pred, target)
    pids = [v.participant_id for v in dataset.volumes]
    participant = rg.regression_metrics(*rg.participant_means(pids, pred, target))
    doc = {
        "checkpoint": url,
        "checkpoint_epoch": state.get("epoch"),
        "manifest": manifest,
        "split": split,
        "task": "regression",
        "concept": label.concept,
        "target": man.classes[0],
        "volume": volume.as_dict(),
        "participant": participant.as_dict(),
        "predictions": [
            {
                "participant_id": v.participant_id,
                "zarr_path": v.zarr_path,
                "target": float(t),
                "predicted": round(float(p), 6),
            }
            for v, p, t in zip(dataset.volumes, pred, target, strict=True)
        ],
    }
    path = folder / f"metrics-{split}.json"
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    # The whole report of the split is replaced: a classification report's table goes aside too.

    def write(tmp: Path) -> None:
        atomic_write_text(tmp / path.name, text)

    replace_report(folder, report_entry(split), write, ConfigError)
    for level, m in (("volume", volume), ("participant", participant)):
        console.print(
            f"{split} split, {level} level, {man.classes[0]}: MAE {m.mae:.4g}, RMSE {m.rmse:.4g}, "
            f"R^2 {m.r2:.3f} ({m.num_samples} samples, mean target {m.mean_target:.4g})"
        )
    log.info("wrote %s", path)
    return path
