"""``octstage audit-ids`` as a command: read the labels and headers, audit, print, write the report.

The edge around ``audit.core``: it opens the storage, reads headers in threads with a progress
bar (a plain line at intervals when stderr is no terminal), and hands the pure ``AuditReport``
to ``audit.report`` for the table, the JSON and the plot.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from rich.console import Console

from octstage.audit.core import audit, list_oct, read_headers
from octstage.audit.report import plot as plot_report
from octstage.audit.report import render, to_json
from octstage.dataset.labels import read_participants
from octstage.dataset.release import read_manifest_tsv
from octstage.errors import ConfigError
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
    report = audit(participants, records, problems, tsv)
    render(report, Console())
    if json_out is not None:
        data = to_json(report, labels=str(labels), oct_root=oct_root)
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
