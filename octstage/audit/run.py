"""``octstage audit-ids`` as a command: read the labels and headers, audit, print, write the report.

The edge around ``audit.core``: it opens the storage, reads headers in threads with a progress
bar (a plain line at intervals when stderr is no terminal), and hands the pure ``AuditReport``
to ``audit.report`` for the table, the JSON and the plot. ``--select-device`` /
``--select-region`` / ``--select-eye`` audit the same volumes a training run's ``data.select``
keeps (same matching: a device by folder or model, a region by name or the release's full
spelling), reported beside the whole audit.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from rich.console import Console

from octstage.audit.core import AuditReport, FileRecord, audit, list_oct, read_headers
from octstage.audit.report import plot as plot_report
from octstage.audit.report import render, to_json
from octstage.dataset.ids import parse_oct_path
from octstage.dataset.labels import read_participants
from octstage.dataset.release import DEVICE_MODELS, TsvRow, read_manifest_tsv, split_region
from octstage.errors import ConfigError, OctstageError
from octstage.manifest import atomic_write_text
from octstage.progress import counter, interval
from octstage.storage import open_storage


def run_audit(
    labels: str | Path,
    oct_root: str,
    json_out: Path | None = None,
    min_overlap: float | None = None,
    plot: Path | None = None,
    workers: int = 16,
    progress_seconds: float | None = None,
    select: dict[str, tuple[str, ...]] | None = None,
) -> int:
    """CLI: 0 when done (and the overlap reaches ``min_overlap``), 1 when it falls short."""
    every = interval(progress_seconds)  # checked before any work starts
    if min_overlap is not None and not 0.0 <= min_overlap <= 1.0:
        raise ConfigError(f"--min-overlap is a share between 0 and 1, got {min_overlap}")
    participants, problems = read_participants(str(labels))
    storage = open_storage(oct_root)
    tsv = read_manifest_tsv(storage)  # the release's own index: a fourth witness
    objects = list_oct(storage)
    err = Console(stderr=True)
    # pydicom warns about odd values in damaged files; the report says what matters.
    # Filters are process-global, so they are set here, once, outside the worker threads.
    with counter(err, "audit-ids", len(objects), every) as advance, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = read_headers(storage, objects, workers, done=lambda: advance("headers read"))
    chosen = {k: v for k, v in (select or {}).items() if v}
    _check_selection(records, tsv or {}, chosen)
    report = audit(participants, records, problems, tsv)
    render(report, Console())
    selected = None
    if chosen:
        rows = tsv or {}
        kept = [r for r in records if _matches(r, rows.get(r.name), chosen)]
        selected = audit(participants, kept, problems, {r.name: rows[r.name] for r in kept
                                                          if r.name in rows})  # fmt: skip
        _print_selection(err, chosen, selected)
    if json_out is not None:
        data = to_json(report, labels=str(labels), oct_root=oct_root)
        if selected is not None:
            data["selection"] = {
                **{k: list(v) for k, v in chosen.items()},
                **selected.total.as_dict(),
                "volumes": sum(1 for f in selected.files if f.participant_id in participants),
                "by_split": {k: t.as_dict() for k, t in selected.by_split.items()},
                "by_study_group": {k: t.as_dict() for k, t in selected.by_study_group.items()},
            }
        atomic_write_text(json_out, json.dumps(data, indent=1) + "\n")
    if plot is not None:
        plot_report(report, plot)
    share = report.total.overlap
    verdict = f"{report.total.with_oct}/{report.total.labelled} labelled participants ({share:.1%})"
    if min_overlap is not None and share < min_overlap:
        err.print(f"[bold red]audit-ids: {verdict} have verified OCT, below {min_overlap:.1%}")
        return 1
    err.print(f"[green]audit-ids: {verdict} have verified OCT")
    return 0


def _keys(record: FileRecord, row: TsvRow | None) -> dict[str, set[str]]:
    """The values a file offers for each selection key (octtrain's data.select semantics)."""
    path = parse_oct_path(record.name)
    device = path.device if path else ""
    region = split_region(row.anatomic_region)[0] if row else ""
    eye = row.laterality if row else (path.laterality if path else None) or ""
    return {
        "device": {device, DEVICE_MODELS.get(device, ("", ""))[1]},
        "region": {region, row.anatomic_region if row else ""},
        "eye": {eye},
    }


def _matches(record: FileRecord, row: TsvRow | None, chosen: dict[str, tuple[str, ...]]) -> bool:
    """Does the file pass the selection?"""
    keys = _keys(record, row)
    return all(set(values) & keys[key] for key, values in chosen.items())


def _check_selection(
    records: list[FileRecord], rows: dict[str, TsvRow], chosen: dict[str, tuple[str, ...]]
) -> None:
    """A selected value that no file has is a mistake (a typo selects nothing): refuse it,
    naming the values that exist, as octtrain's data.select does."""
    offered: dict[str, set[str]] = {key: set() for key in chosen}
    for r in records:
        for key, has in _keys(r, rows.get(r.name)).items():
            if key in offered:
                offered[key] |= has - {""}
    for key, values in chosen.items():
        for value in values:
            if value not in offered[key]:
                raise OctstageError(
                    f"--select-{key}: {value!r} matches no file (the dataset has "
                    f"{sorted(offered[key])})"
                )


def _print_selection(err: Console, chosen: dict[str, tuple[str, ...]], report: AuditReport) -> None:
    what = " ".join(f"{k}={list(v)}" for k, v in chosen.items())
    t = report.total
    splits = ", ".join(f"{k} {v.with_oct}/{v.labelled}" for k, v in report.by_split.items())
    err.print(
        f"selection {what}: {t.with_oct}/{t.labelled} labelled participants have verified OCT "
        f"({splits})"
    )
