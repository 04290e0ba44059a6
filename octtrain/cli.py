"""The ``octtrain`` command: one subcommand per job, each building a config and calling one run_*.

Every subcommand takes ``--config FILE`` and any number of ``dotted.key=value`` overrides
(``--manifest`` and ``--cache`` are shorthands for ``data.manifest=`` and ``data.cache=``).
Adding a subcommand: write ``_add_<name>(subparsers)`` that registers its parser and sets
``func``, and list it in ``SUBCOMMANDS``.

Exit codes: 0 success, 2 refused or failed (bad config, data, checkpoint; the message says why),
3 stopped on a non-finite loss (the checkpoints written before it stay).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from octtrain.errors import NonFiniteLossError, OcttrainError

log = logging.getLogger("octtrain")

EXIT_CODES = """exit codes:
  0  finished
  2  refused or failed: bad config, data, checkpoint or backend (the message names the cause)
  3  stopped on a non-finite loss or gradient norm (checkpoints written before it stay)"""


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config, --manifest, --cache and the trailing dotted overrides."""
    parser.add_argument("--config", required=True, help="YAML file (values only)")
    parser.add_argument("--manifest", help="manifest.json of the cache (data.manifest)")
    parser.add_argument("--cache", help="cache root; default: the manifest's folder (data.cache)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="e.g. train.max_steps=20 data.num_workers=2",
    )


def overrides_of(args: argparse.Namespace) -> list[str]:
    """The dotted overrides, with --manifest/--cache turned into data.* overrides."""
    extra = []
    if args.manifest:
        extra.append(f"data.manifest={args.manifest}")
    if args.cache:
        extra.append(f"data.cache={args.cache}")
    return extra + list(args.overrides)


def _pretrain(args: argparse.Namespace) -> int:
    from octtrain.config.dino import DinoConfig, job_of
    from octtrain.config.loader import load_config
    from octtrain.config.pretrain import PretrainConfig
    from octtrain.train.dino import run_dino
    from octtrain.train.pretrain import run_pretrain

    overrides = overrides_of(args)
    if job_of(args.config, overrides) == "dino":
        result = run_dino(load_config(DinoConfig, args.config, overrides))
    else:
        result = run_pretrain(load_config(PretrainConfig, args.config, overrides))
    if result.run_dir is not None:
        log.info("run folder: %s (last checkpoint: %s)", result.run_dir, result.last_checkpoint)
    return 0


def _add_pretrain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pretrain",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="self-supervised pretraining: V-JEPA of the 3D ViT (OCT), or DINOv2 of the 2D ViT "
        "(Cell Painting) with `job: dino` in the config",
    )
    add_config_arguments(p)
    p.set_defaults(func=_pretrain)


def _finetune(args: argparse.Namespace) -> int:
    from octtrain.config.finetune import FinetuneConfig
    from octtrain.config.loader import load_config
    from octtrain.train.finetune import run_finetune

    cfg = load_config(FinetuneConfig, args.config, overrides_of(args))
    result = run_finetune(cfg, args.init)
    if result.run_dir is not None:
        log.info(
            "run folder: %s; best %s %s at epoch %s (checkpoint %s); %d validation failure(s)",
            result.run_dir,
            cfg.early_stopping.metric,
            "n/a" if result.best_score is None else f"{result.best_score:.4f}",
            result.best_unit,
            result.best_checkpoint,
            result.validation_failures,
        )
    return 0


def _add_finetune(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "finetune",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="train a classification head (and the encoder)",
    )
    add_config_arguments(p)
    p.add_argument(
        "--init",
        help="pretraining checkpoint (file or folder); not needed with init_encoder=random "
        "(the supervised-from-scratch reference)",
    )
    p.set_defaults(func=_finetune)


def _evaluate(args: argparse.Namespace) -> int:
    from octtrain.eval.evaluate import run_evaluate

    run_evaluate(
        args.checkpoint,
        args.manifest,
        split=args.split,
        cache=args.cache,
        out=args.out,
        device=args.device,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        max_share=args.collapse_max_share,
    )
    return 0


def _add_evaluate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "evaluate",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="metrics JSON + confusion matrix of a finetuned model",
    )
    p.add_argument("--checkpoint", required=True, help="finetune checkpoint file, or its folder")
    p.add_argument("--manifest", required=True, help="manifest.json of the cache")
    p.add_argument("--split", default="test", help="split to evaluate (default: test)")
    p.add_argument("--cache", help="cache root; default: the manifest's folder")
    p.add_argument("--out", help="output folder; default: the checkpoint's run folder")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or xla")
    p.add_argument("--batch-size", type=int, default=8, help="per process")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--collapse-max-share", type=float, default=0.8)
    p.set_defaults(func=_evaluate)


def _profile(args: argparse.Namespace) -> int:
    from octtrain.eval.profile_run import run_profile

    run_profile(args.checkpoint, args.manifest, args.cache, args.out, args.device)
    return 0


def _add_profile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="well profiles of a DINO checkpoint (Cell Painting): retrieval mAP and probes "
        "beside a random-init encoder and handcrafted features",
    )
    p.add_argument("--checkpoint", required=True, help="DINO checkpoint file (step_*.pt)")
    p.add_argument("--manifest", required=True, help="manifest.json of a Cell Painting cache")
    p.add_argument("--cache", help="cache root; default: the manifest's folder")
    p.add_argument("--out", help="folder for profile.json; default: the checkpoint's folder")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.set_defaults(func=_profile)


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_pretrain,
    _add_finetune,
    _add_evaluate,
    _add_profile,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="octtrain",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Pretrain (3D V-JEPA), finetune (4 study groups) and evaluate on an octstage "
        "cache. Reads only the manifest and the arrays it lists, from local disk; any config "
        "value can be overridden as KEY=VALUE (e.g. train.max_steps=20).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def setup_logging(verbose: bool) -> None:
    """Plain one-line records on stderr (metrics lines must not wrap)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("octtrain").setLevel(logging.DEBUG if verbose else logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        code: int = args.func(args)
    except NonFiniteLossError as exc:
        log.error("%s", exc)
        return 3
    except OcttrainError as exc:
        log.error("%s", exc)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
