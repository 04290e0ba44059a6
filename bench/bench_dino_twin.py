"""Does DINOv2 pretraining give profiles that beat a random-init encoder? A CPU-sized check.

Builds a small Cell Painting cache: by default octstage's JUMP-layout twin (``octstage synth
--kind cellpainting``, then ``octstage build-cache --kind cellpainting``: 2 plates x 24 wells,
five documented phenotypes + DMSO; splits by plate, DINO trains on the train plate); with
``--simple`` the trainer tests' fields (``tests/octtrain/cell_cache.py``: the perturbation
enlarges the nuclei). It pretrains the tiny 2D ViT with DINO + iBOT + KoLeo for ``--steps``
through the real job and skeleton, then runs ``profile_fields`` on every field: per encoder
(the DINO teacher, the same encoder at random init, handcrafted CellProfiler-style features)
the phenotypic-activity and consistency mAP (copairs) of control-normalised well profiles and
the k-NN probes. Prints the table and the wall time.

    PYTHONPATH=$PWD python bench/bench_dino_twin.py [--steps 300] [--simple --fields 96]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from octstage.cli import main as octstage
from octstage.manifest import load
from octtrain.config.dino import DinoConfig
from octtrain.config.loader import load_config
from octtrain.eval.profile_run import profile_fields
from octtrain.runtime.backend import make_backend
from octtrain.train.dino import DinoJob
from octtrain.train.job import Settings
from octtrain.train.loop import Trainer
from tests.octtrain.cell_cache import write_cell_cache

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--fields", type=int, default=96)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--radii", type=float, nargs=2, default=(4.0, 5.0))
    parser.add_argument("--noise", type=float, default=0.3)
    parser.add_argument("--simple", action="store_true", help="the tests' fields, not the twin")
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cache"
        root.mkdir()
        if args.simple:
            fields: list[Any] = list(
                write_cell_cache(
                    root,
                    n=args.fields,
                    size=args.size,
                    splits=("train",),
                    radii=tuple(args.radii),
                    noise=args.noise,
                )
            )
            train = fields
        else:
            src = Path(tmp) / "src"
            assert octstage(["synth", "--kind", "cellpainting", str(src)]) == 0
            build = ["build-cache", "--kind", "cellpainting", "--source", str(src)]
            build += ["--metadata", str(src / "metadata" / "perturbations.csv")]
            octstage([*build, "--out", str(root)])  # exit 1: the planted truncated TIFF
            manifest = load(root / "manifest.json")
            fields, train = list(manifest.fields), list(manifest.split_fields("train"))
        cfg = load_config(
            DinoConfig,
            ROOT / "configs" / "pretrain" / "dino-tiny.yaml",
            [
                f"train.run_dir={Path(tmp) / 'run'}",
                f"train.max_steps={args.steps}",
                f"checkpoint.every={args.steps}",
                "logging.log_every=50",
                "logging.image_every=0",
                "data.batch_size=16",
                "train.cpu_threads=1",
                "data.num_workers=1",
                f"optim.lr={args.lr}",
                f"schedule.warmup_steps={args.steps // 10}",
                f"dino.warmup_teacher_temp_steps={args.steps // 3}",
            ],
        )
        backend = make_backend("cpu")
        start = time.perf_counter()
        job = DinoJob(cfg, train, root, backend)
        Trainer(job, Settings.of(cfg), backend).run()  # type: ignore[arg-type]
        trained = time.perf_counter() - start
        ckpt = Path(tmp) / "run" / "checkpoints" / f"step_{args.steps:08d}.pt"
        report = profile_fields(str(ckpt), fields, root)
    print(
        f"{report['fields']} fields, {report['encoders']['dino']['wells']:.0f} wells, "
        f"{args.steps} steps in {trained:.0f} s"
    )
    print(
        f"{'encoder':<12} {'activity mAP':>12} {'retrieved':>9} {'consist. mAP':>12} "
        f"{'well kNN':>8} {'field kNN':>9}"
    )
    for name, m in report["encoders"].items():
        print(
            f"{name:<12} {m['activity_map']:>12.3f} {m['activity_retrieved']:>9.2f} "
            f"{m['consistency_map']:>12.3f} {m['well_probe_knn_balanced_accuracy']:>8.3f} "
            f"{m['field_probe_knn_balanced_accuracy']:>9.3f}"
        )


if __name__ == "__main__":
    main()
