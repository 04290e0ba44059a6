"""Model benchmark at the production shape: 64x384x384 volumes, patch [4, 16, 16] = 9,216 tokens.

For each preset (``--presets vit29m,vit90m``) it prints:
1. FLOPs per volume of one V-JEPA training step (student forward + backward, EMA target forward),
   counted with ``torch.utils.flop_counter.FlopCounterMode`` on meta tensors, beside the
   hand count of attention (``4 N^2 d`` per layer forward; backward twice that), and its share;
2. the memory arithmetic for one TPU v4 chip (32 GiB HBM): weights and optimizer state, per-layer
   activation bytes with and without checkpointing, attention matrices materialized vs blocked;
3. CPU eager, bf16 autocast, batch 1: peak RSS (``getrusage`` maxrss of a fresh subprocess per
   config) and the time of ONE training step, checkpointing off and on (``--skip-eager`` skips it;
   vit90m at full shape is slow on a few cores);
4. XLA:CPU (``.venv-xla``): the compiled training step's memory read from XLA's own buffer
   assignment (``XLA_FLAGS=--xla_dump_to``), attention math / blocked, checkpointing off / on,
   at batch 1, then blocked + checkpointing at the per-chip batch of the preset's v4-32 config
   (``configs/pretrain/<preset>-384-v4-32.yaml``: global batch / 16 chips; ``--per-chip-batch``
   overrides). Every XLA:CPU figure is of the **blocked** (scan) attention kernel: the TPU runs
   Pallas flash attention instead, which XLA:CPU cannot compile, so a TPU's figure differs.
   The step is only compiled (the worker is stopped once the buffer assignment is dumped) unless
   ``--xla-execute`` asks to run it too;
5. a table of all of it beside the baseline (attention=math, checkpointing off);
6. on a CUDA device only: peak device memory, volumes/s and MFU of a batch-1 step, SDPA,
   checkpointing off and on (run on an H100: ``bench/results/model-cuda-h100.log``).

Usage: ``python bench/bench_model.py [--presets vit29m,vit90m] [--out DIR] [--skip-eager P,..]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout, torch_xla venv included

from octtrain.config.loader import load_config  # noqa: E402
from octtrain.config.pretrain import PretrainConfig  # noqa: E402
from octtrain.config.sections import ModelConfig  # noqa: E402
from octtrain.models.jepa import (  # noqa: E402
    build_student,
    ema_update,
    jepa_loss,
    make_target,
    target_features,
)

SHAPE = (64, 384, 384)
PATCH = (4, 16, 16)
# The -384 presets' ratio: the context encoder sees 2,048 of 9,216 tokens (a length flash takes)
MASK_RATIO = 0.7778
V4_32_CHIPS = 16
# The environment `make test-xla` builds (torch 2.9 + torch-xla 2.9); another with --xla-python.
XLA_PYTHON = ROOT / ".venv-xla" / "bin" / "python"
V4_HBM = 32 * 2**30
GIB = 2**30


def model_config(preset: str, attention: str, ckpt: bool, block: int) -> ModelConfig:
    return ModelConfig(
        preset=preset,
        input_shape=SHAPE,
        patch=PATCH,
        attention=attention,
        attention_block=block,
        activation_checkpointing=ckpt,
    )


def masks(n: int, device: torch.device | str, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(context [batch, N - K], target [batch, K]) indices of a random split (one per batch)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    k = round(MASK_RATIO * n)
    context, target = perm[k:].sort().values[None], perm[:k].sort().values[None]
    return context.repeat(batch, 1).to(device), target.repeat(batch, 1).to(device)


def per_chip_batch(preset: str) -> int:
    """Volumes per chip of the preset's v4-32 config (its global batch over 16 chips)."""
    path = ROOT / "configs" / "pretrain" / f"{preset}-384-v4-32.yaml"
    cfg = load_config(PretrainConfig, path, [])
    return cfg.data.batch_size // V4_32_CHIPS


def training_step(
    student: torch.nn.Module,
    target: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    device_type: str,
) -> torch.Tensor:
    """The pretraining step of ``train/pretrain.py`` without schedules and logging."""
    x, context, tgt = batch
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
        prediction = student(x, context, tgt)
        wanted, _ = target_features(target, x, tgt)  # type: ignore[arg-type]
    loss = jepa_loss(prediction, wanted, "l1").mean()
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(student.parameters(), 10.0)
    optimizer.step()
    ema_update(target, student.encoder, 0.998)  # type: ignore[arg-type]
    return loss.detach()


def setup(cfg: ModelConfig, device: torch.device | str, batch: int = 1) -> tuple[Any, ...]:
    torch.manual_seed(0)
    student = build_student(cfg).to(device).train()
    target = make_target(student.encoder)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4, weight_decay=0.04)
    x = (torch.rand(batch, 1, *SHAPE) * 2 - 1).to(device)
    context, tgt = masks(student.encoder.num_patches, device, batch)
    return student, target, optimizer, (x, context, tgt)


# --- 1. FLOPs -----------------------------------------------------------------------------------


def flops(preset: str) -> dict[str, float]:
    """Counted FLOPs of one step on meta tensors (attention=math, so every matmul is visible)
    and the hand count of attention, per volume."""
    cfg = model_config(preset, "math", False, 1024)
    student = build_student(cfg).to("meta")
    target = make_target(student.encoder)
    n = student.encoder.num_patches
    with torch.device("meta"):
        x = torch.empty(1, 1, *SHAPE)
    context, tgt = (t.to("meta") for t in masks(n, "cpu"))
    with FlopCounterMode(display=False) as counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            prediction = student(x, context, tgt)
            wanted, _ = target_features(target, x, tgt)
        jepa_loss(prediction, wanted, "l1").mean().backward()
    counts = counter.get_flop_counts()["Global"]
    total = float(counter.get_total_flops())
    bmm = float(sum(v for k, v in counts.items() if "bmm" in str(k)))  # only attention uses bmm
    p = cfg.sizes()
    nc = n - round(MASK_RATIO * n)

    def attn(tokens: int, dim: int, depth: int, passes: int) -> float:
        return 4.0 * tokens**2 * dim * depth * passes  # QK^T and PV, 2 flops per MAC

    by_hand = (
        attn(nc, p.embed_dim, p.depth, 3)  # context encoder: forward + backward (2x)
        + attn(n, p.pred_dim, p.pred_depth, 3)  # predictor over all tokens
        + attn(n, p.embed_dim, p.depth, 1)  # EMA target: forward only
    )
    other = total - bmm
    return {
        "counted": total,
        "counted_bmm": bmm,
        "counted_without_attention": other,
        "attention_by_hand": by_hand,
        "total_with_attention_by_hand": other + by_hand,
        "attention_share": by_hand / (other + by_hand),
    }


# --- 2. v4 arithmetic ---------------------------------------------------------------------------


def v4_arithmetic(preset: str, block: int) -> dict[str, float]:
    """Bytes for one volume on one chip, bf16 activations, float32 weights and AdamW state."""
    cfg = model_config(preset, "auto", True, block)
    student = build_student(cfg).to("meta")
    params = sum(q.numel() for q in student.parameters())
    enc_params = sum(q.numel() for q in student.encoder.parameters())
    p = cfg.sizes()
    n = student.encoder.num_patches
    nc = n - round(MASK_RATIO * n)

    def layer(tokens: int, dim: int, heads: int) -> tuple[float, float, float, float, float]:
        # Saved for backward per pre-norm block (bf16 unless noted): LN1 in (fp32 residual, 4),
        # LN1 out (2), qkv (6), attention out (2), proj out + residual (4), LN2 in/out (6),
        # fc1 out (8 per d: 4d wide), GELU out (8): ~40 bytes per token per channel.
        other = 40.0 * tokens * dim
        materialized = 6.0 * heads * tokens**2  # fp32 softmax out + its bf16 copy for P @ V
        blocked = 4.0 * heads * tokens  # only the fp32 row log-sum-exp is saved
        # One chunk lives at a time (fp32 scores, probabilities, dP, dS in the backward).
        chunk = 16.0 * heads * min(block, tokens) * tokens
        kept_when_checkpointed = 4.0 * tokens * dim  # the fp32 block input only
        return other, materialized, blocked + chunk, kept_when_checkpointed, blocked

    enc = layer(nc, p.embed_dim, p.num_heads)
    pred = layer(n, p.pred_dim, p.pred_heads)
    state = params * (4 + 4 + 8) + enc_params * 4  # weights, grads, AdamW m and v; EMA target
    chunks = max(enc[2] - enc[4], pred[2] - pred[4])
    no_ckpt_blocked = p.depth * (enc[0] + enc[4]) + p.pred_depth * (pred[0] + pred[4]) + chunks
    no_ckpt_math = p.depth * (enc[0] + enc[1]) + p.pred_depth * (pred[0] + pred[1])
    # Checkpointed: every block input kept, plus one block's activations during its recompute.
    ckpt_blocked = (
        p.depth * enc[3] + p.pred_depth * pred[3] + max(enc[0] + enc[2], pred[0] + pred[2])
    )
    return {
        "params": float(params),
        "state_bytes": float(state),
        "enc_layer_act": enc[0],
        "pred_layer_act": pred[0],
        "enc_layer_attn_materialized": enc[1],
        "pred_layer_attn_materialized": pred[1],
        "pred_layer_attn_blocked": pred[2],
        "enc_layer_ckpt_kept": enc[3],
        "pred_layer_ckpt_kept": pred[3],
        "total_math_no_ckpt": state + no_ckpt_math,
        "total_blocked_no_ckpt": state + no_ckpt_blocked,
        "total_blocked_ckpt": state + ckpt_blocked,
    }


# --- 3. eager CPU worker ------------------------------------------------------------------------


def eager_worker(preset: str, attention: str, ckpt: bool, block: int) -> dict[str, Any]:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1)))
    student, target, optimizer, batch = setup(model_config(preset, attention, ckpt, block), "cpu")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    loss = training_step(student, target, optimizer, batch, "cpu")
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "loss": float(loss),
        "step_s": seconds,
        "rss_before_step": before,
        "peak_rss": peak,
        "step_rss_delta": peak - before,
    }


# --- 4. XLA compile worker ----------------------------------------------------------------------


def xla_worker(
    preset: str, attention: str, ckpt: bool, block: int, marker: Path, volumes: int = 1
) -> dict[str, Any]:
    import torch_xla

    device = torch_xla.device()
    cfg = model_config(preset, attention, ckpt, block)
    student, target, optimizer, batch = setup(cfg, device, volumes)
    torch_xla.sync()  # weights and inputs land in their own small graph
    loss = training_step(student, target, optimizer, batch, "xla")
    marker.write_text("step")  # the next dumped module is the training step
    t0 = time.perf_counter()
    torch_xla.sync()
    value = float(loss.cpu())
    return {"loss": value, "compile_and_step_s": time.perf_counter() - t0}


def parse_buffer_assignment(path: Path) -> dict[str, Any]:
    text = path.read_text()
    total = int(text.split("Total bytes used: ")[1].split()[0])
    temp = 0
    for line in text.splitlines():
        if line.startswith("allocation ") and "preallocated-temp" in line:
            temp = max(temp, int(line.split("size ")[1].split(",")[0]))
    peak = None  # the heap simulator's peak of live buffers, where this XLA prints it
    for line in text.splitlines():
        if "Stack trace breakdown for peak usage:" in line:
            peak = int(line.split(":")[1].replace("bytes", "").replace(" ", ""))
    # Matmuls in the optimized module: checkpointing's recomputation shows up as more of them.
    hlo = path.with_name(path.name.replace("-buffer-assignment", ""))
    dots = hlo.read_text().count(" dot(") if hlo.exists() else None
    module = path.name.split(".cpu_")[0]
    return {"module": module, "total": total, "temp": temp, "peak": peak, "dots": dots}


def run_xla(
    preset: str,
    attention: str,
    ckpt: bool,
    block: int,
    out: Path,
    execute: bool,
    limit: float,
    xla_python: Path,
    volumes: int = 1,
) -> dict[str, Any]:
    tag = f"{preset}-{attention}-{'ckpt' if ckpt else 'nockpt'}-b{volumes}"
    dump = out / f"xla-{tag}"
    dump.mkdir(parents=True, exist_ok=True)
    for old in dump.iterdir():
        old.unlink()
    marker = dump / "STEP_STARTED"
    env = {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "PYTHONPATH": str(ROOT),
        # XLA:CPU, unlike TPU, expands optimization barriers before scheduling, which lets the
        # checkpointed recomputation float up into the forward pass; keep them, as TPU does.
        "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
        "--xla_disable_hlo_passes=cse_barrier_expander",
    }
    cmd = [str(xla_python), __file__, "--worker", "xla", "--presets", preset]
    cmd += ["--attention", attention, "--block", str(block), "--marker", str(marker)]
    cmd += ["--ckpt"] if ckpt else []
    cmd += ["--per-chip-batch", str(volumes)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    found: dict[str, Any] | None = None
    while proc.poll() is None and time.perf_counter() - t0 < limit:
        time.sleep(2)
        if found is None and marker.exists():
            step_at = marker.stat().st_mtime
            new = [
                f
                for f in dump.glob("*buffer-assignment.txt")
                if f.stat().st_mtime >= step_at and time.time() - f.stat().st_mtime > 3
            ]
            if new:
                found = parse_buffer_assignment(max(new, key=lambda f: f.stat().st_size))
                found["compile_s"] = time.perf_counter() - t0
                if not execute:
                    proc.kill()  # compile-only: the buffer assignment is all we came for
    if proc.poll() is None:
        proc.kill()
    output = proc.communicate()[0].decode(errors="replace")
    result: dict[str, Any] = found or {"error": output[-2000:]}
    for line in output.splitlines():
        if line.startswith("RESULT "):
            result.update(json.loads(line[len("RESULT ") :]))
    return result


# --- 6. CUDA ------------------------------------------------------------------------------------


def cuda_figures(preset: str, attention: str, ckpt: bool, block: int, flop: float) -> None:
    """Peak device memory, volumes/s and MFU on a CUDA device (MFU against BENCH_PEAK_TFLOPS,
    default 989: an H100 SXM's dense bf16)."""
    torch.cuda.reset_peak_memory_stats()
    student, target, optimizer, batch = setup(model_config(preset, attention, ckpt, block), "cuda")
    training_step(student, target, optimizer, batch, "cuda")  # warm-up
    torch.cuda.synchronize()
    steps, t0 = 5, time.perf_counter()
    for _ in range(steps):
        training_step(student, target, optimizer, batch, "cuda")
    torch.cuda.synchronize()
    per_step = (time.perf_counter() - t0) / steps
    peak_bf16 = float(os.environ.get("BENCH_PEAK_TFLOPS", "989")) * 1e12  # H100 SXM dense bf16
    print(
        f"  cuda {attention:7s} ckpt={ckpt!s:5s} peak {torch.cuda.max_memory_allocated() / GIB:.2f}"
        f" GiB, {1 / per_step:.2f} volumes/s, MFU {flop / per_step / peak_bf16:.1%}"
    )


# --- driver -------------------------------------------------------------------------------------


def run_eager(preset: str, attention: str, ckpt: bool, block: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "eager", "--presets", preset]
    cmd += ["--attention", attention, "--block", str(block)] + (["--ckpt"] if ckpt else [])
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]
    return {"error": (done.stdout + done.stderr)[-2000:]}


def mb(value: float) -> str:
    return f"{value / 2**20:7.1f} MiB"


def gb(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:7.2f} GiB"


def bench(preset: str, args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    report: dict[str, Any] = {"preset": preset, "shape": SHAPE, "patch": PATCH}
    print(f"\n=== {preset} at {SHAPE}, patch {PATCH}: {(64 // 4) * 24 * 24} tokens ===")
    f = report["flops"] = flops(preset)
    print("1. FLOPs per volume, one training step (student fwd+bwd, EMA target fwd):")
    print(f"   counted (FlopCounterMode, meta, math attention): {f['counted'] / 1e12:.3f} TFLOP")
    print(
        f"   of which attention bmm as counted:               {f['counted_bmm'] / 1e12:.3f} TFLOP"
    )
    print(
        f"   counted without attention:                       "
        f"{f['counted_without_attention'] / 1e12:.3f} TFLOP"
    )
    print(
        f"   attention by hand (4 N^2 d per layer forward):   "
        f"{f['attention_by_hand'] / 1e12:.3f} TFLOP"
    )
    print(
        f"   total with attention added by hand:              "
        f"{f['total_with_attention_by_hand'] / 1e12:.3f} TFLOP "
        f"(attention share {f['attention_share']:.1%})"
    )
    a = report["v4"] = v4_arithmetic(preset, args.block)
    print(f"2. One v4 chip (32 GiB HBM), batch 1, {a['params'] / 1e6:.1f}M trained parameters:")
    print(f"   weights + grads + AdamW + EMA target (fp32):   {gb(a['state_bytes'])}")
    context = 9216 - round(MASK_RATIO * 9216)
    print(f"   per encoder layer activations ({context:,} tokens):  {mb(a['enc_layer_act'])}")
    print(f"   per predictor layer activations (9,216 tok.):  {mb(a['pred_layer_act'])}")
    print(f"   per layer kept when checkpointed (enc/pred):   {mb(a['enc_layer_ckpt_kept'])} /")
    print(f"                                                  {mb(a['pred_layer_ckpt_kept'])}")
    print(
        f"   attention matrices per layer, materialized:    {gb(a['pred_layer_attn_materialized'])}"
    )
    print(
        f"   attention per layer, blocked (saved + live chunk of {args.block} rows): "
        f"{mb(a['pred_layer_attn_blocked'])}"
    )
    print(f"   estimate, math, no checkpointing:              {gb(a['total_math_no_ckpt'])}")
    print(f"   estimate, blocked, no checkpointing:           {gb(a['total_blocked_no_ckpt'])}")
    print(f"   estimate, blocked + checkpointing:             {gb(a['total_blocked_ckpt'])}")
    print(
        "   volumes per chip in 32 GiB (blocked + ckpt):   "
        f"{int((V4_HBM - a['state_bytes']) // (a['total_blocked_ckpt'] - a['state_bytes']))}"
    )
    rows: list[tuple[str, str, str, dict[str, Any]]] = []
    if preset not in args.skip_eager:
        print("3. CPU eager, bf16 autocast, one training step, fresh subprocess each:")
        for attention, ckpt in [("sdpa", False), ("sdpa", True)]:
            r = run_eager(preset, attention, ckpt, args.block)
            report[f"eager-{attention}-{ckpt}"] = r
            rows.append(("cpu eager", attention, str(ckpt), r))
            if "error" in r:
                print(f"   {attention} ckpt={ckpt}: FAILED {r['error'][-300:]}")
                continue
            print(
                f"   {attention:7s} ckpt={ckpt!s:5s} step {r['step_s']:6.1f} s, peak RSS "
                f"{gb(r['peak_rss'])} (step adds {gb(r['step_rss_delta'])})"
            )
        print(
            "   math at full shape is not run: its attention matrices alone need "
            f"{gb(a['total_math_no_ckpt'])} (see 2.)"
        )
    else:
        print("3. CPU eager skipped (--skip-eager)")
    if not args.skip_xla and not args.xla_python.is_file():
        print(f"4. XLA:CPU skipped: no {args.xla_python} (make .venv-xla/.installed builds it)")
    elif not args.skip_xla:
        chip = args.per_chip_batch or per_chip_batch(preset)
        print(
            "4. XLA:CPU compiled training step, bf16 autocast, XLA buffer assignment; kernel:\n"
            "   math = materialized, blocked = the scan kernel (a TPU runs Pallas flash instead):"
        )
        runs = [("math", False, 1), ("blocked", False, 1), ("blocked", True, 1)]
        runs += [("blocked", True, chip)]  # the v4-32 preset's volumes per chip
        for attention, ckpt, volumes in runs:
            # The materialized baseline would need its whole buffer assignment in host memory.
            execute = args.xla_execute and attention != "math"
            if volumes == 1 and args.per_chip_only:
                continue
            r = run_xla(
                preset,
                attention,
                ckpt,
                args.block,
                out,
                execute,
                args.xla_limit,
                args.xla_python,
                volumes,
            )
            key = f"xla-{attention}-{ckpt}" + ("" if volumes == 1 else f"-b{volumes}")
            report[key] = r | {"kernel": attention, "volumes_per_chip": volumes}
            rows.append(("xla:cpu", f"{attention} b{volumes}", str(ckpt), r))
            if "total" not in r:
                print(f"   {attention} ckpt={ckpt}: FAILED {r.get('error', '')[-500:]}")
                continue
            ran = (
                f", compile+run {r['compile_and_step_s']:.0f} s"
                if "compile_and_step_s" in r
                else ""
            )
            print(
                f"   {attention:7s} ckpt={ckpt!s:5s} total {gb(r['total'])}, temp {gb(r['temp'])},"
                f" peak {gb(r['peak'])}, {r['dots']} dots ({r['module']}, compiled in"
                f" {r['compile_s']:.0f} s{ran})"
            )
        print(
            "   (XLA_FLAGS keeps optimization barriers, as TPU does: XLA:CPU would expand them\n"
            "   before scheduling and the checkpointed recomputation would save nothing)"
        )
    print("5. Table (baseline: attention=math, checkpointing off):")
    print(f"   {'where':10s} {'attention':11s} {'ckpt':5s} {'memory':>12s} {'time':>9s}")
    base = report.get("xla-math-False", {}).get("total")
    print(f"   {'v4 est.':10s} {'math b1':11s} {'False':5s} {gb(a['total_math_no_ckpt']):>12s}")
    print(f"   {'v4 est.':10s} {'blocked b1':11s} {'True':5s} {gb(a['total_blocked_ckpt']):>12s}")
    for where, attention, ckpt, r in rows:
        memory = r.get("total", r.get("peak_rss"))
        seconds = r.get("step_s", r.get("compile_and_step_s"))
        timing = "-" if seconds is None else f"{seconds:7.1f} s"
        ratio = f"  {memory / base:.2f}x baseline" if base and where == "xla:cpu" and memory else ""
        print(f"   {where:10s} {attention:11s} {ckpt:5s} {gb(memory):>12s} {timing:>9s}{ratio}")
    if torch.cuda.is_available():
        print(f"6. CUDA ({torch.cuda.get_device_name()}, batch 1, bf16 autocast):")
        for attention, ckpt in [("sdpa", False), ("sdpa", True)]:
            cuda_figures(preset, attention, ckpt, args.block, f["total_with_attention_by_hand"])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--presets", default="vit29m,vit90m")
    parser.add_argument("--out", type=Path, default=Path("bench-output/model"))
    parser.add_argument("--skip-eager", default="", help="comma-separated presets")
    parser.add_argument("--skip-xla", action="store_true")
    parser.add_argument("--xla-python", type=Path, default=XLA_PYTHON, help="torch-xla's python")
    parser.add_argument(
        "--xla-execute", action="store_true", help="also run the compiled step (not for math)"
    )
    parser.add_argument("--xla-limit", type=float, default=1800.0, help="seconds per XLA config")
    parser.add_argument("--block", type=int, default=1024, help="attention_block")
    parser.add_argument(
        "--per-chip-batch",
        type=int,
        default=0,
        help="volumes per chip for the last XLA figure (0: the preset's v4-32 config's)",
    )
    parser.add_argument(
        "--per-chip-only", action="store_true", help="XLA: only the per-chip-batch figure"
    )
    # Worker mode (one config in a fresh process): not for direct use.
    parser.add_argument("--worker", choices=["eager", "xla"])
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--ckpt", action="store_true")
    parser.add_argument("--marker", type=Path)
    args = parser.parse_args()
    if args.worker == "eager":
        r = eager_worker(args.presets, args.attention, args.ckpt, args.block)
        print("RESULT " + json.dumps(r), flush=True)
        return
    if args.worker == "xla":
        volumes = args.per_chip_batch or 1
        r = xla_worker(args.presets, args.attention, args.ckpt, args.block, args.marker, volumes)
        print("RESULT " + json.dumps(r), flush=True)
        return
    args.skip_eager = set(filter(None, args.skip_eager.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    reports = [bench(p, args) for p in args.presets.split(",")]
    path = args.out / "bench_model.json"
    path.write_text(json.dumps(reports, indent=2, default=str))
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
