"""Claim: ``octtrain embed`` runs within 1.2x of the slower of the two floors it cannot beat,
measured in the same run, its memory is flat from 10,000 to 1,000,000 manifest items, and two
processes embed faster than one.

The cache is ``bench_manifest_scale.py``'s: 192 real fields (uint8 5x64x64, as build-cache stores
them) in plate P0, listed again as plates C0, C1, ... (symlinks to P0, each row its own id, key,
checksum and sources) in columnar manifests of 10,000 and 1,000,000 fields. The encoder is a
2-step DINO run of ``configs/pretrain/dino-tiny.yaml`` (a 32 px crop centred on each of a
field's nuclei, each in its 8 flips and turns). On ``--items`` fields (default 4,096), one after
the other:

* **loader floor**: the export's own loader (``embed.items.parts_loader``, ``--num-workers``
  processes, the same batches) read to the end, no model: fields read and cut into their views
  (the segmentation included) per second, the best of three passes;
* **forward floor**: the export's own forward (``embed.encode.embed_fields``) on in-memory views
  of ``--batch-size`` fields, at the intra-op threads the export uses beside its loader workers
  (``runtime.backend.cpu_threads``), set before any torch work: fields per second, the best of
  three thirds of the items after three warm-up forwards;

Each floor runs in a fresh process of its own, as ``embed`` does (threads changed in a process
that already ran torch work measured 20% slower here).
* **embed**: ``octtrain embed --limit ITEMS`` as its console script runs, in a child process:
  the fields per second of its embedding phase (``items_per_s`` of its summary; start-up and
  manifest check excluded, printed apart), and its peak RSS (``VmHWM``, read by itself at its
  end; loader workers are processes of their own), on the 10,000 and the 1,000,000 manifests;
* **two processes**: the same under ``torchrun --nproc_per_node 2`` (``OMP_NUM_THREADS`` 1 each,
  as torchrun sets), against one process.

    nice -n 10 python bench/bench_embed.py [--items 4096] [--sizes 10000,1000000]

On a GPU (``--device cuda``) the same lines measure that device; ViT-S/8 on 1,080 px fields is
left to a session with one (none was lent for this bench).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_manifest_scale import copies, header_manifest, write_real_cache  # noqa: E402

from octstage import manifest as mf  # noqa: E402
from octstage.manifest import columnar  # noqa: E402
from octtrain.embed.encode import embed_fields  # noqa: E402
from octtrain.embed.encoders import checkpoint_encoder  # noqa: E402
from octtrain.embed.items import parts_loader  # noqa: E402
from octtrain.runtime.backend import cpu_threads  # noqa: E402
from octtrain.runtime.checkpoint import load_checkpoint, resolve_checkpoint  # noqa: E402

REPEATS = 3
REAL = 192  # real fields in plate P0 (8 rows x 24 wells)
DINO_TINY = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"
WRAPPER = (
    "import sys, json; from octtrain.cli import main; code = main(sys.argv[2:]); "
    "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]; "
    "open(sys.argv[1], 'w').write(json.dumps({'code': code, 'hwm_mb': int(hwm) / 1024})); "
    "sys.exit(code)"
)


def table_manifest(root: Path, real: list[dict[str, Any]], n: int) -> Path:
    """The columnar manifest of ``n`` fields (copies of the real plate), streamed."""
    plates = -(-n // len(real))
    for j in range(plates):
        link = root / "fields" / f"C{j}"
        if not link.exists():
            link.symlink_to("P0")
    path = root / f"n{n}" / "manifest.json"
    path.parent.mkdir(exist_ok=True)
    info = columnar.write_items(
        path.with_name(columnar.items_name(path)), "cellpainting", copies(real, n)
    )
    path.write_text(json.dumps(mf.to_header(header_manifest(n, plates), info), indent=1) + "\n")
    return path


def train_checkpoint(manifest: Path, run: Path) -> Path:
    """A 2-step DINO run of the tiny config on the manifest's fields; its checkpoint folder."""
    cmd = [sys.executable, "-m", "octtrain.cli", "pretrain", "--config", str(DINO_TINY),
           "--manifest", str(manifest), "--cache", str(manifest.parent.parent),
           f"train.run_dir={run}", "train.max_steps=2", "checkpoint.every=2",
           "logging.wandb_mode=disabled", "validation.every=0"]  # fmt: skip
    subprocess.run(
        cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    return run / "checkpoints"


def loader_floor(manifest: Path, checkpoint: Path, items: int, args: argparse.Namespace) -> float:
    """Fields per second the export's loader reads, segments and cuts into views, no model."""
    url = resolve_checkpoint(str(checkpoint))
    encoder = checkpoint_encoder(load_checkpoint(url), url, "auto")
    fields = mf.load(manifest).fields[:items]
    views = [fields[s : s + args.part_size] for s in range(0, items, args.part_size)]
    started, n = time.monotonic(), 0
    for batch in parts_loader(
        views, manifest.parent.parent, encoder, args.batch_size, args.workers
    ):
        n += len(batch["tiles"])
    assert n == items
    return items / (time.monotonic() - started)


def forward_floor(manifest: Path, checkpoint: Path, items: int, args: argparse.Namespace) -> float:
    """Fields embedded per second from the items' tiles already in memory (every batch read
    first), at the export's intra-op threads set before any torch work."""
    torch.set_num_threads(cpu_threads(0, args.workers))
    url = resolve_checkpoint(str(checkpoint))
    encoder = checkpoint_encoder(load_checkpoint(url), url, "auto")
    fields = mf.load(manifest).fields[:items]
    batches = list(parts_loader([fields], manifest.parent.parent, encoder, args.batch_size, 0))
    for batch in batches[:3]:  # warm: the first forwards set up the kernels
        embed_fields(encoder.module, batch["tiles"], torch.device("cpu"))
    rates = []
    for r in range(REPEATS):  # the best of three thirds: a floor, not a typical run
        started, n = time.monotonic(), 0
        for batch in batches[r::REPEATS]:
            n += len(embed_fields(encoder.module, batch["tiles"], torch.device("cpu")))
        rates.append(n / (time.monotonic() - started))
    return max(rates)


def floor(
    which: str, manifest: Path, checkpoint: Path, items: int, args: argparse.Namespace
) -> float:
    """A floor measured in a fresh process of its own, as ``embed`` runs in one."""
    cmd = [sys.executable, __file__, "--floor", which, "--manifest", str(manifest),
           "--checkpoint", str(checkpoint), "--items", str(items), "--batch-size",
           str(args.batch_size), "--workers", str(args.workers), "--part-size",
           str(args.part_size)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def embed(
    manifest: Path, checkpoint: Path, out: Path, items: int, args: argparse.Namespace, procs: int
) -> dict[str, Any]:
    """``octtrain embed --limit ITEMS`` in a child (``procs`` > 1: under torchrun): its summary,
    wall time and process 0's peak RSS."""
    hwm = out.with_suffix(".hwm.json")
    flags = ["embed", "--checkpoint", str(checkpoint), "--manifest", str(manifest), "--cache",
             str(manifest.parent.parent), "--out",
             str(out), "--limit", str(items), "--part-size", str(args.part_size), "--batch-size",
             str(args.batch_size), "--num-workers", str(args.workers), "--device", "cpu",
             "--json"]  # fmt: skip
    if procs == 1:
        cmd = [sys.executable, "-c", WRAPPER, str(hwm), *flags]
    else:
        rank_cli = ROOT / "tests" / "octtrain" / "rank_cli.py"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={procs}", str(rank_cli), *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"embed failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    text = proc.stdout
    summary: dict[str, Any] = json.loads(text[text.index("{") : text.rindex("}") + 1])
    summary["wall_s"] = wall
    if hwm.exists():
        summary["hwm_mb"] = json.loads(hwm.read_text())["hwm_mb"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=4096, help="fields embedded per arm")
    parser.add_argument("--sizes", default="10000,1000000", help="manifest sizes for the RSS")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--workers", type=int, default=0, help="loader processes (embed's default on CPU: 0)"
    )
    parser.add_argument("--part-size", type=int, default=256)
    parser.add_argument("--work", help="working folder (default: a temporary one)")
    parser.add_argument("--floor", choices=("loader", "forward"), help=argparse.SUPPRESS)
    parser.add_argument("--manifest", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:  # a floor's own process (``floor``)
        measure = loader_floor if args.floor == "loader" else forward_floor
        print(measure(args.manifest, args.checkpoint, args.items, args))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        work = Path(args.work or tmp)
        root = work / "cache"
        root.mkdir(parents=True, exist_ok=True)
        real = write_real_cache(root, REAL)
        started = time.monotonic()
        manifests = {n: table_manifest(root, real, n) for n in sizes}
        print(f"manifests of {sizes} fields written in {time.monotonic() - started:.1f} s")
        small = manifests[min(sizes)]
        checkpoint = train_checkpoint(small, work / "run")
        items = min(args.items, min(sizes))
        print(f"{items} fields a run, batch {args.batch_size}, {args.workers} loader worker(s), "
              f"parts of {args.part_size}, {os.cpu_count()} cores")  # fmt: skip
        loader = floor("loader", small, checkpoint, items, args)
        forward = floor("forward", small, checkpoint, items, args)
        print(f"loader floor:  {loader:8.1f} fields/s (read, segmented, cut into views; no model)")
        print(f"forward floor: {forward:8.1f} fields/s (in-memory views, "
              f"{cpu_threads(0, args.workers)} intra-op thread(s))")  # fmt: skip
        runs = {}
        for n in sizes:
            runs[n] = embed(manifests[n], checkpoint, work / f"out{n}", items, args, 1)
            r = runs[n]
            print(f"embed, {n:>9,} manifest items: {r['items_per_s']:8.1f} fields/s, "
                  f"{r['wall_s']:.1f} s in all, peak RSS {r['hwm_mb']:.0f} MB")  # fmt: skip
        two = embed(small, checkpoint, work / "two", items, args, 2)
        one = runs[min(sizes)]
        print(f"embed, 2 processes:            {two['items_per_s']:8.1f} fields/s "
              f"({two['wall_s']:.1f} s in all) against {one['items_per_s']:.1f} for 1")  # fmt: skip
        slower = min(loader, forward)
        ratio = slower / one["items_per_s"]
        rss = [runs[n]["hwm_mb"] for n in sizes]
        print(f"verdict: embed at {ratio:.2f}x the slower floor's time (target at most 1.2): "
              f"{'reached' if ratio <= 1.2 else 'NOT reached'}")  # fmt: skip
        print(f"verdict: peak RSS {rss[0]:.0f} MB at {sizes[0]:,} items, {rss[-1]:.0f} MB at "
              f"{sizes[-1]:,} ({rss[-1] / rss[0]:.2f}x; target at most 1.5 GB): "
              f"{'reached' if rss[-1] <= 1536 else 'NOT reached'}")  # fmt: skip
        faster = two["items_per_s"] > one["items_per_s"]
        print(f"verdict: 2 processes {two['items_per_s'] / one['items_per_s']:.2f}x one: "
              f"{'faster' if faster else 'NOT faster'}")  # fmt: skip


if __name__ == "__main__":
    main()
