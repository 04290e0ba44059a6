"""octtrain's exit codes: the one table the CLI, the watchdog, ``--help`` and docs/exit-codes.md
are made from (``python -m octtrain.exitcodes`` prints the page's table).

Each row names its cause and the words a document uses for it (``keywords``), so a test can
check every mention of an exit code in the README, docs/ and configs/ against this table.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitCode:
    """One exit code: its number, a short cause, the ``--help`` text and the words naming it."""

    code: int
    cause: str
    help: str
    keywords: tuple[str, ...]


OK = ExitCode(0, "finished", "finished", ("finish", "agrees", "success"))
REFUSED = ExitCode(
    2,
    "refused or failed",
    "refused or failed: bad flags, config, checkpoint or backend, a failed validation or "
    "checkpoint write, hosts that disagree (the message names the file, key or value; on a pod "
    "every host exits with it, naming the failing host)",
    ("refus", "config", "checkpoint", "validation", "disagree", "differs", "backend"),
)
NONFINITE = ExitCode(
    3,
    "non-finite loss",
    "stopped on a non-finite loss or gradient norm (checkpoints written before it stay)",
    ("non-finite", "nan", "infinite"),
)
DATA = ExitCode(
    4,
    "data error",
    "data error: the manifest or a cached volume cannot feed the run (missing, short or "
    "corrupt; the message names the volume and its path; on a pod every host exits with it)",
    ("data", "volume", "manifest", "loader"),
)
STALLED = ExitCode(
    5,
    "stalled",
    "ended by the stall watchdog: no step for train.stall_exit_s (a host stuck in a collective "
    "or a read that never returns)",
    ("watchdog", "stall", "stuck", "hang"),
)
PEER_LOST = ExitCode(
    6,
    "peer lost",
    "another process of the run ended or stopped answering (its address named; its own log "
    "says why): this one stops too; what was finished stays, the same command resumes",
    ("lost contact", "peer lost"),
)
INTERRUPTED = ExitCode(
    130,
    "interrupted",
    "interrupted (Ctrl-C); what was finished stays (checkpoints, an export's parts)",
    ("interrupt", "ctrl-c", "sigint"),
)

TERMINATED = ExitCode(
    143,
    "terminated",
    "stopped by SIGTERM (torchrun stopping the others when one process fails, Slurm, "
    "Kubernetes), as by Ctrl-C: what was finished stays (checkpoints, an export's parts)",
    ("sigterm", "terminat"),
)

TABLE: tuple[ExitCode, ...] = (
    OK,
    REFUSED,
    NONFINITE,
    DATA,
    STALLED,
    PEER_LOST,
    INTERRUPTED,
    TERMINATED,
)


def help_text() -> str:
    """The ``exit codes:`` epilog every octtrain ``--help`` ends with."""
    lines = ["exit codes:"]
    for row in TABLE:
        lines += textwrap.wrap(
            row.help, 92, initial_indent=f"  {row.code:<4} ", subsequent_indent=" " * 7
        )
    return "\n".join(lines)


def markdown() -> str:
    """The table of docs/exit-codes.md (checked verbatim by tests/test_docs.py)."""
    lines = ["| exit | cause | what it means |", "|---|---|---|"]
    lines += [f"| {row.code} | {row.cause} | {row.help} |" for row in TABLE]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
