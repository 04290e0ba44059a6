"""``octtrain profile``: well-level profiles of a DINO checkpoint's fields and the field's
metrics, beside the baselines: the same encoder at random init (``RANDOM_SEEDS`` seeds), a small
handcrafted feature set (``eval/cellpainting/profiles.py``) and, where cp-measure is installed
(the ``train`` extra), CellProfiler's measurements of segmented nuclei and cells
(``eval/cellpainting/cp_features.py``).

Only held-out plates are scored: the plates of the checkpoint's training split
(``data.train_split``) are left out, so DINO is never judged on plates it trained on (a
manifest whose every field is in that split is refused).

Each field's embedding covers the whole field, not one crop: ``octtrain.embed.encode`` (the
one definition ``octtrain embed`` exports) runs the EMA teacher on a ``crops.global_size`` crop
centred on each of the field's nuclei (its tiles where none is found) in its 8 flips and quarter
turns; a crop's embedding is its CLS token, its mean patch token and its patch tokens' spread,
averaged over the transforms, and the field's the mean and the spread of its crops'. The
random-init encoder is embedded the same way. The profiles' normalisation
(JUMP's recipe) is ``eval/cellpainting/recipe.py``'s, the retrieval mAP and its bootstrap intervals
``eval/cellpainting/retrieval.py``'s; the probe is the leave-one-out k-NN balanced accuracy of the
perturbation classes (``eval/common/knn.py``) on well profiles and on field embeddings
(``eval/cellpainting/scores.py``). Each encoder is scored under JUMP's deep-learning recipe
(no sphering; the primary one) and the sphered one, over every perturbation and over those the
checkpoint never trained on and, given the twin's phenotype families (the bench passes
``octstage.cellpainting.families.twin_families``), over each family; beside each mAP and its
interval (``resample.py``: plates, control wells, perturbations and wells resampled), DINO
minus each rival with a paired interval (the same draws for both). The report goes to
``<out>/profile.json``.

What the network adds is scored apart (``network_parts``): an encoder that standardises each
crop gets back the crops' per-channel statistics in its embedding (``embed/encode.py``), and
those alone separate every phenotype that changes an amount, at any weights. So beside each full
embedding come its tokens alone (``dino_tokens``, ``random_init_<i>_tokens``), the statistics
alone (``statistics``: no network at all), and Gaussian noise of the embedding's width on the
same wells (``noise_floor``: the chance floor under the same recipe, controls and draws; the
sphered recipe's floor sits above the deep-learning one's, as its ZCA is fitted on the DMSO wells
it then ranks). ``dino_tokens_minus`` is DINO's tokens minus each rival's tokens, paired: whether
training taught the network anything a random one lacks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from octstage.manifest import atomic_write_text, check_output_folder, replace_report
from octtrain.config.dino import DinoConfig
from octtrain.data.cellpainting import CellPaintingDataset
from octtrain.data.dataset import read_manifest
from octtrain.embed.encode import embed_fields, embedding_parts, field_views, stats_restored
from octtrain.embed.encoders import dino_in_chans, dino_teacher
from octtrain.errors import ConfigError, DataError
from octtrain.eval.cellpainting import cp_features
from octtrain.eval.cellpainting.profiles import Array, handcrafted_features
from octtrain.eval.cellpainting.scores import (
    PRIMARY,
    RECIPES,
    RESAMPLES,
    ProfiledField,
    Scored,
    paired_difference,
    per_perturbation,
    profile_scores,
)
from octtrain.eval.common.validation import ValidationError, agreed_batches, local_failure
from octtrain.models.dino import build_student
from octtrain.models.vit2d import ViT2D
from octtrain.runtime import hosts
from octtrain.runtime.backend import Backend
from octtrain.runtime.checkpoint import load_checkpoint

log = logging.getLogger("octtrain")
RANDOM_SEEDS = 3
REPORT = "profile.json"
FIELDS_PER_BATCH = 8
FLOOR_SEED = 0  # the noise features' generator: the floor is the same on every run


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
    """Each field's embedding ``[fields, 2E]`` (``octtrain.embed.encode``: the one definition
    ``embed`` writes), ``FIELDS_PER_BATCH`` fields a forward. With a ``backend`` of several
    processes (training's validation: every host reads every field) each batch's read is agreed
    (``agreed_batches``): a field one host cannot read stops every host at that batch, with its
    message, as a ``ValidationError``."""
    backbone.to(device)
    batches = _field_batches(dataset, tile)
    if backend is None or backend.process_count == 1:
        rows = [embed_fields(backbone, tiles, device) for tiles in batches]
        return np.concatenate(rows).astype(np.float64)
    failed: list[ValidationError] = []  # this host's failure: the next agreement stops all
    rows = []
    for tiles in agreed_batches(batches, backend, lambda: failed[0] if failed else None):
        try:
            rows.append(embed_fields(backbone, tiles, device))
        except Exception as exc:  # noqa: BLE001 - a forward failing on this host alone (an OOM)
            failed.append(local_failure(backend, exc))
    # The last batch's failure: every process agrees once more after the pass.
    hosts.agree(backend, failed[0] if failed else None, "in validation", kind=ValidationError)
    return np.concatenate(rows).astype(np.float64)


def _field_batches(dataset: CellPaintingDataset, tile: int) -> Iterator[list[torch.Tensor]]:
    """The fields' uint8 views (``field_views``), ``FIELDS_PER_BATCH`` fields a batch, read as
    they are asked."""
    for start in range(0, len(dataset), FIELDS_PER_BATCH):
        stop = min(start + FIELDS_PER_BATCH, len(dataset))
        yield [
            torch.from_numpy(field_views(dataset.open(i).read(), tile)) for i in range(start, stop)
        ]


def network_parts(
    features: Mapping[str, Array], trained: nn.Module, channels: int
) -> dict[str, Array]:
    """The encoders' tokens alone (``<name>_tokens``) and the restored statistics alone
    (``statistics``; the same for every encoder: they are the crops', not the network's), for
    the full embeddings in ``features`` (``dino``, ``random_init_<i>``); ``{}`` when the encoder
    restores none (its embedding is its tokens)."""
    if not stats_restored(trained):
        return {}
    tokens, stats = embedding_parts(features["dino"].shape[1], channels)
    out = {f"{name}_tokens": x[:, tokens] for name, x in features.items()}
    out["statistics"] = features["dino"][:, stats]
    return out


def noise_floor(fields: int, width: int) -> Array:
    """Gaussian features ``[fields, width]`` (``FLOOR_SEED``): scored as an encoder on the same
    wells, the chance floor of every mAP under the same recipe and draws."""
    floor: Array = np.random.default_rng(FLOOR_SEED).standard_normal((fields, width))
    return floor


def profiled(fields: Sequence[ProfiledField]) -> list[ProfiledField]:
    """The fields a profile can use: a field whose plate and well the metadata does not list has
    no perturbation to profile."""
    return [f for f in fields if f.perturbation or f.is_control]


def held_out(fields: Sequence[ProfiledField], train_split: str) -> list[ProfiledField]:
    """The fields on plates a run whose training split is ``train_split`` did not train on: a
    plate with any field in that split is left out whole (build-cache splits by plate; this
    holds for a manifest that does not)."""
    seen = {f.plate for f in fields if f.split == train_split}
    return [f for f in fields if f.plate not in seen]


def profile_fields(
    checkpoint: str,
    fields: Sequence[ProfiledField],
    root: Path,
    device: str = "cpu",
    random_seeds: int = RANDOM_SEEDS,
    resamples: int = RESAMPLES,
    only_held_out: bool = True,
    fixed: dict[str, Array] | None = None,
    unseen: Collection[str] | None = None,
    families: Mapping[str, Collection[str]] | None = None,
) -> dict[str, Any]:
    """The report: under each recipe (``scores.RECIPES``; the primary one's also at the top),
    per encoder (dino, random_init_<i> for each seed, handcrafted, cp_measure when installed)
    mAP with intervals and probes, per-perturbation APs, the recipe's notes, and DINO minus each
    rival with paired intervals. ``only_held_out`` leaves out the fields of the checkpoint's
    training split (a caller that picked held-out plates itself passes False). ``unseen``: the
    perturbations DINO never trained on, also scored alone (default: with ``only_held_out``,
    those absent from the training split's fields). ``fixed``: a cache of the features that do
    not depend on the checkpoint (handcrafted, cp_measure), filled by the first call and reused
    by the next ones on the same fields. ``families``: family -> its perturbations, each scored
    apart (a twin's, which the bench passes from ``octstage.cellpainting.families``; a screen has
    none, and octtrain knows nothing of the twin but what the manifest says)."""
    fields = profiled(fields)
    if not fields:
        raise DataError("no Cell Painting fields with perturbation metadata to profile")
    dev = torch.device(device)
    cfg, trained, randoms = encoders(checkpoint, fields[0].shape[0], random_seeds)
    if only_held_out:
        if unseen is None:
            seen = {f.perturbation for f in fields if f.split == cfg.data.train_split}
            unseen = {f.perturbation for f in fields} - seen
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
    features.update(network_parts(features, trained, fields[0].shape[0]))
    features["noise_floor"] = noise_floor(len(dataset), features["dino"].shape[1])
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
    families = families or {}
    report: dict[str, Any] = {
        "fields": len(fields),
        "plates": sorted({f.plate for f in fields}),
        "perturbations": classes,
        "unseen_perturbations": sorted(set(unseen or ()) & set(classes)),
        "families": {name: sorted(set(ids) & set(classes)) for name, ids in families.items()},
        "statistics_restored": "statistics" in features,
        "random_seeds": [cfg.train.seed + 1 + i for i in range(random_seeds)],
        "resamples": resamples,
        "recipe": PRIMARY,
        "recipes": {
            name: recipe_section(features, fields, resamples, name, unseen or (), families)
            for name in RECIPES
        },
    }
    report.update(report["recipes"][PRIMARY])  # the primary recipe's, at the top
    return report


def recipe_section(
    features: dict[str, Array],
    fields: Sequence[ProfiledField],
    resamples: int,
    recipe: str,
    unseen: Collection[str],
    families: Mapping[str, Collection[str]] | None = None,
) -> dict[str, Any]:
    """Every encoder's scores under one recipe: metrics, per-perturbation APs, the recipe's
    notes, the chance floor (``noise_floor``'s metrics), DINO minus each rival and DINO's
    tokens minus each rival's tokens (and the statistics, and the floor), with paired intervals
    (every kind and subset)."""
    scores: dict[str, Scored] = {
        name: profile_scores(x, fields, resamples, RECIPES[recipe], unseen, families)
        for name, x in features.items()
    }
    keys = list(scores["dino"].samples)
    token_rivals = [n for n in scores if n.endswith("_tokens") and n != "dino_tokens"] + [
        "statistics",
        "noise_floor",
    ]

    def minus(mine: str, rivals: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
        return {
            name: {
                key: vars(paired_difference(scores[mine], scores[name], key))
                for key in keys
                if key in scores[name].samples
            }
            for name in rivals
            if name in scores
        }

    return {
        "encoders": {name: s.metrics for name, s in scores.items()},
        "floor": scores["noise_floor"].metrics,
        "per_perturbation": {name: per_perturbation(s) for name, s in scores.items()},
        "notes": {name: s.notes for name, s in scores.items()},
        "dino_minus": minus("dino", [n for n in scores if n != "dino"]),
        "dino_tokens_minus": minus("dino_tokens", token_rivals) if "dino_tokens" in scores else {},
    }


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
    floor = report["floor"]
    for name, m in report["encoders"].items():
        log.info(
            "%s: activity mAP %.3f [%.3f, %.3f] (floor %.3f, retrieved %.2f), distinctiveness "
            "mAP %.3f [%.3f, %.3f] (floor %.3f), well probe %.3f",
            name,
            m["activity_map"],
            m["activity_map_low"],
            m["activity_map_high"],
            floor["activity_map"],
            m["activity_retrieved"],
            m["distinctiveness_map"],
            m["distinctiveness_map_low"],
            m["distinctiveness_map_high"],
            floor["distinctiveness_map"],
            m["well_probe_knn_balanced_accuracy"],
        )
    for rival, d in report["dino_tokens_minus"].items():
        a = d["activity"]
        log.info(
            "DINO's tokens minus %s: activity mAP %+.3f [%+.3f, %+.3f]",
            rival,
            a["value"],
            a["low"],
            a["high"],
        )
    return report
