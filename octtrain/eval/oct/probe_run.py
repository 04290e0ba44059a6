"""``octtrain probe``: frozen-encoder probes of a checkpoint -> the same report as ``evaluate``.

The checkpoint is a pretraining one (its EMA target encoder by default, as V-JEPA evaluates) or
a finetuning one (its encoder). The encoder runs once per split (train, val and the evaluated
split) and its tokens are cached (octtrain/eval/oct/tokens.py); an attentive and a linear probe
are fitted on the training tokens over a learning-rate grid, chosen on validation
(octtrain/eval/oct/probe_train.py), and scored on the evaluated split. Output in ``--out`` (default:
``probe/`` in the checkpoint's run folder):

* ``attentive/`` and ``linear/``: ``metrics-<split>.json``, ``confusion-<split>.png``,
  ``groups-<split>.md``/``.png``, as ``octtrain evaluate`` writes them;
* ``probe.json``: both probes' chosen learning rate and epoch, the whole grid's validation
  scores, the test metrics with intervals, the feature keys and the seeds;
* ``features/``: the cached tokens (``--feature-cache`` puts them elsewhere).

Volumes without a label (label < 0) are left out: a probe needs labels.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from octstage.manifest import (
    atomic_write_text,
    check_feature_cache,
    check_output_folder,
    replace_report,
)
from octtrain.data.dataset import read_manifest
from octtrain.data.splits import check_splits
from octtrain.embed.encoders import load_encoder
from octtrain.errors import ConfigError
from octtrain.eval.oct.breakdown import BootstrapSpec
from octtrain.eval.oct.breakdown_report import fmt_interval
from octtrain.eval.oct.evaluate import default_out
from octtrain.eval.oct.probe_train import PROBES, ProbeFit, ProbeSettings, fit_probe, predict_probs
from octtrain.eval.oct.results import Scored, score, write_report
from octtrain.eval.oct.tokens import Frozen, feature_key, split_features
from octtrain.runtime import checkpoint as ckpt
from octtrain.runtime.backend import make_backend
from octtrain.runtime.checkpoint import resolve_checkpoint

log = logging.getLogger("octtrain")
SUMMARY = "probe.json"  # beside the probes' report folders
console = Console()


@dataclass(frozen=True)
class ProbeResult:
    out: Path
    summary_json: Path
    scored: dict[str, Scored]  # probe kind -> its scores on the evaluated split
    fits: dict[str, ProbeFit]
    features_cached: dict[str, bool]  # split -> read from the cache


def split_caveat(split: str) -> str | None:
    """What a score on ``split`` is, when it is not held out: the probes are fitted on train and
    their learning rate and epoch chosen on val, so either split's figures flatter them."""
    if split == "train":
        return (
            "--split train scores the split the probes were fitted on: the figures say how well "
            "they fit it, not how they generalise (--split test is held out)"
        )
    if split == "val":
        return (
            "--split val scores the split the probes' learning rate and epoch were chosen on: "
            "the figures are optimistic (--split test is held out)"
        )
    return None


def run_probe(
    checkpoint: str,
    manifest: str,
    split: str = "test",
    cache: str | None = None,
    out: str | None = None,
    feature_cache: str | None = None,
    encoder: str = "target",
    device: str = "auto",
    batch_size: int = 8,
    settings: ProbeSettings | None = None,
    bootstrap: BootstrapSpec | None = None,
    max_share: float = 0.8,
) -> ProbeResult:
    settings = settings or ProbeSettings()
    spec = bootstrap or BootstrapSpec()
    caveat = split_caveat(split)
    if caveat:
        log.warning("%s", caveat)
    url = resolve_checkpoint(checkpoint)
    folder = Path(out) if out else default_out(url) / "probe"
    features_dir = Path(feature_cache) if feature_cache else folder / "features"
    # Both refused before any work; the report is written whole at the end (octstage/outputs.py).
    check_output_folder(folder, ConfigError)
    check_feature_cache(features_dir, ConfigError)
    state = ckpt.load_checkpoint(url)
    model, shape, num_heads, encoder_name = load_encoder(state, url, encoder)
    sha = ckpt.checkpoint_sha256(url)
    full = read_manifest(manifest, "probe")
    man = dataclasses.replace(full, volumes=tuple(v for v in full.volumes if v.label >= 0))
    splits = list(dict.fromkeys(["train", "val", split]))
    check_splits(man, splits)
    classes = tuple(man.classes)
    cache_root = Path(cache) if cache else Path(manifest).parent
    backend = make_backend(device, "fp32")  # features once, in full precision
    feats: dict[str, Frozen] = {}
    try:
        for s in splits:
            key = feature_key(sha, encoder_name, shape, man.split(s))
            feats[s] = split_features(
                model, man, cache_root, s, shape, key, features_dir, backend, batch_size
            )
    finally:
        backend.close()
    del model
    volumes = man.split(split)
    labels = feats[split].labels.numpy().astype(np.int64)
    header: dict[str, Any] = {
        "checkpoint": url,
        "checkpoint_sha256": sha,
        "encoder": encoder_name,
        "manifest": str(manifest),
        "seeds": {"probe": settings.seed, "bootstrap": spec.seed},
        "feature_keys": {s: f.key for s, f in feats.items()},
    }
    fits: dict[str, ProbeFit] = {}
    scored: dict[str, Scored] = {}

    def write(tmp: Path) -> None:
        summary = {}
        for kind in PROBES:
            fit = fit_probe(
                kind,
                (feats["train"].tokens, feats["train"].labels),
                (feats["val"].tokens, feats["val"].labels),
                len(classes),
                num_heads,
                settings,
            )
            probs = predict_probs(fit.head, feats[split].tokens).numpy()
            scored[kind] = score(volumes, labels, probs, classes, spec, max_share)
            fits[kind] = fit
            probe_doc = _probe_doc(fit, settings)
            write_report(
                tmp / kind,
                split,
                f"{kind} probe, {Path(url).name}",
                volumes,
                labels,
                probs,
                classes,
                scored[kind],
                spec,
                {**header, "probe": probe_doc},
                console,
                max_share,
            )
            overall = scored[kind].groups[0].metrics
            summary[kind] = {
                **probe_doc,
                "test": {
                    name: {"value": _num(i.value), "ci_low": _num(i.low), "ci_high": _num(i.high)}
                    for name, i in overall.items()
                },
            }
        doc = {
            **header,
            "split": split,
            "probes": summary,
            **({"caveat": caveat} if caveat else {}),
        }
        atomic_write_text(tmp / SUMMARY, json.dumps(doc, indent=1, allow_nan=False) + "\n")

    # The report (both probes' folders and probe.json) replaces an earlier one whole; the
    # feature cache beside it stays.
    aside = replace_report(folder, (*PROBES, SUMMARY).__contains__, write, ConfigError)
    if aside is not None:
        log.info("the earlier probe report of this folder is now in %s", aside)
    summary_json = folder / SUMMARY
    console.print(_summary_table(split, scored, fits))
    if caveat:
        log.warning("%s", caveat)  # again under the table, where the figures are read
    log.info("wrote %s", summary_json)
    cached = {s: f.cached for s, f in feats.items()}
    return ProbeResult(folder, summary_json, scored, fits, cached)


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 6)


def _probe_doc(fit: ProbeFit, settings: ProbeSettings) -> dict[str, Any]:
    return {
        "kind": fit.kind,
        "chosen_lr": fit.chosen.lr,
        "chosen_epoch": fit.chosen.best_epoch,
        "val_balanced_accuracy": _num(fit.chosen.val_balanced_accuracy),
        "grid": [
            {**dataclasses.asdict(p), "val_balanced_accuracy": _num(p.val_balanced_accuracy)}
            for p in fit.grid
        ],
        "settings": dataclasses.asdict(settings),
    }


def _summary_table(split: str, scored: dict[str, Scored], fits: dict[str, ProbeFit]) -> Table:
    table = Table(title=f"frozen-encoder probes, {split} split (95% participant bootstrap)")
    for col in ("probe", "lr", "epoch", "val bal. acc.", "balanced accuracy", "macro AUROC"):
        table.add_column(col, justify="left" if col == "probe" else "right")
    for kind, s in scored.items():
        m, c = s.groups[0].metrics, fits[kind].chosen
        table.add_row(
            kind,
            f"{c.lr:g}",
            str(c.best_epoch),
            f"{c.val_balanced_accuracy:.3f}",
            fmt_interval(m.get("balanced_accuracy")),
            fmt_interval(m.get("macro_auroc")),
        )
    return table
