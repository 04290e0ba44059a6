"""``octtrain profile``: well-level profiles of a DINO checkpoint's fields and the field's
metrics, beside the baselines: the same encoder at random init (``RANDOM_SEEDS`` seeds), a small
handcrafted feature set (``eval/cellpainting/profiles.py``) and, where cp-measure is installed
(the ``train`` extra), CellProfiler's measurements of segmented nuclei and cells
(``eval/cellpainting/cp_features.py``).

Only held-out plates are scored: the plates of the checkpoint's training split
(``data.train_split``) are left out, so DINO is never judged on plates it trained on (a
manifest whose every field is in that split is refused).

Each field's embedding covers the whole field, not one crop: ``octtrain.embed.encode`` (the
one definition ``octtrain embed`` exports) runs the EMA teacher on each of the field's
non-overlapping ``crops.global_size`` tiles in its 8 flips and quarter turns, and a tile's
embedding is its CLS token concatenated with its mean patch token (DINOv2's linear-evaluation
features), averaged over the transforms and the tiles. The random-init encoder is embedded the
same way.
On the twin this beat the mean CLS token of the tiles as they lie, for DINO more than for the
random init (measured with the evaluation before JUMP's recipe). The profiles' normalisation
(JUMP's recipe) is ``eval/cellpainting/recipe.py``'s, the retrieval mAP and its bootstrap intervals
``eval/cellpainting/retrieval.py``'s; the probe is the leave-one-out k-NN balanced accuracy of the
perturbation classes (``eval/common/knn.py``) on well profiles and on field embeddings. Beside each
encoder's mAP and interval, the report gives DINO minus each rival with a paired interval (the
same perturbations and wells drawn for both). The report goes to ``<out>/profile.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from octstage.manifest import atomic_write_text, check_output_folder, replace_report
from octtrain.config.dino import DinoConfig
from octtrain.data.cellpainting import CellPaintingDataset, FieldRecord
from octtrain.data.dataset import read_manifest
from octtrain.embed.encode import embed_fields, field_tiles
from octtrain.embed.encoders import dino_in_chans, dino_teacher
from octtrain.errors import ConfigError, DataError
from octtrain.eval.cellpainting import cp_features
from octtrain.eval.cellpainting.profiles import (
    Array,
    WellKey,
    handcrafted_features,
    recipe_profiles,
)
from octtrain.eval.cellpainting.recipe import RecipeConfig
from octtrain.eval.cellpainting.retrieval import (
    KINDS,
    RESAMPLES,
    Retrieval,
    map_interval,
    paired_difference,
)
from octtrain.eval.cellpainting.retrieval import retrieval as score_retrieval
from octtrain.eval.common.knn import knn_balanced_accuracy
from octtrain.eval.common.validation import agreed_batches
from octtrain.models.dino import build_student
from octtrain.models.vit2d import ViT2D
from octtrain.runtime.backend import Backend
from octtrain.runtime.checkpoint import load_checkpoint

log = logging.getLogger("octtrain")
RANDOM_SEEDS = 3
REPORT = "profile.json"
FIELDS_PER_BATCH = 8


class ProfiledField(FieldRecord, Protocol):
    """A manifest field with the Cell Painting typed part the profiles group by."""

    @property
    def plate(self) -> str: ...
    @property
    def well(self) -> str: ...
    @property
    def perturbation(self) -> str: ...
    @property
    def is_control(self) -> bool: ...


def encoders(
    checkpoint: str, in_chans: int, random_seeds: int = RANDOM_SEEDS
) -> tuple[DinoConfig, ViT2D, list[ViT2D]]:
    """(config, trained teacher backbone, the same backbone at random init with the seeds
    ``train.seed + 1 .. train.seed + random_seeds``)."""
    state = load_checkpoint(checkpoint)
    cfg, teacher = dino_teacher(state, checkpoint)
    if dino_in_chans(state, checkpoint) != in_chans:
        raise DataError(
            f"{checkpoint}: the DINO teacher reads {dino_in_chans(state, checkpoint)} channels, "
            f"the fields have {in_chans}: profile fields of the kind the run trained on"
        )
    randoms = []
    for i in range(random_seeds):
        torch.manual_seed(cfg.train.seed + 1 + i)
        random = build_student(cfg, in_chans).backbone
        # Random init sees its input as the trained encoder does (the same channel statistics).
        random.input_norm.load_state_dict(teacher.input_norm.state_dict())
        randoms.append(random.eval())
    return cfg, teacher, randoms


def field_embeddings(
    backbone: nn.Module,
    dataset: CellPaintingDataset,
    tile: int,
    device: torch.device,
    backend: Backend | None = None,
) -> Array:
    """Each field's embedding ``[fields, 2D]`` (``octtrain.embed.encode``: the one definition
    ``embed`` writes), ``FIELDS_PER_BATCH`` fields a forward. With a ``backend`` of several
    processes (training's validation: every host reads every field) each batch's read is agreed
    (``agreed_batches``): a field one host cannot read stops every host at that batch, with its
    message, as a ``ValidationError``."""
    backbone.to(device)
    batches = _field_batches(dataset, tile)
    if backend is not None and backend.process_count > 1:
        batches = agreed_batches(batches, backend)
    rows = [embed_fields(backbone, tiles, device) for tiles in batches]
    return np.concatenate(rows).astype(np.float64)


def _field_batches(dataset: CellPaintingDataset, tile: int) -> Iterator[list[torch.Tensor]]:
    """The fields' uint8 tiles, ``FIELDS_PER_BATCH`` fields a batch, read as they are asked."""
    for start in range(0, len(dataset), FIELDS_PER_BATCH):
        stop = min(start + FIELDS_PER_BATCH, len(dataset))
        yield [
            torch.from_numpy(field_tiles(dataset.open(i).read(), tile)) for i in range(start, stop)
        ]


def profiled(fields: Sequence[ProfiledField]) -> list[ProfiledField]:
    """The fields a profile can use: a field whose plate and well the metadata does not list has
    no perturbation to profile."""
    return [f for f in fields if f.perturbation or f.is_control]


@dataclass(frozen=True)
class Scored:
    """One encoder's metrics (floats: mAPs, their intervals, probes), per-well APs and the
    recipe's notes (steps skipped and why)."""

    metrics: dict[str, float]
    retrieval: Retrieval
    notes: list[str]


def held_out(fields: Sequence[ProfiledField], train_split: str) -> list[ProfiledField]:
    """The fields on plates a run whose training split is ``train_split`` did not train on: a
    plate with any field in that split is left out whole (build-cache splits by plate; this
    holds for a manifest that does not)."""
    seen = {f.plate for f in fields if f.split == train_split}
    return [f for f in fields if f.plate not in seen]


def profile_scores(
    x: Array,
    fields: Sequence[ProfiledField],
    resamples: int = RESAMPLES,
    recipe: RecipeConfig | None = None,
) -> Scored:
    """One encoder's scores from its field embeddings ``x`` (a row per field of ``fields``):
    activity and distinctiveness mAP of the recipe's well profiles with bootstrap intervals
    (``<kind>_map_low`` / ``_high``), the k-NN probes, the wells and features kept."""
    keys = [WellKey(f.plate, f.well, f.perturbation, f.is_control) for f in fields]
    classes = sorted({k.perturbation for k in keys})
    field_labels = np.array([classes.index(k.perturbation) for k in keys])
    result, wells = recipe_profiles(x, keys, recipe)
    well_labels = np.array([classes.index(w.perturbation) for w in wells])
    scored = score_retrieval(result.profiles, wells)
    metrics = dict(scored.maps)
    for kind in KINDS:
        ci = map_interval(scored.aps[kind], resamples)
        metrics[f"{kind}_map_low"], metrics[f"{kind}_map_high"] = ci.low, ci.high
    metrics["well_probe_knn_balanced_accuracy"] = knn_balanced_accuracy(
        result.profiles, well_labels
    )
    metrics["field_probe_knn_balanced_accuracy"] = knn_balanced_accuracy(x, field_labels)
    metrics["wells"] = float(len(wells))
    metrics["features_kept"] = float(len(result.kept))
    metrics["sphered"] = float(result.sphered)
    return Scored(metrics, scored, result.notes)


def profile_metrics(x: Array, fields: Sequence[ProfiledField]) -> dict[str, float]:
    """``profile_scores``' metrics (what validation logs)."""
    return profile_scores(x, fields).metrics


def per_perturbation(scored: Scored) -> dict[str, dict[str, float]]:
    """kind -> perturbation -> its mean AP (which phenotypes an encoder sees)."""
    out: dict[str, dict[str, float]] = {}
    for kind, ap in scored.retrieval.aps.items():
        if ap is not None:
            means = ap.groupby("perturbation")["average_precision"].mean()
            out[kind] = {str(k): float(v) for k, v in means.items()}
    return out


def profile_fields(
    checkpoint: str,
    fields: Sequence[ProfiledField],
    root: Path,
    device: str = "cpu",
    random_seeds: int = RANDOM_SEEDS,
    resamples: int = RESAMPLES,
    only_held_out: bool = True,
    fixed: dict[str, Array] | None = None,
) -> dict[str, Any]:
    """The report: per encoder (dino, random_init_<i> for each seed, handcrafted, cp_measure when
    installed) mAP with intervals and probes, per-perturbation APs, the recipe's notes, and
    DINO minus each rival with paired intervals. ``only_held_out`` leaves out the fields of the
    checkpoint's training split (a caller that picked held-out plates itself passes False).
    ``fixed``: a cache of the features that do not depend on the checkpoint (handcrafted,
    cp_measure), filled by the first call and reused by the next ones on the same fields."""
    fields = profiled(fields)
    if not fields:
        raise DataError("no Cell Painting fields with perturbation metadata to profile")
    dev = torch.device(device)
    cfg, trained, randoms = encoders(checkpoint, fields[0].shape[0], random_seeds)
    if only_held_out:
        fields = held_out(fields, cfg.data.train_split)
        if not fields:
            raise DataError(
                f"every profiled field lies on a plate of the checkpoint's training split "
                f"{cfg.data.train_split!r}: no held-out plate to score DINO on"
            )
    dataset = CellPaintingDataset(fields, root, cfg.crops, trained.patch)
    tile = cfg.crops.global_size
    features = {"dino": field_embeddings(trained, dataset, tile, dev)}
    for i, random in enumerate(randoms):
        features[f"random_init_{i}"] = field_embeddings(random, dataset, tile, dev)
    fixed = {} if fixed is None else fixed
    if "handcrafted" not in fixed:
        fixed["handcrafted"] = np.stack(
            [handcrafted_features(dataset.open(i).read()) for i in range(len(dataset))]
        )
    if cp_features.available() and "cp_measure" not in fixed:
        fixed["cp_measure"] = np.stack(
            [cp_features.cp_measure_features(dataset.open(i).read()) for i in range(len(dataset))]
        )
    if any(len(x) != len(dataset) for x in fixed.values()):
        raise ValueError("fixed features of other fields: a cache is for one set of fields")
    features.update(fixed)
    classes = sorted({f.perturbation for f in fields})
    report: dict[str, Any] = {
        "fields": len(fields),
        "plates": sorted({f.plate for f in fields}),
        "perturbations": classes,
        "random_seeds": [cfg.train.seed + 1 + i for i in range(random_seeds)],
        "resamples": resamples,
        "encoders": {},
        "per_perturbation": {},
        "notes": {},
        "dino_minus": {},
    }
    scores = {name: profile_scores(x, fields, resamples) for name, x in features.items()}
    for name, scored in scores.items():
        report["encoders"][name] = scored.metrics
        report["per_perturbation"][name] = per_perturbation(scored)
        report["notes"][name] = scored.notes
    dino = scores["dino"].retrieval.aps
    for name, scored in scores.items():
        if name != "dino":
            report["dino_minus"][name] = {
                kind: vars(paired_difference(dino[kind], scored.retrieval.aps[kind], resamples))
                for kind in KINDS
            }
    return report


def run_profile(
    checkpoint: str, manifest_path: str, cache: str | None, out: str | None, device: str
) -> dict[str, Any]:
    """``octtrain profile``: the manifest's held-out fields; writes ``profile.json``."""
    folder = Path(out) if out else Path(checkpoint).parent
    check_output_folder(folder, ConfigError)  # refused before the work, not after it
    manifest = read_manifest(manifest_path, "profile", "cellpainting")
    fields = manifest.fields
    root = Path(cache) if cache else Path(manifest_path).parent
    report = profile_fields(checkpoint, fields, root, device)
    text = json.dumps(report, indent=2)

    def write(tmp: Path) -> None:
        atomic_write_text(tmp / REPORT, text)

    replace_report(folder, REPORT.__eq__, write, ConfigError)
    for name, m in report["encoders"].items():
        log.info(
            "%s: activity mAP %.3f [%.3f, %.3f] (retrieved %.2f), distinctiveness mAP %.3f "
            "[%.3f, %.3f], well probe %.3f",
            name,
            m["activity_map"],
            m["activity_map_low"],
            m["activity_map_high"],
            m["activity_retrieved"],
            m["distinctiveness_map"],
            m["distinctiveness_map_low"],
            m["distinctiveness_map_high"],
            m["well_probe_knn_balanced_accuracy"],
        )
    return report
