"""What each ``octtrain`` subcommand does once its arguments are parsed: build the typed config
(or the command's settings) from ``--config`` and the overrides, then make one ``run_*`` call.

Each handler imports its step (and torch) only after its config is valid, so a refusal is
reported at once. The parsers that route to these are in ``parser.py``.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from octtrain import exitcodes
from octtrain.errors import ConfigError, OcttrainError

if TYPE_CHECKING:
    from octtrain.eval.oct.breakdown import BootstrapSpec

log = logging.getLogger("octtrain")
EXIT_OK = exitcodes.OK.code


def overrides_of(args: argparse.Namespace) -> list[str]:
    """The dotted overrides, with --manifest/--cache turned into data.* overrides."""
    extra = []
    if args.manifest:
        extra.append(f"data.manifest={args.manifest}")
    if args.cache:
        extra.append(f"data.cache={args.cache}")
    return extra + list(args.overrides)


def say_short_run(warning: str | None) -> None:
    if warning:
        log.warning("%s", warning)


def pretrain(args: argparse.Namespace) -> int:
    from octtrain.config.dino import DinoConfig, job_of
    from octtrain.config.loader import load_config
    from octtrain.config.pretrain import PretrainConfig

    overrides = overrides_of(args)
    # The step module (and torch) only once the config is valid: a refusal stays instant.
    if job_of(args.config, overrides) == "dino":
        dino_cfg = load_config(DinoConfig, args.config, overrides)
        say_short_run(dino_cfg.schedule.short_run(dino_cfg.max_steps))
        from octtrain.train.dino import run_dino

        result = run_dino(dino_cfg)
    else:
        cfg = load_config(PretrainConfig, args.config, overrides)
        say_short_run(cfg.schedule.short_run(cfg.max_steps))
        from octtrain.train.pretrain import run_pretrain

        result = run_pretrain(cfg)
    if result.run_dir is not None:
        log.info("run folder: %s (last checkpoint: %s)", result.run_dir, result.last_checkpoint)
    return EXIT_OK


def finetune(args: argparse.Namespace) -> int:
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


def bootstrap_spec(args: argparse.Namespace) -> BootstrapSpec:
    from octtrain.eval.oct.breakdown import BootstrapSpec

    return BootstrapSpec(
        resamples=args.bootstrap, seed=args.seed, min_participants=args.min_participants
    )


def evaluate(args: argparse.Namespace) -> int:
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


def doctor(args: argparse.Namespace) -> int:
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
    return EXIT_OK


def probe(args: argparse.Namespace) -> int:
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
    return EXIT_OK


def profile(args: argparse.Namespace) -> int:
    from octtrain.eval.cellpainting.profile_run import run_profile

    run_profile(args.checkpoint, args.manifest, args.cache, args.out, args.device)
    return EXIT_OK


def embed(args: argparse.Namespace) -> int:
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
    return EXIT_OK
