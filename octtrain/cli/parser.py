"""The ``octtrain`` command line: one parser per subcommand, each routed to its handler in
``commands.py``, every ``--help`` ending with the exit codes (``octtrain/exitcodes.py``).

Every training subcommand takes ``--config FILE`` and any number of ``dotted.key=value``
overrides (``--manifest`` and ``--cache`` are shorthands for ``data.manifest=`` and
``data.cache=``). Adding a subcommand: write its handler in ``commands.py`` and
``_add_<name>(subparsers)`` here, which registers its parser and sets ``func``, and list it in
``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import octtrain.cli.commands as commands
from octtrain import exitcodes

EXIT_CODES = exitcodes.help_text()


def add_subcommand(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand's parser whose --help ends with every exit code (EXIT_CODES), verbatim."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config, --manifest, --cache and the trailing dotted overrides."""
    parser.add_argument("--config", required=True, help="YAML file (values only)")
    parser.add_argument("--manifest", help="manifest.json of the cache (data.manifest)")
    parser.add_argument("--cache", help="cache root; default: the manifest's folder (data.cache)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="e.g. train.max_steps=20 data.num_workers=2 (anywhere among the options)",
    )


def _add_pretrain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subcommand(
        sub,
        "pretrain",
        help="self-supervised pretraining: V-JEPA of the 3D ViT (OCT), or DINOv2 of the 2D ViT "
        "(Cell Painting) with `job: dino` in the config",
    )
    add_config_arguments(p)
    p.set_defaults(func=commands.pretrain)


def _add_finetune(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subcommand(
        sub,
        "finetune",
        help="train a classification head (and the encoder)",
    )
    add_config_arguments(p)
    p.add_argument(
        "--init",
        help="pretraining checkpoint (file or folder); not needed with init_encoder=random "
        "(the supervised-from-scratch reference)",
    )
    p.set_defaults(func=commands.finetune)


def add_bootstrap_arguments(parser: argparse.ArgumentParser) -> None:
    """How the per-group intervals are drawn (evaluate and probe)."""
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="N",
        help="bootstrap resamples (by participant) per interval (default 1000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    parser.add_argument(
        "--min-participants",
        type=int,
        default=5,
        metavar="N",
        help="a group with fewer participants is reported as too small (default 5)",
    )


def _add_evaluate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subcommand(
        sub,
        "evaluate",
        help="metrics (overall and per device/site/region, with intervals) of a finetuned model",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="finetune checkpoint file, or its folder (its best by validation, else its latest)",
    )
    p.add_argument("--manifest", required=True, help="manifest.json of the cache")
    p.add_argument("--split", default="test", help="split to evaluate (default: test)")
    p.add_argument("--cache", help="cache root; default: the manifest's folder")
    p.add_argument("--out", help="output folder; default: the checkpoint's run folder")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or xla")
    p.add_argument("--batch-size", type=int, default=8, help="per process")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--collapse-max-share", type=float, default=0.8)
    add_bootstrap_arguments(p)
    p.set_defaults(func=commands.evaluate)


def _add_doctor(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subcommand(
        sub,
        "doctor",
        help="before a pod run, on every host at once: same code, manifest, cache, kernel, mesh",
    )
    p.add_argument("--config", help="the training YAML the run will use (default: defaults)")
    p.add_argument("--manifest", required=True, help="manifest.json of the cache")
    p.add_argument("--cache", help="cache root; default: the manifest's folder (data.cache)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="as for pretrain")
    p.set_defaults(func=commands.doctor)


def _add_probe(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subcommand(
        sub,
        "probe",
        help="attentive and linear probes on frozen encoder features (same report as evaluate)",
        description="Fit V-JEPA's attentive probe (one learnable query, cross-attention, linear "
        "head) and a linear probe on a checkpoint's frozen encoder tokens (train split), choose "
        "the learning rate and epoch on val, and report the chosen probes on --split like "
        "evaluate. The tokens of each split are computed once and cached, keyed by the "
        "checkpoint's sha256, the encoder, the input shape and the split's volume checksums.",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="pretrain or finetune checkpoint file, or its folder (its best by validation, "
        "else its latest)",
    )
    p.add_argument("--manifest", required=True, help="manifest.json of the cache")
    p.add_argument("--split", default="test", help="split to report (default: test)")
    p.add_argument("--cache", help="cache root of the volumes; default: the manifest's folder")
    p.add_argument("--out", help="output folder; default: probe/ in the checkpoint's run folder")
    p.add_argument("--feature-cache", help="folder of cached tokens; default: OUT/features")
    p.add_argument(
        "--encoder",
        default="target",
        choices=("target", "context"),
        help="pretraining checkpoints: EMA target (default, as V-JEPA) or online context encoder",
    )
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--batch-size", type=int, default=8, help="volumes per encoder batch")
    p.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        default=[3e-4, 1e-3, 3e-3, 1e-2],
        help="learning-rate grid (AdamW), chosen on val",
    )
    p.add_argument("--epochs", type=int, default=30, help="probe epochs per learning rate")
    p.add_argument("--probe-batch-size", type=int, default=16)
    p.add_argument("--collapse-max-share", type=float, default=0.8)
    add_bootstrap_arguments(p)
    p.set_defaults(func=commands.probe)


def _add_profile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subcommand(
        sub,
        "profile",
        help="well profiles of a DINO checkpoint (Cell Painting): retrieval mAP and probes "
        "beside a random-init encoder, handcrafted and CellProfiler (cp-measure) features, under "
        "JUMP's deep-learning recipe and the sphered one, held-out compounds scored apart",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="DINO checkpoint file (step_*.pt), or its folder (the latest)",
    )
    p.add_argument("--manifest", required=True, help="manifest.json of a Cell Painting cache")
    p.add_argument("--cache", help="cache root; default: the manifest's folder")
    p.add_argument("--out", help="folder for profile.json; default: the checkpoint's folder")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.set_defaults(func=commands.profile)


def _add_embed(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subcommand(
        sub,
        "embed",
        help="export every item's embedding (Parquet with Metadata_ columns) and per-well or "
        "per-participant means, resumable, over several processes",
        description="Embed every item of a manifest (or of --split) with a checkpoint's encoder "
        "and write Parquet tables the field's tools read unchanged: Cell Painting, one row per "
        "field (Metadata_Source/Batch/Plate/Well/Site, Metadata_JCP2022, Metadata_pert_type, "
        "...) and wells.parquet (the mean of each well's fields); OCT, one row per volume "
        "(participant, device, laterality, region, split, study group) and "
        "participants.parquet. Features are float32 columns PREFIX0000, PREFIX0001, ... The "
        "items are cut into parts of --part-size; under torchrun each process embeds every "
        "WORLD_SIZE-th part. Re-running the same command resumes: finished parts are kept "
        "(checked by SHA-256), missing or damaged ones embedded again; a finished export "
        "embeds nothing. embed.json, written last, names every file with its rows and SHA-256.",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a DINO (Cell Painting) or V-JEPA pretrain/finetune (OCT) checkpoint file, or its "
        "folder (its best by validation, else its latest)",
    )
    p.add_argument("--manifest", required=True, help="manifest.json of the cache")
    p.add_argument("--out", required=True, help="export folder: new, empty, or this export's")
    p.add_argument("--cache", help="cache root; default: the manifest's folder")
    p.add_argument("--split", help="embed only this split (default: every item)")
    p.add_argument(
        "--encoder",
        default="auto",
        choices=("auto", "teacher", "target", "context"),
        help="DINO: its EMA teacher; V-JEPA pretraining: target (EMA, the default) or context; "
        "fine-tuning: its one encoder (leave --encoder out)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--batch-size", type=int, default=8, help="items per forward (default 8)")
    p.add_argument(
        "--num-workers",
        type=int,
        help="loader processes reading ahead (default: 0 on CPU, where the forward takes every "
        "core; up to 8 on a GPU)",
    )
    p.add_argument(
        "--part-size", type=int, default=4096, help="items per part, the unit of resuming"
    )
    p.add_argument("--prefix", default="emb_", help="feature column prefix (default emb_)")
    p.add_argument("--limit", type=int, help="only the first N items of the selection (a trial)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=commands.embed)


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_pretrain,
    _add_finetune,
    _add_evaluate,
    _add_probe,
    _add_doctor,
    _add_profile,
    _add_embed,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="octtrain",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # Raw (the epilog's exit-code table keeps its columns): the lines are broken here.
        description=(
            "Train and use encoders on an octstage cache: pretrain (V-JEPA on OCT volumes, or\n"
            "DINOv2 on Cell Painting fields with `job: dino`), finetune (the 4 study groups),\n"
            "evaluate, probe, profile (Cell Painting well profiles) and embed (every item's\n"
            "embedding as Parquet). Reads only the manifest and the arrays it lists, from local\n"
            "disk; any config value can be overridden as KEY=VALUE (e.g. train.max_steps=20)."
        ),
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser
