"""One split's predictions -> the report ``evaluate`` and ``probe`` both write.

In ``folder``:

* ``metrics-<split>.json``: volume- and participant-level metrics (undefined values ``null``),
  the collapse verdict, per-group metrics with participant-bootstrap intervals and their counts,
  the bootstrap's seed and resamples, whatever the caller adds (checkpoint, probe settings), and
  every volume's probabilities;
* ``confusion-<split>.png``: the volume-level confusion matrix (true rows, predicted columns);
* ``groups-<split>.md`` and ``groups-<split>.png``: the per-group table and picture.

The tables go to the console as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from rich.console import Console

from octstage.manifest import Volume, atomic_write_text
from octtrain.eval.common import metrics as mt
from octtrain.eval.oct import breakdown as bd
from octtrain.eval.oct.breakdown_report import group_markdown, group_table, write_group_png
from octtrain.eval.oct.report import print_collapse, print_metrics, short, write_confusion_png


@dataclass(frozen=True)
class Scored:
    """What a split's predictions score: volume and participant metrics, groups, collapse."""

    volume: mt.ClassificationMetrics
    participant: mt.ClassificationMetrics
    groups: list[bd.GroupResult]
    collapse: str | None


@dataclass(frozen=True)
class ReportFiles:
    metrics_json: Path
    confusion_png: Path
    groups_md: Path
    groups_png: Path


def score(
    volumes: Sequence[Volume],
    labels: npt.NDArray[np.int64],
    probs: npt.NDArray[np.float64],
    classes: Sequence[str],
    spec: bd.BootstrapSpec,
    max_share: float,
) -> Scored:
    c = len(classes)
    volume = mt.classification_metrics(labels, probs, c)
    pids = [v.participant_id for v in volumes]
    _, plabels, pprobs = mt.participant_level(pids, labels, probs)
    participant = mt.classification_metrics(plabels, pprobs, c)
    alarm = mt.check_collapse(volume.histogram, max_share)
    collapse = None if alarm is None else alarm.message([short(x) for x in classes])
    groups = bd.breakdown(volumes, labels, probs, c, spec)
    return Scored(volume, participant, groups, collapse)


# Every file an evaluate report of one split may hold: (stem, extension), named stem-<split>.ext.
REPORT_STEMS = (("metrics", "json"), ("confusion", "png"), ("groups", "md"), ("groups", "png"))


def report_entry(split: str) -> Callable[[str], bool]:
    """Whether a file name belongs to an evaluate report of ``split`` (classification or
    regression): what a new report of that split replaces, moved aside."""
    names = {f"{stem}-{split}.{ext}" for stem, ext in REPORT_STEMS}
    return names.__contains__


def report_files(folder: Path, split: str) -> ReportFiles:
    """Where the report of ``split`` in ``folder`` is."""
    return ReportFiles(
        folder / f"metrics-{split}.json",
        folder / f"confusion-{split}.png",
        folder / f"groups-{split}.md",
        folder / f"groups-{split}.png",
    )


def write_report(
    folder: Path,
    split: str,
    title: str,
    volumes: Sequence[Volume],
    labels: npt.NDArray[np.int64],
    probs: npt.NDArray[np.float64],
    classes: Sequence[str],
    scored: Scored,
    spec: bd.BootstrapSpec,
    header: Mapping[str, Any],
    console: Console,
    max_share: float,
) -> ReportFiles:
    """Write the files above into ``folder`` and print the tables; ``header`` leads the JSON."""
    folder.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        **header,
        "split": split,
        "volume": mt.to_jsonable(scored.volume, classes),
        "participant": mt.to_jsonable(scored.participant, classes),
        "collapse": scored.collapse,
        "collapse_max_share": max_share,
        **bd.to_jsonable(scored.groups, spec),
        "predictions": [
            {
                "participant_id": v.participant_id,
                "zarr_path": v.zarr_path,
                "device": v.device,
                "label": int(label),
                "probs": [round(float(p), 6) for p in row],
            }
            for v, label, row in zip(volumes, labels, probs, strict=True)
        ],
    }
    files = report_files(folder, split)
    atomic_write_text(files.metrics_json, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    n, bacc = scored.volume.num_samples, scored.volume.balanced_accuracy
    write_confusion_png(
        files.confusion_png,
        scored.volume.confusion,
        classes,
        f"{split}: {n} volumes, balanced accuracy {bacc:.3f}",
    )
    atomic_write_text(files.groups_md, group_markdown(scored.groups, spec))
    write_group_png(files.groups_png, scored.groups, f"{title}: {split} split by group")
    results = {"volume": scored.volume, "participant": scored.participant}
    print_metrics(console, f"{split} split ({title})", results, classes)
    console.print(group_table(f"{split} split ({title}) by group", scored.groups, spec))
    if scored.collapse is not None:
        print_collapse(console, f"{split}: {scored.collapse}")
    return files
