"""What ``octtrain embed`` tells its user: a progress line at intervals (items/s and an ETA, on a
terminal or not) and the closing summary, a table or ``--json``."""

from __future__ import annotations

import json
import logging
import time

from rich.console import Console
from rich.table import Table

log = logging.getLogger("octtrain")


def clock(seconds: float) -> str:
    """``H:MM:SS`` (hours past 24 too: a million fields can take a day), or n/a."""
    if not seconds < 1e8:
        return "n/a"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """A line every ``every_s`` seconds: items done of this process's share, items/s, ETA."""

    def __init__(self, total: int, every_s: float, rank: int) -> None:
        self.total, self.every_s, self.rank = total, every_s, rank
        self.done, self.start = 0, time.monotonic()
        self.last = self.start

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every_s or self.done == self.total:
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate else float("inf")
            log.info(
                "embed (process %d): %d of %d items (%.0f%%), %.1f items/s, ETA %s",
                self.rank,
                self.done,
                self.total,
                100.0 * self.done / max(self.total, 1),
                rate,
                clock(eta),
            )


def print_summary(summary: dict[str, object], as_json: bool) -> None:
    """The summary on stdout: JSON (``--json``) or a table (process 0 only: the others'
    summaries have no header to name)."""
    if not summary.get("groups"):
        return
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    table = Table(title="octtrain embed")
    table.add_column("what")
    table.add_column("value", justify="right")
    for key in ("items", "items_embedded", "parts", "parts_embedded", "parts_kept", "seconds"):
        if key in summary:
            table.add_row(key.replace("_", " "), str(summary[key]))
    groups = summary["groups"]
    assert isinstance(groups, dict)
    table.add_row(f"{groups['name']} rows", str(groups["rows"]))
    table.add_row("header", str(summary["header"]))
    Console().print(table)
