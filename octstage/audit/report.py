"""Rendering an AuditReport: JSON, a one-screen rich summary, and the overlap plot."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from octstage.audit.core import AuditReport, Tally
from octstage.provenance import code_version

SHORT_GROUPS = {  # for the table and the plot; the JSON keeps the full names
    "healthy": "healthy",
    "pre_diabetes_lifestyle_controlled": "pre-diabetes",
    "oral_medication_and_or_non_insulin_injectable_medication_controlled": "oral/non-insulin",
    "insulin_dependent": "insulin",
}


def to_json(report: AuditReport, *, labels: str, oct_root: str) -> dict[str, Any]:
    """The full report as JSON-able data (every excluded file, every missing participant)."""
    excluded = report.excluded
    return {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "code_version": code_version(),
        "labels": labels,
        "oct_root": oct_root,
        **report.total.as_dict(),
        "expected_oct": report.expected.as_dict(),
        "by_split": {k: t.as_dict() for k, t in report.by_split.items()},
        "by_study_group": {k: t.as_dict() for k, t in report.by_study_group.items()},
        "by_device": {k: t.as_dict() for k, t in report.by_device.items()},
        "files": {
            "scanned": len(report.files),
            "verified": len(report.files) - len(excluded),
            "excluded": len(excluded),
        },
        "missing_reasons": dict(report.missing_reasons().most_common()),
        "file_reasons": dict(report.file_reasons().most_common()),
        "labelled_without_oct": [
            {
                "participant_id": m.participant_id,
                "split": m.split,
                "study_group": m.study_group,
                "reason": m.reason,
                "files": list(m.files),
            }
            for m in report.labelled_without_oct
        ],
        "oct_without_label": list(report.oct_without_label),
        "conflicts": [{"file": f.name, "reason": f.reason} for f in report.conflicts],
        "excluded": [
            {"file": f.name, "kind": f.kind, "reason": f.reason, "claimed_ids": list(f.claimed)}
            for f in excluded
        ],
        "flags": list(report.flags),
        "manifest_tsv": None
        if report.tsv_rows is None
        else {
            "rows": report.tsv_rows,
            "missing": list(report.tsv_missing),
            "unlisted": list(report.tsv_unlisted),
        },
        "label_problems": [{"row": r, "reason": why} for r, why in report.label_problems],
    }


def render(report: AuditReport, console: Console, examples: int = 3) -> None:
    """Overlap by split, class and device; top reasons for missing participants and files."""
    overlap = Table(title="Labelled participants with verified OCT", title_justify="left")
    for col, just in (("group", "left"), ("labelled", "right"), ("with OCT", "right")):
        overlap.add_column(col, justify=just)  # type: ignore[arg-type]
    overlap.add_column("share", justify="right")
    _row(overlap, "[bold]all labelled", report.total)
    _row(overlap, "retinal_oct not FALSE", report.expected)
    for title, part in (
        ("split", report.by_split),
        ("class", {SHORT_GROUPS.get(k, k): t for k, t in report.by_study_group.items()}),
        ("device*", report.by_device),
    ):
        for key, tally in part.items():
            _row(overlap, f"{title} {key}", tally)
    overlap.caption = "* device: labelled participants with any file on it"
    console.print(overlap)

    missing = report.labelled_without_oct
    why = Table(title=f"Why {len(missing)} labelled participants have no verified OCT")
    why.add_column("reason")
    why.add_column("participants", justify="right")
    why.add_column("e.g.")
    for reason, n in report.missing_reasons().most_common():
        ids = [m.participant_id for m in missing if m.reason == reason][:examples]
        why.add_row(reason, str(n), ", ".join(ids))
    if missing:
        console.print(why)

    files = Table(title=f"{len(report.excluded)} of {len(report.files)} files excluded")
    files.add_column("reason")
    files.add_column("files", justify="right")
    files.add_column("first example")
    for kind, n in report.file_reasons().most_common():
        first = next(f for f in report.excluded if f.kind == kind)
        files.add_row(kind, str(n), f"{first.name.rsplit('/', 2)[-2]}/…: {first.reason}")
    if report.excluded:
        console.print(files)

    if report.tsv_rows is None:
        console.print("no retinal_oct/manifest.tsv: three witnesses only (folder, name, header)")
    else:
        console.print(
            f"retinal_oct/manifest.tsv: {report.tsv_rows} rows; "
            f"{len(report.tsv_missing)} listed files missing, "
            f"{len(report.tsv_unlisted)} files present but not listed"
        )
        for title, names in (("listed, missing", report.tsv_missing),
                             ("present, not listed", report.tsv_unlisted)):  # fmt: skip
            for name in names[:examples]:
                console.print(f"[yellow]manifest.tsv {title}:[/] {name}")
            if len(names) > examples:
                console.print(f"[yellow]… {len(names) - examples} more {title}")
    unlabelled = report.oct_without_label
    if unlabelled:
        console.print(
            f"{len(unlabelled)} participants have verified OCT but no usable label: "
            + ", ".join(unlabelled[:8])
            + (" …" if len(unlabelled) > 8 else "")
        )
    for ref, reason in report.label_problems[:examples]:
        console.print(f"[yellow]label row[/] {ref}: {reason}")
    if len(report.label_problems) > examples:
        console.print(
            f"[yellow]… {len(report.label_problems) - examples} more label rows with problems"
        )
    for flag in report.flags:
        console.print(f"[bold red]no verified OCT:[/] {flag}")


def plot(report: AuditReport, path: Path) -> None:
    """Bars of labelled vs verified participants by split, class and device (PNG)."""
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    parts = (
        ("split", report.by_split),
        ("study group", {SHORT_GROUPS.get(k, k): t for k, t in report.by_study_group.items()}),
        ("device (with any file)", report.by_device),
    )
    for ax, (title, part) in zip(axes, parts, strict=True):
        keys = list(part)
        xs = range(len(keys))
        ax.bar([x - 0.2 for x in xs], [part[k].labelled for k in keys], 0.4, label="labelled")
        ax.bar([x + 0.2 for x in xs], [part[k].with_oct for k in keys], 0.4, label="verified OCT")
        ax.set_xticks(list(xs), keys, rotation=20, ha="right", fontsize=8)
        ax.set_title(title)
    axes[0].legend()
    total = report.total
    fig.suptitle(
        f"{total.with_oct} of {total.labelled} labelled participants ({total.overlap:.0%})"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def _row(table: Table, name: str, tally: Tally) -> None:
    share = f"{tally.overlap:.1%}" if tally.labelled else "-"
    style = "red" if tally.labelled and not tally.with_oct else None
    table.add_row(name, str(tally.labelled), str(tally.with_oct), share, style=style)
