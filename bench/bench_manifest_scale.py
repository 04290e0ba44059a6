"""Claim: a Cell Painting manifest of a million fields in the columnar form (a JSON header and a
Parquet item table, ``octstage.manifest.columnar``) loads and checks in seconds, keeps the
trainer's memory in the hundreds of MB and a loader worker's copied pages near zero after an
epoch's indexing, where the JSON form (one document of every field) takes ~2.4 KB on disk and
~13 KB of resident Python objects per field, copied again by every worker that touches them.

A tiny real cache (``--real`` fields of 5x64x64 in one plate ``P0``) is written once; a manifest
of N fields lists copies of its fields (copy ``j`` of plate ``P0`` is plate ``C<j>``, a symlink
to ``P0``, so every entry has its own path, key and source files and points at a real array;
every 20th copy is the val split). Per size and form, in a fresh process each: file size; load
time (``octstage.manifest.load``) and the one check (``refuse`` for pretrain); the process's RSS
after loading; a forked loader worker's RSS and private (copied) memory after reading every
train field's record as the dataset does (``CellPaintingDataset.fields[i]``: path, shape,
label); then, with ``--pretrain``, the wall time of ``octtrain pretrain`` (configs/pretrain/
dino-tiny.yaml, 2 loader workers) from its start to its first logged step, the trainer's peak
RSS and a worker's RSS and private memory at that moment (what it adds above the pages it
shares with the trainer). Every size of both forms is run: a process whose RSS passes
``--cap-gb`` (default 8; the JSON form of a million fields needs more) is stopped, and the line
says so ("stopped above 8 GB after N s"): measured, not extrapolated.

    python bench/bench_manifest_scale.py [--sizes 25000,200000,1000000] [--pretrain]

Measured: bench/results/manifest-scale.log (2 shared cores; heavy runs with ``nice -n 10``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("DMSO", "cmpd1")


def rss_mb(pid: int | str = "self", key: str = "VmRSS") -> float:
    """A process's resident memory (``key`` of /proc/PID/status: VmRSS, VmHWM) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def private_mb(pid: int | str = "self") -> float:
    """A process's private resident memory (pages no other process shares), in MB."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total / 1024


def write_real_cache(root: Path, n: int) -> list[dict[str, Any]]:
    """``n`` real fields (uint8 5x64x64, as build-cache stores them) in plate P0; their rows."""
    from octstage import manifest as mf
    from octstage.cellpainting.fieldstore import write_field

    rng = np.random.default_rng(0)
    channels = mf.CELLPAINTING_CHANNELS
    rows = []
    for i in range(n):
        data = rng.integers(0, 256, size=(5, 64, 64), dtype=np.uint8)
        path = f"fields/P0/f{i:04d}.ome.zarr"
        checksum = write_field(root, path, data, channels, {}, chunk=32)
        well, site = f"{'ABCDEFGH'[i // 24 % 8]}{i % 24 + 1:02d}", i // 192 + 1
        label = i % 2
        field = mf.Field(
            item_id=f"source_0/P0/{well}/{site}",
            split="train",
            label=label,
            zarr_path=path,
            shape=(5, 64, 64),
            dtype="uint8",
            checksum=checksum,
            cache_key=f"{i:032x}",
            sources=tuple(
                mf.ChannelSource(
                    c,
                    f"source_0/images/2021_05_31_Batch2/images/P0/P0_{well}_T0001F{site:03d}L01A0"
                    f"{k + 1}Z01C0{k + 1}.tif",
                    f"{i * 7 + k:040x}",
                    2_333_190,
                )
                for k, c in enumerate(channels)
            ),
            source="source_0",
            batch="2021_05_31_Batch2",
            plate="P0",
            well=well,
            site=site,
            channels=channels,
            perturbation=CLASSES[label],
            perturbation_type="compound" if label else "negcon",
            is_control=not label,
            normalization=tuple(mf.Normalization(1.0, 99.8, 110.0, 4113.0) for _ in channels),
            illum=tuple(
                mf.ChannelSource(c, f"source_0/illum/P0/P0_Illum{c}.npy", "c" * 40, 8_000_128)
                for c in channels
            ),
            intensity=mf.Intensity.of(data, channels_first=True),
        )
        rows.append(mf.serial.field_row(field))
    return rows


def copies(real: list[dict[str, Any]], n: int) -> Iterator[dict[str, Any]]:
    """``n`` rows: copy j of the real plate is plate C<j> (every 20th in the val split)."""
    for k in range(n):
        j, row = divmod(k, len(real))
        base = real[row]
        plate = f"C{j}"
        out = dict(base)
        out["plate"] = plate
        out["split"] = "val" if j % 20 == 19 else "train"
        out["item_id"] = base["item_id"].replace("/P0/", f"/{plate}/")
        out["zarr_path"] = base["zarr_path"].replace("/P0/", f"/{plate}/")
        out["cache_key"] = f"{j:08x}{base['cache_key'][8:]}"
        # Every copy its own hashes too: real manifests repeat none (no dictionary shortcut).
        out["checksum"] = "sha256:" + hashlib.sha256(f"{k}".encode()).hexdigest()
        out["sources"] = [
            {
                **s,
                "path": s["path"].replace("/P0/P0_", f"/{plate}/{plate}_"),
                "sha1": hashlib.sha1(f"{k}/{c}".encode()).hexdigest(),
            }
            for c, s in enumerate(base["sources"])
        ]
        out["illum"] = [
            {**s, "path": s["path"].replace("/P0/", f"/{plate}/")} for s in base["illum"]
        ]
        yield out


def header_manifest(n: int, plates: int) -> Any:
    from octstage import manifest as mf

    header = mf.Header(
        dataset="bench",
        created="2026-11-27T00:00:00Z",
        code_version="bench",
        cache_version=mf.CACHE_VERSION,
        config_hash="bench",
        config={},
        counts={"fields": n, "plates": plates, "rejected": 0},
    )
    return mf.Manifest(header, CLASSES, (), (), kind="cellpainting")


def write_manifests(root: Path, real: list[dict[str, Any]], n: int) -> dict[str, Path]:
    """The N-field manifest in both forms (streamed: no list of N rows); symlinked plates."""
    from octstage import manifest as mf
    from octstage.manifest import columnar

    plates = -(-n // len(real))
    for j in range(plates):
        link = root / "fields" / f"C{j}"
        if not link.exists():
            link.symlink_to("P0")
    out = {}
    head = header_manifest(n, plates)
    folder = root / f"n{n}"
    folder.mkdir(exist_ok=True)
    # The JSON form as mf.write writes it (indent=1), one field at a time.
    path = folder / "json" / "manifest.json"
    path.parent.mkdir(exist_ok=True)
    doc = mf.to_dict(head)
    doc.pop("fields")
    with open(path, "w") as f:
        f.write(json.dumps(doc, indent=1)[:-2] + ',\n "fields": [\n')
        for k, row in enumerate(copies(real, n)):
            f.write((",\n" if k else "") + json.dumps(row, indent=1))
        f.write("\n ]\n}\n")
    out["json"] = path
    path = folder / "table" / "manifest.json"
    path.parent.mkdir(exist_ok=True)
    info = columnar.write_items(
        path.with_name(columnar.items_name(path)), "cellpainting", copies(real, n)
    )
    path.write_text(json.dumps(mf.to_header(head, info), indent=1) + "\n")
    out["table"] = path
    return out


def measure(path: Path, root: Path) -> dict[str, Any]:
    """In this (fresh) process: load and check, RSS, then a forked worker's epoch of indexing."""
    from octtrain.config.dino import CropConfig
    from octtrain.data.cellpainting import CellPaintingDataset
    from octtrain.data.dataset import read_manifest
    from octtrain.train.dino import manifest_fields

    base = rss_mb()
    t0 = time.perf_counter()
    from octstage import manifest as mf

    loaded = mf.load(path)
    t1 = time.perf_counter()
    mf.refuse(loaded, str(path), "pretrain", RuntimeError, "cellpainting")
    t2 = time.perf_counter()
    del loaded
    manifest = read_manifest(str(path), "pretrain", "cellpainting")  # what the trainer runs
    crops = CropConfig(global_size=32, local_size=16)
    ds = CellPaintingDataset(manifest_fields(manifest, "train"), root, crops, 4)
    after_load = rss_mb()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the loader worker: reads every train field's record once
        os.close(read)
        before, private0 = rss_mb(), private_mb()
        start = time.perf_counter()
        total = 0
        for i in range(len(ds)):
            f = ds.fields[i]
            total += len(f.zarr_path) + f.shape[0] + (f.label or 0)
        took = time.perf_counter() - start
        msg = {"index_s": took, "worker_rss": rss_mb(), "worker_rss0": before}
        msg["worker_private"] = private_mb() - private0
        os.write(write, json.dumps(msg).encode())
        os._exit(0)
    os.close(write)
    worker = json.loads(os.read(read, 1 << 16).decode())
    os.waitpid(pid, 0)
    return {
        "base_rss": base,
        "load_s": t1 - t0,
        "check_s": t2 - t1,
        "rss": after_load,
        "fields": len(ds),
        **worker,
    }


class Watch:
    """Stops a process whose resident memory passes ``cap_mb`` (a thread polling it every
    0.2 s): the JSON form of a million fields is measured until it passes the cap, not
    extrapolated, and the machine keeps its memory. ``stopped`` says when, if it did."""

    def __init__(self, proc: subprocess.Popen[Any], cap_mb: float) -> None:
        self.proc, self.cap_mb, self.start = proc, cap_mb, time.perf_counter()
        self.stopped: str | None = None
        self.peak = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.proc.poll() is None:
            try:
                rss = rss_mb(self.proc.pid)
            except OSError:  # exited between the poll and the read
                return
            self.peak = max(self.peak, rss)
            if rss > self.cap_mb:
                took = time.perf_counter() - self.start
                self.stopped = f"stopped above {self.cap_mb / 1000:g} GB after {took:.0f} s"
                os.killpg(self.proc.pid, signal.SIGKILL)  # the process and its loader workers
                return
            time.sleep(0.2)

    def join(self) -> str | None:
        self.thread.join()
        return self.stopped


def first_step(path: Path, root: Path, run_dir: Path, cap_mb: float) -> dict[str, Any]:
    """``octtrain pretrain`` to its first logged step: wall time, trainer and worker RSS (and
    the workers' private memory: what each adds above the pages it shares with the trainer);
    ``stopped`` where the trainer passed ``cap_mb`` first."""
    cmd = [
        sys.executable, "-m", "octtrain.cli", "pretrain",
        "--config", str(ROOT / "configs/pretrain/dino-tiny.yaml"),
        "--manifest", str(path), "--cache", str(root),
        f"train.run_dir={run_dir}", "train.max_steps=2", "logging.log_every=1",
        "logging.wandb_mode=disabled", "data.num_workers=2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=env,
        text=True,
        start_new_session=True,
    )
    watch = Watch(proc, cap_mb)
    assert proc.stderr is not None
    out: dict[str, Any] = {"step1_s": None}
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "train step 1 " in line and out["step1_s"] is None:
            out["step1_s"] = time.perf_counter() - start
            out["trainer_peak"] = rss_mb(proc.pid, "VmHWM")
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            out["worker_rss"] = max((rss_mb(k) for k in kids), default=0.0)
            out["worker_private"] = max((private_mb(k) for k in kids), default=0.0)
    proc.wait()
    out["stopped"] = watch.join()
    if out["stopped"]:
        return out
    if out["step1_s"] is None:
        raise SystemExit(f"pretrain failed (exit {proc.returncode}):\n{''.join(lines[-30:])}")
    return out


def child(args: argparse.Namespace) -> None:
    """``--child PATH ROOT``: one measurement, printed as JSON on stdout."""
    path, root = Path(args.child[0]), Path(args.child[1])
    print(json.dumps(measure(path, root)))


def run(cmd: list[str], cap_mb: float) -> dict[str, Any]:
    """One measurement in a fresh process, stopped if it passes ``cap_mb`` (``stopped``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, env=env, text=True, start_new_session=True
        )
        watch = Watch(proc, cap_mb)
        proc.wait()
        stopped = watch.join()
        if stopped:
            return {"stopped": stopped, "peak": watch.peak}
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err.read()[-3000:]}")
        result: dict[str, Any] = json.loads(out.read().strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="25000,200000,1000000", help="fields per manifest, commas")
    p.add_argument("--real", type=int, default=128, help="real fields in the tiny cache")
    p.add_argument(
        "--cap-gb",
        type=float,
        default=8.0,
        help="stop a measured process (either form) whose RSS passes this many GB",
    )
    p.add_argument("--pretrain", action="store_true", help="also time octtrain pretrain's step 1")
    p.add_argument("--workdir", help="keep the caches here (default: a temporary folder)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        real = write_real_cache(work, args.real)
        print(
            f"{'fields':>9} {'form':<5} {'file MB':>8} {'load s':>7} {'check s':>7} "
            f"{'RSS MB':>7} {'idx s':>6} {'wkr RSS':>8} {'wkr copied':>10}"
            + (
                f" {'step1 s':>8} {'trainer pk':>10} {'wkr@step1':>9} {'wkr priv@1':>10}"
                if args.pretrain
                else ""
            )
        )
        cap = args.cap_gb * 1000
        base = None
        for n in sizes:
            t = time.perf_counter()
            paths = write_manifests(work, real, n)
            print(
                f"# {n} fields: both manifests written in {time.perf_counter() - t:.1f} s",
                flush=True,
            )
            for form, path in paths.items():
                size = sum(f.stat().st_size for f in path.parent.iterdir()) / 1e6
                r = run([sys.executable, __file__, "--child", str(path), str(work)], cap)
                if r.get("stopped"):
                    line = f"{n:>9} {form:<5} {size:>8.1f}  {r['stopped']} (load, check, index)"
                else:
                    base = r["base_rss"]
                    line = (
                        f"{n:>9} {form:<5} {size:>8.1f} {r['load_s']:>7.2f} "
                        f"{r['check_s']:>7.2f} {r['rss']:>7.0f} {r['index_s']:>6.2f} "
                        f"{r['worker_rss']:>8.0f} {r['worker_private']:>10.0f}"
                    )
                if args.pretrain:
                    s = first_step(path, work, work / f"run-{n}-{form}", cap)
                    if s["stopped"]:
                        line += f"; pretrain {s['stopped']}"
                    else:
                        line += (
                            f" {s['step1_s']:>8.1f} {s['trainer_peak']:>10.0f} "
                            f"{s['worker_rss']:>9.0f} {s['worker_private']:>10.0f}"
                        )
                print(line, flush=True)
            for path in paths.values():  # the next size's files need the room
                for f in path.parent.iterdir():
                    f.unlink()
        print(
            "RSS MB: the trainer-like process after load, check and dataset (base "
            f"{base or 0:.0f} MB after imports); wkr: a forked loader worker after reading "
            "every train field's record (copied: its private pages, i.e. copy-on-write copies); "
            "step1: octtrain pretrain from its start to its first step, its peak RSS, a loader "
            f"worker's RSS and private memory then; a process above {args.cap_gb:g} GB is stopped"
        )


if __name__ == "__main__":
    main()
