"""The per-group report for people: a console table, a Markdown table (paste into a paper or a
README) and a picture of each headline metric per group with its interval.

Rendering only; the numbers come from ``octtrain.eval.oct.breakdown``. A value prints as
``0.812 [0.741, 0.880]``; an undefined one as ``n/a``; a group too small to score prints its
counts and ``too small``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from octtrain.eval.common.bootstrap import Interval
from octtrain.eval.oct.breakdown import BootstrapSpec, GroupResult

# The columns shown (all of INTERVAL_METRICS are in the JSON).
SHOWN = (("balanced_accuracy", "balanced acc."), ("macro_auroc", "macro AUROC"))
PLOTTED = SHOWN


def fmt_interval(i: Interval | None) -> str:
    if i is None or math.isnan(i.value):
        return "n/a"
    if math.isnan(i.low):
        return f"{i.value:.3f}"
    return f"{i.value:.3f} [{i.low:.3f}, {i.high:.3f}]"


def _cells(r: GroupResult) -> list[str]:
    counts = [r.grouping, r.name, str(r.volumes), str(r.participants)]
    if r.too_small is not None:
        return counts + ["too small"] * len(SHOWN)
    return counts + [fmt_interval(r.metrics.get(key)) for key, _ in SHOWN]


def _caption(spec: BootstrapSpec) -> str:
    return (
        f"{spec.confidence:.0%} intervals: percentile bootstrap over participants, "
        f"{spec.resamples} resamples, seed {spec.seed}; groups under "
        f"{spec.min_participants} participants are not scored"
    )


def group_table(title: str, rows: Sequence[GroupResult], spec: BootstrapSpec) -> Table:
    table = Table(title=title, caption=_caption(spec))
    for col in ("grouping", "group", "volumes", "participants"):
        table.add_column(col, no_wrap=True, justify="left" if col.startswith("group") else "right")
    for _, label in SHOWN:
        table.add_column(label, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*_cells(r))
    return table


def group_markdown(rows: Sequence[GroupResult], spec: BootstrapSpec) -> str:
    head = ["grouping", "group", "volumes", "participants", *(label for _, label in SHOWN)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + f"\n\n{_caption(spec)}.\n"


def group_figure_png(rows: Sequence[GroupResult], title: str) -> bytes:
    """One panel per plotted metric: a point and its interval per scored group; groups too
    small to score are listed on the axis with no point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{r.grouping}: {r.name} (n={r.participants})" for r in rows]
    fig, axes = plt.subplots(
        1, len(PLOTTED), figsize=(5.0 * len(PLOTTED), 1.2 + 0.35 * len(rows)), dpi=100, sharey=True
    )
    axes = list(axes) if len(PLOTTED) > 1 else [axes]
    ys = list(range(len(rows)))[::-1]
    for ax, (key, label) in zip(axes, PLOTTED, strict=True):
        for y, r in zip(ys, rows, strict=True):
            i = r.metrics.get(key)
            if i is None or math.isnan(i.value):
                ax.text(0.5, y, "too small" if r.too_small else "n/a", va="center", ha="center")
                continue
            color = "black" if r.grouping in ("overall", "participant") else "tab:blue"
            if not math.isnan(i.low):
                ax.plot([i.low, i.high], [y, y], color=color, linewidth=2)
            ax.plot([i.value], [y], "o", color=color)
        ax.set_xlim(0.0, 1.03)  # a point at 1.0 stays visible
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ys, names)
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def write_group_png(path: Path, rows: Sequence[GroupResult], title: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(group_figure_png(rows, title))
