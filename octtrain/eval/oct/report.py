"""Metrics for people: the rich console table, the collapse banner, the confusion-matrix picture.

Rendering only; the numbers come from ``octtrain.metrics``. Undefined values print as ``n/a``.
The picture is drawn with matplotlib's Agg backend (no display needed), as a PNG file for
``octtrain evaluate`` and as an RGB array for the tracker during finetuning.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from octtrain.config.finetune import LossConfig
from octtrain.eval.common.metrics import ClassificationMetrics

# Long study-group names do not fit a table column or a matrix axis.
SHORT_NAMES = {
    "healthy": "healthy",
    "pre_diabetes_lifestyle_controlled": "pre-diabetes",
    "oral_medication_and_or_non_insulin_injectable_medication_controlled": "oral/non-insulin",
    "insulin_dependent": "insulin",
}


def short(name: str) -> str:
    return SHORT_NAMES.get(name, name)


def _fmt(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def summary_table(title: str, results: Mapping[str, ClassificationMetrics]) -> Table:
    """Headline metrics, one column per result (e.g. volume level and participant level)."""
    table = Table(title=title)
    table.add_column("metric")
    for name in results:
        table.add_column(name, justify="right")
    table.add_row("samples", *(str(m.num_samples) for m in results.values()))
    rows = [
        ("accuracy", "accuracy"),
        ("balanced accuracy", "balanced_accuracy"),
        ("macro F1", "macro_f1"),
        ("macro AUROC (one-vs-rest)", "macro_auroc"),
        ("macro AUPR (one-vs-rest)", "macro_aupr"),
        ("Cohen's kappa", "kappa"),
        ("mean prediction entropy (nats)", "mean_entropy"),
    ]
    for label, attr in rows:
        table.add_row(label, *(_fmt(float(getattr(m, attr))) for m in results.values()))
    return table


def per_class_table(title: str, m: ClassificationMetrics, classes: Sequence[str]) -> Table:
    """Precision, recall, F1, AUROC, AUPR, true and predicted counts per class."""
    table = Table(title=title)
    table.add_column("class", no_wrap=True)
    for col in ("prec", "recall", "F1", "AUROC", "AUPR", "true", "pred"):
        table.add_column(col, justify="right")
    for i, name in enumerate(classes):
        values = (m.precision[i], m.recall[i], m.f1[i], m.auroc[i], m.aupr[i])
        table.add_row(
            short(name), *(_fmt(float(v)) for v in values), str(m.support[i]), str(m.histogram[i])
        )
    return table


def print_metrics(
    console: Console,
    title: str,
    results: Mapping[str, ClassificationMetrics],
    classes: Sequence[str],
) -> None:
    """The summary table, then the per-class table of the first result."""
    console.print(summary_table(title, results))
    first_name, first = next(iter(results.items()))
    console.print(per_class_table(f"{title}: per class ({first_name} level)", first, classes))


def collapse_banner(message: str) -> Panel:
    """A red box that does not scroll by unnoticed."""
    return Panel(message, title="COLLAPSE ALARM", border_style="bold red", style="bold red")


def print_collapse(console: Console, message: str) -> None:
    console.print(collapse_banner(message))


def confusion_figure_png(cm: npt.NDArray[np.int64], classes: Sequence[str], title: str) -> bytes:
    """The confusion matrix (true rows, predicted columns) as PNG bytes; counts and row shares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [short(c) for c in classes]
    rows = cm.sum(axis=1, keepdims=True)
    share = np.divide(cm, rows, out=np.zeros(cm.shape, dtype=np.float64), where=rows > 0)
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(names), 1.2 + 1.2 * len(names)), dpi=100)
    ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0)
    for (t, p), count in np.ndenumerate(cm):
        color = "white" if share[t, p] > 0.5 else "black"
        ax.text(p, t, f"{count}\n{share[t, p]:.0%}", ha="center", va="center", color=color)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def confusion_rgb(
    cm: npt.NDArray[np.int64], classes: Sequence[str], title: str
) -> npt.NDArray[np.uint8]:
    """The same picture as an ``(H, W, 3)`` uint8 array (for ``Tracker.log_images``)."""
    import matplotlib.image as mpimg

    png = confusion_figure_png(cm, classes, title)
    rgba = mpimg.imread(io.BytesIO(png), format="png")
    return np.asarray(np.rint(rgba[..., :3] * 255), dtype=np.uint8)


def write_confusion_png(
    path: Path, cm: npt.NDArray[np.int64], classes: Sequence[str], title: str
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(confusion_figure_png(cm, classes, title))


def class_table(
    classes: Sequence[str],
    volumes: Mapping[str, Sequence[int]],
    train: str,
    val: str,
    weights: npt.NDArray[np.float64] | None,
    loss: LossConfig,
) -> Table:
    """Volumes per class in the training and validation splits, and the loss weights."""
    table = Table(title=f"classes and loss weights ({loss.class_weights})")
    table.add_column("class", no_wrap=True)
    for col in (f"{train} volumes", f"{val} volumes", "loss weight"):
        table.add_column(col, justify="right")
    for i, name in enumerate(classes):
        weight = "1" if weights is None else f"{weights[i]:.3f}"
        table.add_row(short(name), str(volumes[train][i]), str(volumes[val][i]), weight)
    return table
