"""The ``octtrain`` command: one subcommand per job, each building a config and calling one
``run_*`` (the handlers: ``commands.py``; their parsers: ``parser.py``).

Overrides may come anywhere among the options. Exit codes come from ``octtrain/exitcodes.py``
(listed in every --help and in docs/exit-codes.md); ``main`` maps the package's errors to them,
and a Ctrl-C to 130 with one line. Config errors are reported before torch is imported.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from collections.abc import Sequence

from octtrain import exitcodes
from octtrain.cli.parser import EXIT_CODES, build_parser
from octtrain.errors import DataError, NonFiniteLossError, OcttrainError, PeerLostError
from octtrain.runtime.interrupt import (
    caused_by_ctrl_c,
    remembered_ctrl_c,
    terminated,
    terminated_as_interrupt,
)

__all__ = ["EXIT_CODES", "build_parser", "main", "parse", "setup_logging"]

log = logging.getLogger("octtrain")

EXIT_OK, EXIT_REFUSED = exitcodes.OK.code, exitcodes.REFUSED.code
EXIT_NONFINITE, EXIT_DATA = exitcodes.NONFINITE.code, exitcodes.DATA.code
EXIT_INTERRUPTED, EXIT_TERMINATED = exitcodes.INTERRUPTED.code, exitcodes.TERMINATED.code
# What an interrupted command keeps, by command (the trainers': their checkpoints).
KEPT = {"embed": "every finished part stays: the same command resumes"}
# A write the disk has no room for (full, over quota, over the file-size limit) or cannot take.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
EXIT_STALLED = exitcodes.STALLED.code  # runtime/watchdog.py's exit (os._exit)
EXIT_PEER_LOST = exitcodes.PEER_LOST.code


def setup_logging(verbose: bool) -> None:
    """Plain one-line records on stderr (metrics lines must not wrap)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("octtrain").setLevel(logging.DEBUG if verbose else logging.INFO)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments, with KEY=VALUE overrides accepted anywhere among the options (argparse
    alone takes positionals only in one run, so ``a=1 --init X b=2`` would leave ``b=2``)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") or "=" not in a]
    if unknown or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    setup_logging(args.verbose)
    try:
        # A Ctrl-C dropped in a __del__ or fork hook is raised again; SIGTERM unwinds as it.
        with remembered_ctrl_c(), terminated_as_interrupt():
            code: int = args.func(args)
    except NonFiniteLossError as exc:
        log.error("%s", exc)
        return EXIT_NONFINITE
    except DataError as exc:
        log.error("data error: %s", exc)
        return EXIT_DATA
    except PeerLostError as exc:
        log.error("%s", exc)
        return EXIT_PEER_LOST
    except OcttrainError as exc:
        log.error("%s", exc)
        return EXIT_REFUSED
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        where = exc.filename or "a file this command writes"
        log.error(
            "%s: %s: free space (or choose a folder on another disk) and run the same command "
            "again: what was finished before it is kept",
            where,
            exc.strerror or exc,
        )
        return EXIT_REFUSED
    except (KeyboardInterrupt, Exception) as exc:
        if not caused_by_ctrl_c(exc):  # a KeyboardInterrupt, or what one cut short (an import)
            raise
        kept = KEPT.get(getattr(args, "command", ""), "checkpoints written before it stay")
        if terminated(exc):
            log.error("stopped by SIGTERM (exit %d); %s", EXIT_TERMINATED, kept)
            return EXIT_TERMINATED
        log.error("interrupted; %s", kept)
        return EXIT_INTERRUPTED
    return code
