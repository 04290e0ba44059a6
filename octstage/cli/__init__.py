"""The ``octstage`` command: one subcommand per pipeline step, each a single ``run_*`` call.

Exit codes: 0 success, 1 the step finished but something was rejected or below a threshold,
2 the step was refused or failed (the message says which file and why), 3 (build-cache only)
volumes are missing for reasons of the machine and a re-run retries them. Each subcommand's
``--help`` lists its own codes (``EXIT_CODES``), so a script can rely on them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rich.logging import RichHandler

from octstage.cli.commands import console
from octstage.cli.parser import EXIT_CODES, build_parser
from octstage.errors import OctstageError

__all__ = ["EXIT_CODES", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a refused argument (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    # pylibjpeg-openjpeg logs every encoded tile at INFO: thousands of lines per synth run.
    logging.getLogger("openjpeg").setLevel(logging.WARNING)
    try:
        if "progress_seconds" in args:
            from octstage.progress import interval

            interval(args.progress_seconds)  # $OCTSTAGE_PROGRESS_SECONDS too, before the step
        return int(args.func(args))
    except KeyboardInterrupt:
        console.print(
            f"octstage {args.command}: interrupted; what was finished is kept: run the same "
            "command again to go on",
            markup=False,
            highlight=False,
        )
        return 130
    except OctstageError as exc:
        console.print(f"octstage {args.command}: {exc}", style="bold red", markup=False)
        return exc.exit_code
    except OSError as exc:  # the disk, a permission, a path: the user's to mend, no crash
        where = f"{exc.filename}: " if exc.filename else ""
        reason = exc.strerror or str(exc)
        console.print(f"octstage {args.command}: {where}{reason}", style="bold red", markup=False)
        return 2
    except Exception as exc:  # noqa: BLE001 - a crash must not read as exit 1 ("rejections")
        if args.verbose:
            console.print_exception()
        console.print(f"[bold red]octstage {args.command}: unexpected {type(exc).__name__}: {exc}")
        return 2
