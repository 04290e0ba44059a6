"""The ``octstage`` argument parser: every subcommand, its flags and their types, and the exit
codes its ``--help`` documents (``EXIT_CODES``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import octstage.cli.commands as commands

_REFUSED = "  2  refused or failed: bad arguments, unreadable input, an unexpected error"
# Every command: Ctrl-C prints one line, keeps what was finished, and exits 130.
_INTERRUPTED = "\n  130  interrupted (Ctrl-C): what was finished is kept; run it again to go on"
# What each subcommand's run_* really returns, shown by its --help.
EXIT_CODES: dict[str, str] = {
    "synth": f"exit codes:\n  0  the dataset was written\n{_REFUSED}",
    "audit-ids": "exit codes:\n  0  the report was written\n"
    "  1  the share of labelled participants with verified OCT is below --min-overlap\n" + _REFUSED,
    "build-cache": """\
exit codes:
  0  every listed source is in the manifest
  1  the manifest was written; some sources were excluded for deterministic reasons only
     (layout, labels, header, participant ID, truncation, radial scans...)
  2  refused or failed (bad arguments, unreadable inventory or label table, another build
     running...), or nothing kept (0 volumes), or more than --max-reject-share of the listed
     sources left out (manifest still written in both cases)
  3  the manifest was written, but some volumes are missing for environmental reasons (I/O
     error, missing decoder, dead worker, a dangling symlink; cellpainting: a TLS or network
     error that persisted after retries, or a plate's dask task that failed for good, its
     plate left out): run the same command again to
     retry only those; or the disk or quota filled up (the path is named; finished volumes
     are kept, the manifest is not written)""",
    "mirror": "exit codes:\n  0  every object copied (or already there) and verified\n"
    "  1  some objects failed to copy or could not be verified (the source lists no SHA1 for\n"
    "     them: --hash-missing hashes them at the source once): see the report\n"
    "  2  refused or failed: bad arguments, empty source, too many deletions, overlapping\n"
    "     source and destination, an unexpected error",
    "stage": "exit codes:\n  0  every volume downloaded and verified\n"
    "  1  some volumes failed (listed in the report)\n"
    "  2  refused or failed: bad arguments, unreadable manifest, DST holds another cache\n"
    "     (without --replace) or files that are no cache, an unexpected error",
    "verify": "exit codes:\n  0  every volume matches the manifest, nothing extra, schema valid\n"
    "  1  volumes missing (gone, or a data object gone: zarr would read fill values), changed\n"
    "     (bytes differ) or extra, or the manifest breaks the schema or contradicts itself (a\n"
    "     volume listed twice, a participant in two splits, a label outside the classes)\n"
    + _REFUSED,
}


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (refused by the parser, before any import)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _share(text: str) -> float:
    """An argparse type: a share in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be a share between 0 and 1, got {text}")
    return value


def _seconds(text: str) -> float:
    """An argparse type: seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="octstage",
        description="Stage AI-READI retinal OCT volumes or JUMP Cell Painting fields once: mirror "
        "B2 or S3 to a region-local bucket, audit participant IDs (OCT), build a verified uint8 "
        "Zarr cache and the manifest octtrain reads (build-cache --kind), and stage it onto each "
        "host's disk.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, fn: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(
            name,
            help=help,
            description=help,
            epilog=EXIT_CODES[name] + _INTERRUPTED,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sp.set_defaults(func=fn)
        return sp

    s = add(
        "synth",
        commands.synth,
        "Write a deterministic demo dataset: the AI-READI twin (DICOM, manifest.tsv, participants, "
        "OMOP tables), or with --kind cellpainting a JUMP-like Cell Painting twin (TIFFs, illum, "
        "load-data tables).",
    )
    s.add_argument("out", help="folder to create (participants.tsv, retinal_oct/... or images/...)")
    s.add_argument("--kind", choices=("oct", "cellpainting"), default="oct", help="which twin")
    # Each kind's options default to None, so that one given with the other kind is refused
    # (commands.SYNTH_DEFAULTS holds the defaults the help names).
    s.add_argument(
        "--plates",
        type=_at_least(1),
        help="cellpainting: plates (24 wells each, 384 with --compounds), dealt in turn to the "
        "release's microscopes: Phenix, CV8000, Phenix in 'Measurement 1', ImageXpress "
        "(default 4: one each)",
    )
    s.add_argument("--sites", type=_at_least(1), help="cellpainting: fields per well (default 3)")
    s.add_argument(
        "--compounds",
        type=_at_least(0),
        help="cellpainting: library compounds beside the six named perturbations (subtle "
        "changes drawn from --seed; more than 0 makes each plate a 384-well plate with DMSO in "
        "4x a compound's wells; at most 87, 81 with --learned; default 0)",
    )
    s.add_argument(
        "--learned",
        action="store_true",
        default=None,
        help="cellpainting: add the learned family, six changes of arrangement at DMSO's "
        "intensity, area and pixel spread (perinuclear mitochondria, parallel actin, lobed "
        "nuclei, reticular ER, nucleoli at the rim, a responding quarter of the cells), which "
        "per-crop statistics cannot separate; a 384-well plate like --compounds",
    )
    s.add_argument(
        "--size", type=_at_least(32), help="cellpainting: field size in pixels (default 128)"
    )
    s.add_argument(
        "--participants", type=_at_least(1), help="oct: number of participants (default 60)"
    )
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
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="OUT may hold a twin of other parameters that synth wrote: replace it (its own "
        "files only; without this it is refused, naming both; the same parameters again "
        "write the same bytes and need no flag)",
    )

    s = add(
        "audit-ids",
        commands.audit,
        "Report label/OCT overlap and every reason a participant or file is excluded.",
    )
    s.add_argument("--labels", required=True, help="participants.tsv (path or gs://, s3:// URL)")
    s.add_argument(
        "--oct", required=True, help="dataset root (folder, gs://, s3:// or b2://bucket/prefix)"
    )
    s.add_argument("--json", metavar="OUT", help="write the full report as JSON here")
    s.add_argument(
        "--min-overlap",
        type=_share,
        default=None,
        help="exit 1 when the share of labelled participants with verified OCT is below this",
    )
    s.add_argument("--plot", metavar="PNG", help="draw the overlap by split, class and device")
    for key, example in (("device", "Triton"), ("region", "Macula"), ("eye", "R")):
        s.add_argument(
            f"--select-{key}",
            action="append",
            metavar=key.upper(),
            help=f"also report the counts of the files a training run's data.select.{key} "
            f"keeps (e.g. {example}); repeat for more",
        )
    _progress_option(s)

    s = add(
        "build-cache",
        commands.build,
        "Decode every verified volume once, normalize, resize and write the Zarr cache + manifest.",
    )
    s.add_argument(
        "--source", required=True, help="dataset root (folder, gs://, s3:// or b2:// URL)"
    )
    s.add_argument("--labels", help="participants.tsv (path or URL); required for --kind oct")
    s.add_argument(
        "--kind",
        choices=("oct", "cellpainting"),
        default="oct",
        help="oct: AI-READI DICOM volumes; cellpainting: JUMP fields from load-data tables "
        "(--source is the root their PathNames are under)",
    )
    s.add_argument(
        "--load-data",
        action="append",
        metavar="TABLE",
        help="cellpainting: a load-data table (name under --source, path or URL; repeat); "
        "default: every table under SOURCE/workspace/load_data_csv/",
    )
    s.add_argument(
        "--metadata",
        metavar="DIR_OR_TABLE",
        help="cellpainting: the jump-cellpainting datasets repository's metadata/ folder "
        "(well.csv.gz, compound/orf/crispr.csv.gz, perturbation_control.csv; a local folder or a "
        "URL ending in /), or one table with Metadata_Plate, Metadata_Well, Metadata_JCP2022, "
        "Metadata_perturbation_type; joined by plate and well. Without it the build goes on "
        "with a warning: every field carries no perturbation or control label, which "
        "pretraining needs none of but `octtrain profile` cannot score",
    )
    for flag, what in (
        ("source", "a source (Metadata_Source, e.g. source_4)"),
        ("batch", "a batch"),
        ("plate", "a plate"),
        (
            "type",
            "a perturbation type (compound, orf, crispr, negcon, poscon, empty, unknown; "
            "needs --metadata)",
        ),
    ):
        s.add_argument(
            f"--select-{flag}",
            action="append",
            metavar=flag.upper(),
            help=f"cellpainting: build only {what}; repeat for more",
        )
    s.add_argument(
        "--allow-unlabelled",
        action="store_true",
        help="cellpainting: build the fields whose plate or well --metadata does not list, "
        "with an empty perturbation (counted in the summary and the manifest); without it they "
        "are refused, naming the table, plate and well",
    )
    s.add_argument(
        "--map-prefix",
        action="append",
        metavar="FROM=TO",
        help="cellpainting: rewrite absolute paths of the tables starting with FROM to TO before "
        "placing them under --source (e.g. s3://cellpainting-gallery/cpg0016-jump/=/data/jump/ "
        "for a local copy); repeat for more",
    )
    s.add_argument(
        "--anonymous",
        action="store_true",
        help="read s3:// without credentials (unsigned requests: the public Cell Painting "
        "Gallery bucket), whatever AWS keys are set",
    )
    s.add_argument(
        "--out",
        required=True,
        help="the cache (--kind oct or cellpainting): a folder (with --scheduler: one every "
        "worker mounts at the same path) or a bucket URL (gs://..., s3://...) written to "
        "directly, by every worker",
    )
    s.add_argument(
        "--manifest",
        help="local manifest JSON to write, last (default OUT/manifest.json; a bucket cache "
        "always gets OUT/manifest.json too, for `octstage stage`)",
    )
    s.add_argument(
        "--manifest-form",
        choices=("json", "table"),
        default="json",
        help="json: one manifest.json listing every item; table: manifest.json as a small header "
        "and the items in manifest.items.parquet beside it (for caches of a million items; "
        "every octstage and octtrain command reads either)",
    )
    s.add_argument(
        "--pack",
        type=_at_least(1),
        nargs="?",
        const=64,
        default=None,
        metavar="K",
        help="cellpainting: store a plate's fields in packs of K (default without --pack: 1, "
        "one OME-Zarr group per field; --pack alone: 64), one Zarr array [K, C, Y, X] of two "
        "objects each instead of three objects per field, for caches staged from object stores",
    )
    s.add_argument(
        "--config", help="YAML of build settings (configs/stage/*.yaml); default: 64x384x384"
    )
    s.add_argument(
        "--shape",
        type=_at_least(1),
        nargs=3,
        metavar=("D", "H", "W"),
        help="target grid (overrides --config)",
    )
    s.add_argument(
        "--workers",
        type=_at_least(1),
        default=2,
        help="oct: local dask worker processes (capped at the files to decode and the cores "
        "there are, said in one line); cellpainting: threads reading a plate's fields "
        "(network reads and decoders that release the GIL), per process",
    )
    s.add_argument(
        "--scheduler",
        help="address of an existing dask scheduler (tcp://host:port); its workers get this "
        "run's storage settings and credentials through a dask plugin, never in a log. "
        "cellpainting: one task per plate; the cache must be a bucket or a folder every "
        "worker mounts at the same path",
    )
    s.add_argument(
        "--processes",
        type=_at_least(1),
        metavar="N",
        help="cellpainting: build N plates at once on a local dask cluster of N worker "
        "processes (default: plate after plate in this process); the manifest is the same. "
        "Capped at the plates and the cores there are (said in one line)",
    )
    s.add_argument(
        "--inventory", help="source inventory JSON (from mirror) to check each file's SHA1"
    )
    s.add_argument(
        "--no-verify-sources",
        action="store_true",
        help="do not read a source inventory (an unreadable one otherwise stops the build); "
        'the manifest records "source_verification": "none"',
    )
    s.add_argument("--json", metavar="OUT", help="write the build summary as JSON here")
    s.add_argument(
        "--from-tsv",
        action="store_true",
        help="take the file list from the release's retinal_oct/manifest.tsv instead of listing "
        "the tree (a listed file that is not there is rejected)",
    )
    s.add_argument(
        "--concept",
        type=int,
        action="append",
        metavar="ID",
        help="copy this OMOP concept (e.g. 3004410, HbA1c) per participant from clinical_data/ "
        "into every volume's clinical values; repeat for more",
    )
    _progress_option(s)
    s.add_argument(
        "--max-reject-share",
        type=_share,
        metavar="F",
        help="exit 2 when more than this share (0..1) of the listed sources is left out",
    )

    s = add(
        "verify", commands.verify, "Recompute every cached volume's checksum against the manifest."
    )
    s.add_argument("manifest", help="manifest JSON")
    s.add_argument("--cache", help="cache root (default: the manifest's folder)")
    s.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    _progress_option(s)

    s = add(
        "mirror",
        commands.mirror,
        "Copy SRC to DST with rclone, then verify every new object against the source SHA1.",
    )
    s.add_argument(
        "src",
        help="b2:bucket/prefix, gs://bucket/prefix, s3://bucket/prefix, a remote: or a folder",
    )
    s.add_argument("dst", help="gs://bucket/prefix, a remote: or a folder")
    s.add_argument("--dry-run", action="store_true", help="say what would happen; touch nothing")
    s.add_argument("--prune", action="store_true", help="delete destination objects not in SRC")
    s.add_argument(
        "--max-delete", type=_at_least(0), default=100, help="refuse to delete more than this"
    )
    s.add_argument("--transfers", type=_at_least(1), default=32, help="parallel file transfers")
    s.add_argument("--checkers", type=_at_least(1), default=64, help="parallel checkers")
    s.add_argument(
        "--hash-missing",
        action="store_true",
        help="read and SHA1-hash at the source, once, every object the source lists without a "
        "SHA1 (B2 large files without large_file_sha1; every S3 object), record it in the "
        "inventory and verify as usual; later runs reuse it while the object is unchanged "
        "(same size and B2 file id / S3 ETag and time). S3 objects are verified this way, "
        "never by ETag: a multipart or SSE-KMS ETag is no MD5 of the bytes",
    )
    s.add_argument("--json", metavar="OUT", help="write the run report as JSON here")
    _progress_option(s)

    s = add(
        "stage",
        commands.stage,
        "Pull a built cache and its manifest to local SSD, verifying every volume.",
    )
    s.add_argument("src", help="where the cache is (gs://, s3://, b2://, a remote: or a folder)")
    s.add_argument("dst", help="local folder")
    s.add_argument("--transfers", type=_at_least(1), default=16, help="parallel downloads")
    s.add_argument(
        "--replace",
        action="store_true",
        help="DST may hold another cache: replace it (its manifest goes first; once every new "
        "volume verified, the old cache's files the new manifest does not name are removed; "
        "anything else in DST is kept and named)",
    )
    s.add_argument("--json", metavar="OUT", help="write the run report as JSON here")
    _progress_option(s)
    return p


def _progress_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress-seconds",
        type=_seconds,
        metavar="S",
        help="when stderr is not a terminal, print a progress line every S seconds "
        "(default: $OCTSTAGE_PROGRESS_SECONDS, else 30; 0 = every update)",
    )
