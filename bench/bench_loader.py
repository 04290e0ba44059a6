"""Loader benchmark: our Zarr cache vs the users' old per-read DICOM path vs MONAI's cache.

Prints, side by side on the same volumes (synthetic Spectralis-sized OCT DICOMs):
1. loader throughput (volumes/s, DataLoader with the same workers and batch size) reading
   a. the octstage Zarr cache through ``octtrain.data.ManifestDataset``,
   b. DICOM decode + full-volume p1/p99 quantiles + trilinear resize on every read (old path),
   c. MONAI ``PersistentDataset`` over (b) (first pass fills its cache; the warm pass is shown);
2. time to first batch with a 25,000-entry manifest (entries reuse the benchmark's arrays);
3. the share of step time spent waiting for data when the tiny model pretrains with 2 workers.

Usage: ``python bench/bench_loader.py [--out bench-output/loader] [--volumes 16] ...``
Figures are wall-clock on whatever else the machine is doing: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from octstage import manifest as mf
from octstage.normalize import normalize_volume
from octstage.synth_oct import render_retina, write_oct_dicom
from octstage.volumestore import volume_relpath, write_volume
from octtrain.config.loader import load_config
from octtrain.config.pretrain import PretrainConfig
from octtrain.config.sections import AugmentConfig, DataConfig
from octtrain.data.dataset import ManifestDataset, Transform, train_loader
from octtrain.train.pretrain import run_pretrain

EXPLICIT_LE = "1.2.840.10008.1.2.1"  # uncompressed: the old path's fastest case
ROOT = Path(__file__).resolve().parents[1]


# --- inputs ----------------------------------------------------------------------------------


def make_dicoms(folder: Path, n: int, shape: tuple[int, int, int]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        path = folder / f"{1001 + i}_spectralis_oct_r_{i}.dcm"
        if not path.exists():
            volume = render_retina(shape, 0.1 + 0.01 * (i % 4), "R", rng)
            write_oct_dicom(
                path,
                volume,
                patient_id=str(1001 + i),
                laterality="R",
                transfer_syntax=EXPLICIT_LE,
                spacing_mm=(0.12, 0.0039, 0.0057),
                device="heidelberg_spectralis",
                sop_instance_uid=f"1.2.826.0.1.3680043.8.498.{i + 1}",
            )
        paths.append(path)
    return paths


def volume_record(pid: str, rel: str, shape: tuple[int, int, int], checksum: str) -> mf.Volume:
    return mf.Volume(
        participant_id=pid,
        device="heidelberg_spectralis",
        laterality="R",
        protocol="bench",
        split="train",
        study_group="healthy",
        label=0,
        source_path=f"bench/{pid}.dcm",
        source_sha1="0" * 40,
        source_size=0,
        transfer_syntax=EXPLICIT_LE,
        source_shape=shape,
        spacing_mm=(0.1, 0.01, 0.01),
        zarr_path=rel,
        shape=shape,
        dtype="uint8",
        normalization=mf.Normalization(1.0, 99.0, 0.0, 255.0),
        checksum=checksum,
        cache_key=rel.rsplit("/", 1)[-1],
    )


def write_manifest(path: Path, volumes: list[mf.Volume]) -> None:
    header = mf.Header(
        dataset="bench",
        created=datetime.datetime.now(datetime.UTC).isoformat(),
        code_version="bench",
        cache_version=mf.CACHE_VERSION,
        config_hash="bench",
        config={},
        counts=mf.count_summary(volumes, 0),
    )
    mf.write(mf.Manifest(header, ("healthy",), tuple(volumes)), path)


def make_cache(
    cache: Path, dicoms: list[Path], shape: tuple[int, int, int]
) -> tuple[Path, list[mf.Volume]]:
    """The octstage way: decode once, normalise, resize, store uint8 Zarr; plus a manifest."""
    volumes = []
    for i, path in enumerate(dicoms):
        pid = str(1001 + i)
        rel = volume_relpath(pid, f"bench{shape[0]}x{shape[1]}x{shape[2]}")
        array, _ = normalize_volume(pydicom.dcmread(path).pixel_array.astype(np.uint8), shape)
        checksum = write_volume(cache, rel, array, (0.1, 0.01, 0.01), {})
        volumes.append(volume_record(pid, rel, shape, checksum))
    manifest = cache / "manifest.json"
    write_manifest(manifest, volumes)
    return manifest, volumes


# --- the three loaders -----------------------------------------------------------------------


def old_path(path: str, shape: tuple[int, int, int]) -> torch.Tensor:
    """The users' old per-read preprocessing: decode, full-volume quantiles, resize."""
    volume = pydicom.dcmread(path).pixel_array.astype(np.float32)
    low, high = np.percentile(volume, [1, 99])
    volume = np.clip((volume - low) / max(high - low, 1e-6), 0, 1) * 2 - 1
    x = torch.from_numpy(volume)[None, None]
    return F.interpolate(x, size=shape, mode="trilinear", align_corners=False)[0]


class DicomDataset(Dataset[dict[str, Any]]):
    def __init__(self, paths: list[Path], shape: tuple[int, int, int]) -> None:
        self.paths, self.shape = [str(p) for p in paths], shape

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": old_path(self.paths[i], self.shape), "label": 0}


class OldPathTransform:
    """MONAI transform running the old path (deterministic, so PersistentDataset caches it)."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape = shape

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"image": old_path(item["path"], self.shape), "label": item["label"]}


def throughput(dataset: Any, workers: int, batch: int, epochs: int) -> float:
    """Volumes per second over ``epochs`` passes, counted after the first batch (worker
    start-up excluded: it is measured separately as time to first batch)."""
    loader = DataLoader(
        dataset, batch_size=batch, num_workers=workers, persistent_workers=workers > 0
    )
    start, n = 0.0, -1
    for _ in range(epochs):
        for b in loader:
            if n < 0:
                start, n = time.perf_counter(), 0
            else:
                n += b["image"].shape[0]
    return n / (time.perf_counter() - start)


# --- measurements ----------------------------------------------------------------------------


def bench_throughput(
    args: argparse.Namespace, dicoms: list[Path], manifest: Path, work: Path
) -> dict[str, float]:
    shape = tuple(args.shape)
    m = mf.load(manifest)
    ours = ManifestDataset(m, manifest.parent, "train", Transform(shape, None))
    results = {
        "zarr cache (octtrain ManifestDataset)": throughput(
            ours, args.workers, args.batch, args.epochs
        ),
        "DICOM decode + quantiles + resize per read": throughput(
            DicomDataset(dicoms, shape), args.workers, args.batch, args.epochs
        ),
    }
    from monai.data import PersistentDataset

    monai_dir = work / "monai-cache"
    shutil.rmtree(monai_dir, ignore_errors=True)
    items = [{"path": str(p), "label": 0} for p in dicoms]
    persistent = PersistentDataset(items, transform=OldPathTransform(shape), cache_dir=monai_dir)
    results["MONAI PersistentDataset, first pass"] = throughput(
        persistent, args.workers, args.batch, 1
    )
    results["MONAI PersistentDataset, warm"] = throughput(
        persistent, args.workers, args.batch, args.epochs
    )
    return results


def bench_first_batch(
    args: argparse.Namespace, volumes: list[mf.Volume], work: Path
) -> dict[str, float]:
    """25,000 manifest entries (reusing the cached arrays): load, dataset, first batch."""
    big = [
        dataclasses.replace(volumes[i % len(volumes)], participant_id=f"{100000 + i}")
        for i in range(args.entries)
    ]
    path = work / "cache" / "manifest-25k.json"
    write_manifest(path, big)
    timings: dict[str, float] = {"manifest size MB": path.stat().st_size / 1e6}
    t0 = time.perf_counter()
    m = mf.load(path)
    timings["manifest load s"] = time.perf_counter() - t0
    ds = ManifestDataset(m, path.parent, "train", Transform(tuple(args.shape), None))
    cfg = DataConfig(num_workers=args.workers)
    batch = next(iter(train_loader(ds, cfg, args.batch, 0, 1, seed=0)))
    timings["time to first batch s"] = time.perf_counter() - t0
    assert batch["image"].shape[0] == args.batch
    return timings


class Empty(Dataset[dict[str, Any]]):
    """Zero-cost items of the same size: what any DataLoader costs on this machine."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape = shape

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": torch.zeros(1, *self.shape), "label": 0, "index": i}


def loader_floor(shape: tuple[int, int, int], batch: int, seconds_per_step: float) -> float:
    """Median wait for a batch of zero-cost items when the consumer is idle between batches."""
    it = iter(DataLoader(Empty(shape), batch_size=batch, num_workers=2, persistent_workers=True))
    next(it)
    waits = []
    for _ in range(40):
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
        time.sleep(seconds_per_step)
    return sorted(waits)[len(waits) // 2]


def bench_data_wait(args: argparse.Namespace, dicoms: list[Path], work: Path) -> dict[str, float]:
    """Pretrain the tiny model with 2 workers; share of step time spent waiting for data."""
    manifest, _ = make_cache(work / "small-cache", dicoms, tuple(args.small_shape))
    run = work / "wait-run"
    shutil.rmtree(run, ignore_errors=True)
    cfg = load_config(
        PretrainConfig,
        ROOT / "configs" / "pretrain" / "tiny.yaml",
        [
            f"data.manifest={manifest}",
            f"train.run_dir={run}",
            "model.patch=[4,16,16]",
            "data.num_workers=2",
            f"data.batch_size={args.batch}",
            f"train.max_steps={args.steps}",
            "logging.log_every=10",
            "logging.console=false",
            f"checkpoint.every={args.steps}",
        ],
    )
    run_pretrain(cfg)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/data_wait_s" in r]
    steady = rows[2:]  # skip step 1 (worker start-up) and the first window
    wait = sum(r["train/data_wait_s"] for r in steady)
    step = sum(r["train/step_time_s"] for r in steady)
    first = rows[0]
    mean_step = step / len(steady)
    m = mf.load(manifest)
    shape = tuple(args.small_shape)
    ds = ManifestDataset(m, manifest.parent, "train", Transform(shape, AugmentConfig()))
    item_times = []
    for i in range(100):
        t = time.perf_counter()
        ds[(i % len(ds), i)]
        item_times.append(time.perf_counter() - t)
    item = sorted(item_times)[50]
    floor = loader_floor(tuple(args.small_shape), args.batch, mean_step)
    return {
        "data wait share, steady state": wait / step,
        "mean data wait per step s": wait / len(steady),
        "mean step time s": mean_step,
        "first step (incl. worker start) s": first["train/step_time_s"],
        "floor: empty-dataset DataLoader wait s": floor,
        "loader CPU per batch (item median x batch) s": item * args.batch,
    }


def show(title: str, values: dict[str, float], unit: str = "") -> None:
    print(f"\n{title}")
    width = max(len(k) for k in values)
    base = next(iter(values.values()))
    for key, value in values.items():
        ratio = f"  ({base / value:.1f}x slower than ours)" if unit and value < base else ""
        print(f"  {key:<{width}}  {value:10.3f} {unit}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--volumes", type=int, default=16)
    parser.add_argument("--source-shape", type=int, nargs=3, default=[61, 496, 768])
    parser.add_argument("--shape", type=int, nargs=3, default=[64, 384, 384])
    parser.add_argument("--small-shape", type=int, nargs=3, default=[32, 96, 96])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--entries", type=int, default=25_000)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--only", choices=["throughput", "first-batch", "wait"], default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-loader-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder {work}; {args.volumes} DICOMs {args.source_shape} -> cache {args.shape}")
    dicoms = make_dicoms(work / "dicom", args.volumes, tuple(args.source_shape))
    manifest, volumes = make_cache(work / "cache", dicoms, tuple(args.shape))
    steps: dict[str, Callable[[], None]] = {
        "throughput": lambda: show(
            f"1. loader throughput, {args.workers} workers, batch {args.batch} (volumes/s)",
            bench_throughput(args, dicoms, manifest, work),
            "vol/s",
        ),
        "first-batch": lambda: show(
            f"2. {args.entries}-entry manifest (target: first batch < 5 s)",
            bench_first_batch(args, volumes, work),
        ),
        "wait": lambda: show(
            f"3. tiny model, 2 workers, cache {args.small_shape} (target: wait share < 5%)",
            bench_data_wait(args, dicoms, work),
        ),
    }
    for name, step in steps.items():
        if args.only in (None, name):
            step()


if __name__ == "__main__":
    main()
