"""The ``octtrain`` command: one subcommand per job, each building a config and calling one run_*.

Every subcommand takes ``--config FILE`` and any number of ``dotted.key=value`` overrides
(``--manifest`` and ``--cache`` are shorthands for ``data.manifest=`` and ``data.cache=``).
Adding a subcommand: write ``_add_<name>(subparsers)`` that registers its parser and sets
``func``, and list it in ``SUBCOMMANDS``.

Overrides may come anywhere among the options. Exit codes come from ``octtrain/exitcodes.py``
(listed in every --help and in docs/exit-codes.md). Config errors are reported before torch is
imported.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from octtrain import exitcodes
from octtrain.errors import ConfigError, DataError, NonFiniteLossError, OcttrainError
from octtrain.runtime.interrupt import caused_by_ctrl_c, remembered_ctrl_c

if TYPE_CHECKING:
    from octtrain.eval.oct.breakdown import BootstrapSpec

log = logging.getLogger("octtrain")

EXIT_OK, EXIT_REFUSED = exitcodes.OK.code, exitcodes.REFUSED.code
EXIT_NONFINITE, EXIT_DATA = exitcodes.NONFINITE.code, exitcodes.DATA.code
EXIT_INTERRUPTED = exitcodes.INTERRUPTED.code
EXIT_STALLED = exitcodes.STALLED.code  # runtime/watchdog.py's exit (os._exit)
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


def overrides_of(args: argparse.Namespace) -> list[str]:
    """The dotted overrides, with --manifest/--cache turned into data.* overrides."""
    extra = []
    if args.manifest:
        extra.append(f"data.manifest={args.manifest}")
    if args.cache:
        extra.append(f"data.cache={args.cache}")
    return extra + list(args.overrides)


def _say_short_run(warning: str | None) -> None:
    if warning:
        log.warning("%s", warning)


def _pretrain(args: argparse.Namespace) -> int:
    from octtrain.config.dino import DinoConfig, job_of
    from octtrain.config.loader import load_config
    from octtrain.config.pretrain import PretrainConfig

    overrides = overrides_of(args)
    # The step module (and torch) only once the config is valid: a refusal stays instant.
    if job_of(args.config, overrides) == "dino":
        dino_cfg = load_config(DinoConfig, args.config, overrides)
        _say_short_run(dino_cfg.schedule.short_run(dino_cfg.max_steps))
        from octtrain.train.dino import run_dino

        result = run_dino(dino_cfg)
    else:
        cfg = load_config(PretrainConfig, args.config, overrides)
        _say_short_run(cfg.schedule.short_run(cfg.max_steps))
        from octtrain.train.pretrain import run_pretrain

        result = run_pretrain(cfg)
    if result.run_dir is not None:
        log.info("run folder: %s (last checkpoint: %s)", result.run_dir, result.last_checkpoint)
    return EXIT_OK


def _add_pretrain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_subcommand(
        sub,
        "pretrain",
        help="self-supervised pretraining: V-JEPA of the 3D ViT (OCT), or DINOv2 of the 2D ViT "
        "(Cell Painting) with `job: dino` in the config",
    )
    add_config_arguments(p)
    p.set_defaults(func=_pretrain)


def _finetune(args: argparse.Namespace) -> int:
    from octtrain.config.finetune import FinetuneConfig
    from octtrain.config.loader import load_config

    cfg = load_config(FinetuneConfig, args.config, overrides_of(args))
    from octtrain.train.finetune import run_finetune

    result = run_finetune(cfg, args.init)
    if result.run_dir is not None:
        log.info(
            "run folder: %s; best %s %s at epoch %s (checkpoint %s); %d validation failure(s)",
            result.run_dir,
            "-MAE" if cfg.data.label.regression else cfg.early_stopping.metric,
            "n/a" if result.best_score is None else f"{result.best_score:.4f}",
            result.best_unit,
            result.best_checkpoint,
            result.validation_failures,
        )
    return EXIT_OK


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
    p.set_defaults(func=_finetune)


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


def bootstrap_spec(args: argparse.Namespace) -> BootstrapSpec:
    from octtrain.eval.oct.breakdown import BootstrapSpec

    return BootstrapSpec(
        resamples=args.bootstrap, seed=args.seed, min_participants=args.min_participants
    )


def _evaluate(args: argparse.Namespace) -> int:
    from octtrain.eval.oct.evaluate import run_evaluate

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
        bootstrap=bootstrap_spec(args),
    )
    return EXIT_OK


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
    p.set_defaults(func=_evaluate)


def _doctor(args: argparse.Namespace) -> int:
    from octtrain.config.dino import DinoConfig, job_of
    from octtrain.config.finetune import FinetuneConfig
    from octtrain.config.loader import load_config
    from octtrain.config.pretrain import PretrainConfig
    from octtrain.train.doctor import DoctorConfig, run_doctor

    overrides = overrides_of(args)
    cfg: DoctorConfig
    if job_of(args.config, overrides) == "dino":
        cfg = load_config(DinoConfig, args.config, overrides)
    else:
        try:
            cfg = load_config(PretrainConfig, args.config, overrides)
        except ConfigError as pretrain_error:
            try:  # a finetuning config: its own keys (head, loss, ...) are no pretraining keys
                cfg = load_config(FinetuneConfig, args.config, overrides)
            except ConfigError:
                raise pretrain_error from None
    lines, problems = run_doctor(cfg)
    for text in lines:
        print(text, flush=True)
    if problems:
        # A refusal to launch (exit 2), not a data error: the hosts' views differ.
        raise OcttrainError("doctor: the hosts disagree: " + "; ".join(problems))
    print("doctor: every host agrees", flush=True)
    return 0


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
    p.set_defaults(func=_doctor)


def _probe(args: argparse.Namespace) -> int:
    from octtrain.eval.oct.probe_run import run_probe
    from octtrain.eval.oct.probe_train import ProbeSettings

    settings = ProbeSettings(
        lrs=tuple(args.lrs), epochs=args.epochs, batch_size=args.probe_batch_size, seed=args.seed
    )
    run_probe(
        args.checkpoint,
        args.manifest,
        split=args.split,
        cache=args.cache,
        out=args.out,
        feature_cache=args.feature_cache,
        encoder=args.encoder,
        device=args.device,
        batch_size=args.batch_size,
        settings=settings,
        bootstrap=bootstrap_spec(args),
        max_share=args.collapse_max_share,
    )
    return 0


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
    p.set_defaults(func=_probe)


def _profile(args: argparse.Namespace) -> int:
    from octtrain.eval.cellpainting.profile_run import run_profile

    run_profile(args.checkpoint, args.manifest, args.cache, args.out, args.device)
    return 0


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
    p.set_defaults(func=_profile)


def _embed(args: argparse.Namespace) -> int:
    from octtrain.config.embed import EmbedConfig
    from octtrain.embed.run import run_embed
    from octtrain.embed.summary import print_summary

    cfg = EmbedConfig(
        checkpoint=args.checkpoint,
        manifest=args.manifest,
        out=args.out,
        cache=args.cache,
        split=args.split,
        encoder=args.encoder,
        device=args.device,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        part_size=args.part_size,
        prefix=args.prefix,
        limit=args.limit,
    )
    print_summary(run_embed(cfg), args.json)
    return 0


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
        help="DINO: its EMA teacher; V-JEPA pretraining: target (EMA, the default) or context",
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
    p.set_defaults(func=_embed)


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
        with remembered_ctrl_c():  # a Ctrl-C dropped in a __del__ or fork hook is raised again
            code: int = args.func(args)
    except NonFiniteLossError as exc:
        log.error("%s", exc)
        return EXIT_NONFINITE
    except DataError as exc:
        log.error("data error: %s", exc)
        return EXIT_DATA
    except OcttrainError as exc:
        log.error("%s", exc)
        return EXIT_REFUSED
    except (KeyboardInterrupt, Exception) as exc:
        if not caused_by_ctrl_c(exc):  # a KeyboardInterrupt, or what one cut short (an import)
            raise
        log.error("interrupted; checkpoints written before it stay")
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
