"""Select and label at training time, from the manifest alone (``data.select``, ``data.label``).

``select`` keeps the volumes whose device, anatomic region, scan size and eye are among the
config's entries; ``relabel`` turns the study group (default) into a clinical concept's named
bins (classification) or its value (regression: one output, ``target`` of the dataset item).
Both return a new ``Manifest`` whose ``classes`` and per-volume ``label`` / ``study_group`` say
what the run predicts, so the rest of the trainer (split checks, class counts, the classifier)
reads it unchanged. Pure: no I/O.

Errors (``DataError``) come before any training, naming the key and the value: a selection
value no volume of the manifest has (with the values it does have), a concept the manifest did
not copy (``octstage build-cache --concept``), a split the selection leaves empty, a named bin
no training volume falls in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from octstage.manifest import Manifest, Volume
from octtrain.config.sections import LabelConfig, SelectConfig
from octtrain.errors import DataError


@dataclass(frozen=True)
class Selection:
    """What selection and labelling did: counts for the start of the run's log."""

    kept: int
    dropped_by_select: int
    dropped_no_value: int  # volumes whose participant has no usable value of the concept
    target: str  # what is predicted: "study_group", or the concept's name and unit
    regression: bool = False


def _keys(v: Volume) -> dict[str, tuple[str, ...]]:
    region = v.anatomic_region
    full = f"{region}, {v.scan_size}" if region and v.scan_size else region
    return {
        "device": (v.device, v.device_model),
        "region": (region, full),
        "scan_size": (v.scan_size,),
        "eye": (v.laterality,),
    }


def select(manifest: Manifest, cfg: SelectConfig) -> Manifest:
    """The manifest's volumes that ``cfg`` keeps; an entry no volume has is a ``DataError``."""
    wanted = {"device": cfg.device, "region": cfg.region, "scan_size": cfg.scan_size,
              "eye": cfg.eye}  # fmt: skip
    for key, values in wanted.items():
        have = {x for v in manifest.volumes for x in _keys(v)[key] if x}
        unknown = [x for x in values if x not in have]
        if unknown:
            hint = (
                "; this manifest records no regions: rebuild the cache from a source with "
                "retinal_oct/manifest.tsv"
                if key in ("region", "scan_size") and not have
                else ""
            )
            raise DataError(
                f"data.select.{key}: {', '.join(map(repr, unknown))} matches no volume of the "
                f"manifest (it has {sorted(have)}){hint}"
            )
    kept = tuple(
        v
        for v in manifest.volumes
        if all(not values or set(_keys(v)[key]) & set(values) for key, values in wanted.items())
    )
    return dataclasses.replace(manifest, volumes=kept)


def relabel(manifest: Manifest, cfg: LabelConfig) -> tuple[Manifest, str]:
    """The manifest with ``classes`` and labels for ``cfg``, and the target's description."""
    if cfg.concept is None:
        return manifest, "study_group"
    key = str(cfg.concept)
    concept = next((c for c in manifest.concepts if c.concept_id == cfg.concept), None)
    if concept is None:
        copied = [c.concept_id for c in manifest.concepts]
        raise DataError(
            f"data.label.concept: {cfg.concept} is not in the manifest (copied: {copied}); "
            f"rebuild it with octstage build-cache --concept {cfg.concept}"
        )
    name = concept.name or key
    target = f"{name} ({concept.unit})" if concept.unit else name
    volumes = []
    for v in manifest.volumes:
        if key not in v.clinical:
            continue
        value = v.clinical[key]
        if cfg.regression:
            volumes.append(dataclasses.replace(v, label=0, study_group=name))
        else:
            index = sum(value >= edge for edge in cfg.bins)
            volumes.append(dataclasses.replace(v, label=index, study_group=cfg.names[index]))
    classes = (name,) if cfg.regression else tuple(cfg.names)
    return dataclasses.replace(manifest, classes=classes, volumes=tuple(volumes)), target


def prepare(
    manifest: Manifest,
    select_cfg: SelectConfig,
    label_cfg: LabelConfig,
    needed: Sequence[str],
    every_class_in: str | None = None,
) -> tuple[Manifest, Selection]:
    """``select`` then ``relabel``; every ``needed`` split must keep volumes and, for a
    classification, the ``every_class_in`` split (training) a volume of every class."""
    chosen = select(manifest, select_cfg)
    labelled, target = relabel(chosen, label_cfg)
    for split in needed:
        if not labelled.split(split):
            raise DataError(
                f"split {split!r} has no volume after data.select {_describe(select_cfg)} and "
                f"data.label {target} ({len(chosen.split(split))} selected, none with a value)"
            )
    if every_class_in is not None and not label_cfg.regression:
        present = {v.label for v in labelled.split(every_class_in)}
        empty = [c for i, c in enumerate(labelled.classes) if i not in present]
        if empty:
            raise DataError(
                f"class(es) {empty} have no volume in split {every_class_in!r} after data.select "
                f"{_describe(select_cfg)}; change data.label.bins or the selection"
            )
    info = Selection(
        kept=len(labelled.volumes),
        dropped_by_select=len(manifest.volumes) - len(chosen.volumes),
        dropped_no_value=len(chosen.volumes) - len(labelled.volumes),
        target=target,
        regression=label_cfg.regression,
    )
    return labelled, info


def target_of(volume: Volume, cfg: LabelConfig) -> float:
    """A volume's regression target (its concept value); 0.0 for a classification."""
    return volume.clinical.get(str(cfg.concept), 0.0) if cfg.regression else 0.0


def _describe(cfg: SelectConfig) -> str:
    parts = [f"{k}={list(v)}" for k, v in dataclasses.asdict(cfg).items() if v]
    return " ".join(parts) or "(all volumes)"
