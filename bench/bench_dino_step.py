"""Claim: the DINOv2 ViT-S/8 training step (the users' batch of 80, 2 x 224 + 8 x 96 crops, 65,536
prototypes, bf16) runs closer to the GPU's limit under ``compile: inductor`` than as
today's eager step (0.346 s, 11.7% MFU on an H100 through the CLI: ``bench_dino_gpu.py``).

What it runs: ``DinoJob`` as ``octtrain pretrain`` builds it from ``--config`` (default
``configs/pretrain/dino-vits8.yaml``: its model, heads, optimizer, layer decay, crops and iBOT
collate), stepped with ``job.train_step`` on batches that already sit on the device: the crops
are random uint8 of the config's sizes, the colour jitter and iBOT masks are the dataset's and
the collate's own draws. The step alone, no loader and no loop bookkeeping: the data path is
``bench_dino_gpu.py``'s (1.2% of the step on the H100). Per arm (``--arms``, each a value of
the config's ``compile``; the first is the baseline):

1. a fresh job (same seed, same weights), ``--warmup`` steps (compilation, cuDNN autotuning,
   the optimizer's state), then ``--steps`` steps timed as one span (one device sync at its
   end: the step itself never waits for the device, ``test_dino_recipe.py``);
2. the step's FLOPs, counted once by ``torch.utils.flop_counter.FlopCounterMode`` on an eager
   step (matrix products, convolutions and attention; what a compiled step computes too);
3. MFU = FLOPs / step time / the card's dense bf16 peak (``BENCH_PEAK_TFLOPS``; default 989 on
   an H100 or H200, none elsewhere), the allocator's peak, and the hours 90,000 steps take.

Steps are numbered from ``--first-step`` (default 2000: past the frozen last layer and the lr
warm-up, the steady state of a long run). Prints a table beside the baseline and writes
``--json``.

    PYTHONPATH=$PWD python bench/bench_dino_step.py [--arms none,inductor] [--steps 30]
        [--warmup 5] [--out bench-output/bench_dino_step.json] [key=value ...]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from octstage.manifest import Intensity  # noqa: E402
from octtrain.config.dino import COMPILES, DinoConfig  # noqa: E402
from octtrain.config.loader import load_config  # noqa: E402
from octtrain.data.cellpainting import channel_jitter  # noqa: E402
from octtrain.errors import OcttrainError  # noqa: E402
from octtrain.runtime.backend import cpu_threads, make_backend  # noqa: E402
from octtrain.train.dino import DinoJob  # noqa: E402

# Today's eager step through the CLI on an H100 80GB HBM3 (bench/results/dino-gpu-h100.log) and
# its FLOPs as the issue counted them: the figures this benchmark is read beside.
TODAY_STEP_S, TODAY_TFLOP, TODAY_DEVICE = 0.346, 40.2, "NVIDIA H100 80GB HBM3"
USERS_STEPS = 90_000
DENSE_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0}  # SXM, dense (no sparsity)
FIELD = (5, 1080, 1080)  # a JUMP field's channels and pixels
FIELD_MEAN, FIELD_STD = 30.0, 25.0  # uint8 statistics of a dark fluorescence field


@dataclass(frozen=True)
class Field:
    """A manifest field as ``DinoJob`` reads one (never opened: the batches are made here)."""

    zarr_path: str
    shape: tuple[int, ...]
    label: int | None
    split: str
    intensity: Intensity


def peak_tflops(device: str) -> float | None:
    """The card's dense bf16 peak: ``BENCH_PEAK_TFLOPS``, else the table's, else None."""
    if os.environ.get("BENCH_PEAK_TFLOPS"):
        return float(os.environ["BENCH_PEAK_TFLOPS"])
    return next((v for k, v in DENSE_BF16_TFLOPS.items() if k in device), None)


def batches(job: DinoJob, cfg: DinoConfig, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` collated batches of the config's shapes, on the job's device."""
    rng = np.random.default_rng(seed)
    c, b = cfg.crops, job.local_batch
    channels = FIELD[0]
    collate = job.train_set.collate()
    out = []
    for _ in range(count):
        items = []
        for i in range(b):
            jitter = [channel_jitter(rng, channels, c) for _ in range(2 + c.n_local)]
            items.append(
                {
                    "global": torch.from_numpy(
                        rng.integers(0, 256, (2, channels, c.global_size, c.global_size), np.uint8)
                    ),
                    "local": torch.from_numpy(
                        rng.integers(
                            0, 256, (c.n_local, channels, c.local_size, c.local_size), np.uint8
                        )
                    ),
                    "gain": torch.from_numpy(np.stack([j[0] for j in jitter])),
                    "shift": torch.from_numpy(np.stack([j[1] for j in jitter])),
                    "keep": torch.from_numpy(np.stack([j[2] for j in jitter])),
                    "mask_seed": int(rng.integers(2**62)),
                    "label": -1,
                    "index": i,
                }
            )
        batch = collate(items)
        dev = job.backend.device
        out.append({k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    return out


def make_job(config: Path, overrides: list[str], compile_: str, device: str) -> DinoJob:
    """The job ``octtrain pretrain`` would build, on fields that are never read."""
    cfg = load_config(
        DinoConfig,
        config,
        [*overrides, f"compile={compile_}", f"train.device={device}", "validation.every=0"],
    )
    stats = Intensity((FIELD_MEAN,) * FIELD[0], (FIELD_STD,) * FIELD[0])
    fields = [Field(f"synthetic/{i}", FIELD, None, "train", stats) for i in range(8)]
    backend = make_backend(cfg.train.device, cfg.train.precision)
    if backend.kind == "cpu":  # as run_dino sets it
        torch.set_num_threads(cpu_threads(cfg.train.cpu_threads, cfg.data.num_workers))
    job = DinoJob(cfg, fields, ROOT, backend)
    job.start(0)  # wraps and compiles as the trainer does; its loader is never iterated
    return job


def sync(job: DinoJob) -> None:
    if job.backend.device.type == "cuda":
        torch.cuda.synchronize()


def kernel_table(
    job: DinoJob, data: list[dict[str, Any]], step: int, steps: int, step_s: float
) -> str:
    """torch.profiler over ``steps`` steps: the operators and kernels by device time (the
    table's "Self CUDA time total" against the steps' time says whether the device is busy)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if job.backend.device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts) as prof:
        for s in range(step, step + steps):
            job.train_step(data[s % 2], s)
        sync(job)
    events = prof.key_averages()
    table = events.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70)
    return f"{table}\n{steps} steps at {step_s:.3f} s: {steps * step_s * 1e3:.1f} ms"


def run_arm(args: argparse.Namespace, compile_: str, count_flops: bool) -> dict[str, Any]:
    """One arm: warm-up, a timed span of steps, the FLOPs of one eager step, the peak memory."""
    job = make_job(args.config, args.overrides, compile_, args.device)
    cuda = job.backend.device.type == "cuda"
    data = batches(job, job.cfg, 2, args.seed)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    step = args.first_step
    start = time.perf_counter()
    for _ in range(args.warmup):
        job.train_step(data[step % 2], step)
        step += 1
    sync(job)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.steps):
        result = job.train_step(data[step % 2], step)
        step += 1
    sync(job)
    step_s = (time.perf_counter() - start) / args.steps
    if args.profile:
        print(f"--- {compile_}: the step's top kernels over {args.profile} steps ---")
        print(kernel_table(job, data, step, args.profile, step_s))
        step += args.profile
    flops = None
    if count_flops:
        with FlopCounterMode(display=False) as counter:
            job.train_step(data[step % 2], step)
        flops = float(counter.get_total_flops())
    arm = {
        "compile": compile_,
        "step_time_s": step_s,
        "warmup_s": warmup_s,
        "fields_per_s": job.global_batch / step_s,
        "last_loss": float(result.loss),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "flops": flops,
    }
    del job, data, result
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return arm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs/pretrain/dino-vits8.yaml")
    parser.add_argument("--arms", default="none,inductor", help="compile values; first: baseline")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--first-step", type=int, default=2000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=int, default=0, help="profile N steps per arm")
    parser.add_argument("--json", type=Path, default=Path("bench-output/bench_dino_step.json"))
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every arm")
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in COMPILES]
    if unknown or not arms:  # before any arm runs
        parser.error(f"--arms {args.arms!r}: each must be one of {COMPILES}")
    try:
        results = [run_arm(args, a, count_flops=(a == "none")) for a in arms]
    except OcttrainError as exc:  # a config, a value or a device the arms cannot run
        raise SystemExit(f"error: {exc}") from None
    flops = next((r["flops"] for r in results if r["flops"]), None)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = peak_tflops(device)
    print(f"device: {device}; config {args.config.name}; overrides {args.overrides}")
    if flops:
        print(f"FLOPs per step (FlopCounterMode, an eager step): {flops / 1e12:.2f} TFLOP")
    peak_note = f"dense bf16 peak {peak:.0f} TFLOP/s" if peak else "no peak known: no MFU"
    print(f"steps {args.first_step}+, {args.warmup} warm-up, {args.steps} timed; {peak_note}")
    head = f"{'arm (compile)':<24} {'step s':>7} {'TFLOP/s':>8} {'MFU':>6} {'fields/s':>9}"
    print(f"{head} {'peak GiB':>9} {'warm-up s':>10} {'90k steps':>10}")
    for r in results:
        tflops = flops / r["step_time_s"] / 1e12 if flops else None
        r["tflops"] = tflops
        r["mfu"] = tflops / peak if tflops and peak else None
        mem = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}"
        rate = "-" if tflops is None else f"{tflops:.0f}"
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        hours = USERS_STEPS * r["step_time_s"] / 3600
        print(
            f"{r['compile']:<24} {r['step_time_s']:>7.3f} {rate:>8} {mfu:>6} "
            f"{r['fields_per_s']:>9.0f} {mem:>9} {r['warmup_s']:>10.1f} {hours:>9.1f}h"
        )
    today_mfu = TODAY_TFLOP * 1e12 / TODAY_STEP_S / 989e12
    print(
        f"{'today (CLI, reported)':<24} {TODAY_STEP_S:>7.3f} {TODAY_TFLOP / TODAY_STEP_S:>8.0f} "
        f"{100 * today_mfu:>5.1f}% {80 / TODAY_STEP_S:>9.0f} {'':>9} {'':>10} "
        f"{USERS_STEPS * TODAY_STEP_S / 3600:>9.1f}h   ({TODAY_DEVICE}, bench_dino_gpu.py)"
    )
    base = results[0]
    for r in results[1:]:
        print(
            f"{r['compile']}: {base['step_time_s'] / r['step_time_s']:.2f}x the "
            f"{base['compile']} step; loss after the timed steps {r['last_loss']:.4f} vs "
            f"{base['last_loss']:.4f}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings["config"] = args.config.name
    report = {"device": device, "peak_tflops": peak, "settings": settings, "arms": results}
    args.json.write_text(json.dumps(report, indent=2))
    print(f"report: {args.json}")


if __name__ == "__main__":
    main()
