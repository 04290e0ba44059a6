"""Finetuning epoch time on the demo data: encoder frozen (linear probe) vs unfrozen.

Runs ``octtrain finetune`` twice with the demo config (configs/finetune/demo.yaml) on the same
manifest and checkpoint - once with the encoder frozen for every epoch, once trainable from the
start - and prints the median training-epoch time (first epoch left out: worker start-up),
samples/s, the validation pass time and the unfrozen/frozen ratio side by side.

Usage::

    python bench/bench_finetune.py --manifest demo-output/cache/manifest.json \\
        --init demo-output/runs/pretrain/checkpoints [--epochs 4] [--set train.cpu_threads=2]

Without ``--init`` a 2-step pretraining run provides the encoder (weights do not change the
timing). Figures are wall-clock on whatever else the machine is doing: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from octtrain.config.finetune import FinetuneConfig
from octtrain.config.loader import load_config
from octtrain.config.pretrain import PretrainConfig
from octtrain.train.finetune import run_finetune
from octtrain.train.pretrain import run_pretrain

ROOT = Path(__file__).resolve().parents[1]
MODES = {"frozen": "schedule.unfreeze_epoch=null", "unfrozen": "schedule.unfreeze_epoch=0"}


def quick_checkpoint(manifest: str, folder: Path) -> str:
    """A real (2-step) pretraining checkpoint of the demo architecture."""
    overrides = [
        f"data.manifest={manifest}",
        f"train.run_dir={folder / 'pretrain'}",
        "train.max_steps=2",
        "validation.every=0",
        "checkpoint.every=2",
        "logging.wandb_mode=disabled",
        "logging.console=false",
        "logging.image_every=0",
    ]
    cfg = load_config(PretrainConfig, ROOT / "configs" / "pretrain" / "demo.yaml", overrides)
    result = run_pretrain(cfg)
    assert result.last_checkpoint is not None
    return result.last_checkpoint


def bench_mode(
    config: Path,
    manifest: str,
    init: str,
    mode: str,
    epochs: int,
    folder: Path,
    extra: list[str],
) -> dict[str, Any]:
    overrides = [
        f"data.manifest={manifest}",
        MODES[mode],
        f"train.epochs={epochs}",
        "schedule.warmup_epochs=0",
        f"train.run_dir={folder / mode}",
        "early_stopping.patience=0",
        f"validation.every={epochs}",  # validate once, at the end: epochs time training only
        "logging.wandb_mode=disabled",
        "logging.console=false",
        *extra,
    ]
    cfg = load_config(FinetuneConfig, config, overrides)
    result = run_finetune(cfg, init)
    times = [h["unit_time_s"] for h in result.history]
    steady = times[1:] or times
    epoch_s = statistics.median(steady)
    samples = len(result.history) and cfg.data.batch_size * cfg.accum_steps
    steps = _steps_per_epoch(result.run_dir)
    return {
        "mode": mode,
        "epoch_times_s": [round(t, 3) for t in times],
        "epoch_s": epoch_s,
        "samples_per_s": samples * steps / epoch_s if steps else None,
        "steps_per_epoch": steps,
        "val_time_s": result.history[-1].get("val/time_s"),
        "data_wait_frac": statistics.median(h["unit_data_wait_frac"] for h in result.history),
    }


def _steps_per_epoch(run_dir: Path | None) -> int | None:
    if run_dir is None:
        return None
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "train/loss" in r]
    epochs = [r["step"] for r in records if "train_epoch/loss" in r]
    return int(max(steps) // max(epochs)) if steps and epochs else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--manifest", required=True, help="demo cache manifest.json")
    parser.add_argument("--init", help="pretraining checkpoint; default: a 2-step pretraining")
    parser.add_argument("--config", default=str(ROOT / "configs" / "finetune" / "demo.yaml"))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", default="bench-output/finetune")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        init = args.init or quick_checkpoint(args.manifest, Path(tmp))
        rows = [
            bench_mode(
                Path(args.config), args.manifest, init, mode, args.epochs, Path(tmp), args.set
            )
            for mode in MODES
        ]
    frozen, unfrozen = rows
    settings = " ".join(args.set)
    table = Table(title=f"finetuning epoch time ({args.config} {settings}, {args.epochs} epochs)")
    for col in ("encoder", "epoch (s, median)", "samples/s", "steps", "val pass (s)", "data wait"):
        table.add_column(col, justify="left" if col == "encoder" else "right")
    for r in rows:
        table.add_row(
            r["mode"],
            f"{r['epoch_s']:.2f}",
            "n/a" if r["samples_per_s"] is None else f"{r['samples_per_s']:.1f}",
            str(r["steps_per_epoch"]),
            "n/a" if r["val_time_s"] is None else f"{r['val_time_s']:.2f}",
            f"{r['data_wait_frac']:.0%}",
        )
    Console().print(table)
    ratio = unfrozen["epoch_s"] / frozen["epoch_s"]
    Console().print(f"unfrozen / frozen epoch time: {ratio:.2f}x")
    summary = {
        "rows": rows,
        "ratio_unfrozen_over_frozen": ratio,
        "config": args.config,
        "overrides": args.set,
    }
    (out / "bench_finetune.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
