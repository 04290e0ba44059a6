"""The ``octstage`` command: one subcommand per pipeline step, each a single ``run_*`` call.

Exit codes: 0 success, 1 the step finished but something was rejected or below a threshold,
2 the step was refused or failed (the message says which file and why).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler

from octstage.errors import OctstageError

console = Console(stderr=True)


def _synth(a: argparse.Namespace) -> int:
    from octstage.synth import run_synth

    return run_synth(
        Path(a.out),
        participants=a.participants,
        seed=a.seed,
        full_size=a.full_size,
        traps=not a.no_traps,
    )


def _audit(a: argparse.Namespace) -> int:
    from octstage.audit import run_audit

    return run_audit(
        labels=a.labels,  # a path or a URL: not a Path, which would mangle gs://
        oct_root=a.oct,
        json_out=Path(a.json) if a.json else None,
        min_overlap=a.min_overlap,
        plot=Path(a.plot) if a.plot else None,
    )


def _build(a: argparse.Namespace) -> int:
    from octstage.build import run_build
    from octstage.config import load_build_config

    return run_build(
        source=a.source,
        labels=a.labels,  # a path or a URL: not a Path, which would mangle gs://
        out=Path(a.out),
        manifest=Path(a.manifest),
        config=load_build_config(a.config, shape=tuple(a.shape) if a.shape else None),
        workers=a.workers,
        scheduler=a.scheduler,
        inventory=a.inventory,
        json_out=Path(a.json) if a.json else None,
    )


def _verify(a: argparse.Namespace) -> int:
    from octstage.verify import run_verify

    return run_verify(Path(a.manifest), cache=Path(a.cache) if a.cache else None, json_out=a.json)


def _mirror(a: argparse.Namespace) -> int:
    from octstage.mirror import run_mirror

    return run_mirror(
        a.src,
        a.dst,
        dry_run=a.dry_run,
        prune=a.prune,
        max_delete=a.max_delete,
        transfers=a.transfers,
        checkers=a.checkers,
        json_out=Path(a.json) if a.json else None,
    )


def _stage(a: argparse.Namespace) -> int:
    from octstage.stage import run_stage

    return run_stage(
        a.src, Path(a.dst), transfers=a.transfers, json_out=Path(a.json) if a.json else None
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="octstage",
        description="Stage AI-READI retinal OCT once: mirror B2 to a region-local bucket, audit "
        "participant IDs, build a verified uint8 Zarr cache and the manifest octtrain reads.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, fn: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(func=fn)
        return sp

    s = add("synth", _synth, "Write the deterministic AI-READI-like demo dataset (DICOM + TSVs).")
    s.add_argument("out", help="folder to create (participants.tsv, retinal_oct/...)")
    s.add_argument("--participants", type=int, default=60, help="number of participants")
    s.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    s.add_argument(
        "--full-size",
        action="store_true",
        help="real device sizes (e.g. 61x496x768, 20-130 MB a file) instead of ~1/8",
    )
    s.add_argument(
        "--no-traps",
        action="store_true",
        help="only clean files (the planted ID conflicts and damage need >= 16 participants)",
    )

    s = add(
        "audit-ids",
        _audit,
        "Report label/OCT overlap and every reason a participant or file is excluded.",
    )
    s.add_argument("--labels", required=True, help="participants.tsv (path or gs://... URL)")
    s.add_argument("--oct", required=True, help="dataset root (local folder or gs://bucket/prefix)")
    s.add_argument("--json", metavar="OUT", help="write the full report as JSON here")
    s.add_argument(
        "--min-overlap",
        type=float,
        default=None,
        help="exit 1 when the share of labelled participants with verified OCT is below this",
    )
    s.add_argument("--plot", metavar="PNG", help="draw the overlap by split, class and device")

    s = add(
        "build-cache",
        _build,
        "Decode every verified volume once, normalize, resize and write the Zarr cache + manifest.",
    )
    s.add_argument("--source", required=True, help="dataset root (local folder or gs://...)")
    s.add_argument("--labels", required=True, help="participants.tsv (path or URL)")
    s.add_argument("--out", required=True, help="cache folder (local)")
    s.add_argument("--manifest", required=True, help="manifest JSON to write (last, atomically)")
    s.add_argument(
        "--config", help="YAML of build settings (configs/stage/*.yaml); default: 64x384x384"
    )
    s.add_argument(
        "--shape",
        type=int,
        nargs=3,
        metavar=("D", "H", "W"),
        help="target grid (overrides --config)",
    )
    s.add_argument("--workers", type=int, default=2, help="local dask worker processes")
    s.add_argument("--scheduler", help="address of an existing dask scheduler (tcp://host:port)")
    s.add_argument(
        "--inventory", help="source inventory JSON (from mirror) to check each file's SHA1"
    )
    s.add_argument("--json", metavar="OUT", help="write the build summary as JSON here")

    s = add("verify", _verify, "Recompute every cached volume's checksum against the manifest.")
    s.add_argument("manifest", help="manifest JSON")
    s.add_argument("--cache", help="cache root (default: the manifest's folder)")
    s.add_argument("--json", action="store_true", help="print the report as JSON on stdout")

    s = add(
        "mirror",
        _mirror,
        "Copy SRC to DST with rclone, then verify every new object against the source SHA1.",
    )
    s.add_argument("src", help="b2:bucket/prefix, gs://bucket/prefix, a remote: or a folder")
    s.add_argument("dst", help="gs://bucket/prefix, a remote: or a folder")
    s.add_argument("--dry-run", action="store_true", help="say what would happen; touch nothing")
    s.add_argument("--prune", action="store_true", help="delete destination objects not in SRC")
    s.add_argument("--max-delete", type=int, default=100, help="refuse to delete more than this")
    s.add_argument("--transfers", type=int, default=32, help="parallel file transfers")
    s.add_argument("--checkers", type=int, default=64, help="parallel checkers")
    s.add_argument("--json", metavar="OUT", help="write the run report as JSON here")

    s = add(
        "stage",
        _stage,
        "Pull a built cache and its manifest to local SSD, verifying every volume.",
    )
    s.add_argument("src", help="where the cache is (gs://..., b2://... or a folder)")
    s.add_argument("dst", help="local folder")
    s.add_argument("--transfers", type=int, default=16, help="parallel downloads")
    s.add_argument("--json", metavar="OUT", help="write the run report as JSON here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    # pylibjpeg-openjpeg logs every encoded tile at INFO: thousands of lines per synth run.
    logging.getLogger("openjpeg").setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except OctstageError as exc:
        console.print(f"[bold red]octstage {args.command}: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
