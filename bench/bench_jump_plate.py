"""Claim: a JUMP plate builds in bounded memory and scratch: peak RSS and scratch stay flat
from 384 to 3,456 fields per plate (4-9 sites of a 384-well plate). Throughput is printed
beside the decode floor (the build decodes each field twice: once for the plate's histograms,
once to write it) and beside what writing the cache costs alone.

Each run builds one plate of N fields (5 channels, 16-bit TIFFs, uncompressed as the release's
are, each field's pixels its own: a seeded random texture) from a local folder laid out as the
release (``source_4/images/<batch>/images/<plate>/...``, a ``load_data_with_illum.parquet``
whose ``s3://cellpainting-gallery/`` URLs ``--map-prefix`` maps onto the folder, illumination
functions) into a fresh folder cache, in a child process (``--workers`` threads) so that its
peak RSS (``VmHWM``: ``_peak_rss``) is its own: "plate RSS" is the peak when the plate is built,
"+manifest" the peak at the end, after the manifest is written (from the build's spool, a
field at a time). RSS counts the pages of files mapped too (~55 MiB here: the libraries'
code, the same for every plate); "anon" is the anonymous memory alone (``RssAnon``: what the
machine must hold for the build), its peak until the plate is built, sampled every 0.1 s (a
spike between samples is missed: ``VmHWM`` is the exact peak). Scratch is sampled every
0.1 s: bytes in the child's TMPDIR (where the manifest's spool is, ~0.3 KB a field) plus any
scratch folder in the cache (the output, the fields themselves, is printed apart). fields/s
per core = fields / the child's CPU seconds; the decode floor is reading and decoding the
same TIFFs (one thread, the same CPU clock), fields / CPU seconds; the write floor is writing
a uint8 field of that size into a folder cache (one OME-Zarr group and shard: a fixed ~13 ms
at 256 px), and "2 decodes+write" what the two floors allow together.

Real fields are ~1,080 px: the sweep runs at ``--size`` (default 256: 3,456 fields x 5 x 128 KiB
= 2.2 GB of sources; at 1,080 px they would be 40 GB) and a shorter sweep at ``--real-size``
(1,080) shows what the field's size changes: memory grows with the window's fields (``2 x
--workers`` in flight, each ~5 x px^2 x 7 bytes: raw, float32, uint8) plus the histograms
(5 x 65,536 x 8 bytes per field in flight and one for the plate), not with the plate.

    nice -n 10 python bench/bench_jump_plate.py [--size 256] [--fields 384 1152 3456]
        [--real-size 1080] [--real-fields 96 192] [--workers 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

DATASET = "cpg0016-jump"
SOURCE, BATCH = "source_4", "2021_04_26_Batch1"
URL = f"s3://cellpainting-gallery/{DATASET}/"
CHANNELS = ("DNA", "AGP", "ER", "Mito", "RNA")
PHENIX = {"DNA": 5, "ER": 4, "RNA": 3, "AGP": 2, "Mito": 1}


def _tiff(image: np.ndarray) -> bytes:
    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, image, photometric="minisblack")
    return buf.getvalue()


def make_plate(root: Path, n: int, size: int) -> str:
    """A plate of ``n`` fields (384 wells x sites) under ``root``; its table's object name."""
    from octstage.cellpainting.layout import write_parquet

    plate = f"BR{n:05d}X{size}"
    folder = f"{SOURCE}/images/{BATCH}/images/{plate}__2021-05-02T16_02_51-Measurement1/Images"
    illum = f"{SOURCE}/images/{BATCH}/illum/{plate}"
    (root / folder).mkdir(parents=True, exist_ok=True)
    (root / illum).mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:size, 0:size] / size - 0.5
    vignette = (1.0 - 0.5 * (yy**2 + xx**2)).astype(np.float64)
    for ch in CHANNELS:
        buf = io.BytesIO()
        np.save(buf, vignette / vignette.mean())
        (root / illum / f"{plate}_Illum{ch}.npy").write_bytes(buf.getvalue())
    sites = 9 if n > 384 * 6 else 6 if n > 384 * 4 else 4 if n >= 384 * 4 else -(-n // 384)
    rows = []
    for i in range(n):
        well, site = divmod(i, sites)
        r, c = divmod(well, 24)
        rng = np.random.default_rng([n, size, i])
        row: dict[str, object] = {
            "Metadata_Source": SOURCE,
            "Metadata_Batch": BATCH,
            "Metadata_Plate": plate,
            "Metadata_Well": f"{'ABCDEFGHIJKLMNOP'[r]}{c + 1:02d}",
            "Metadata_Site": site + 1,
        }
        for ch in CHANNELS:
            name = f"r{r + 1:02d}c{c + 1:02d}f{site + 1:02d}p01-ch{PHENIX[ch]}sk1fk1fl1.tiff"
            image = (rng.gamma(2.0, 300.0, (size, size)) * vignette).astype(np.uint16)
            (root / folder / name).write_bytes(_tiff(image))
            row[f"FileName_Orig{ch}"] = name
            row[f"PathName_Orig{ch}"] = f"{URL}{folder}/"
            row[f"URL_Orig{ch}"] = f"{URL}{folder}/{name}"
        for ch in CHANNELS:
            row[f"FileName_Illum{ch}"] = f"{plate}_Illum{ch}.npy"
            row[f"PathName_Illum{ch}"] = f"{URL}{illum}/"
        rows.append(row)
    table = f"{SOURCE}/workspace/load_data_csv/{BATCH}/{plate}/load_data_with_illum.parquet"
    (root / table).parent.mkdir(parents=True, exist_ok=True)
    (root / table).write_bytes(write_parquet(rows))
    return table


def _tree_bytes(path: Path, hidden_only: bool = False) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        if hidden_only and Path(dirpath) == path:
            dirnames[:] = [d for d in dirnames if d.startswith(".")]
            filenames = [f for f in filenames if f.startswith(".")]
        for f in filenames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _hidden_bytes(cache: Path) -> int:
    """Bytes in scratch folders (``.scratch-*``) at the cache's top and in its plate folders, the
    only places a build would make them (a field's or a pack's ``.tmp-*`` folder is the output
    being written, renamed into place when complete: not scratch). Not a walk of the whole
    output: listing thousands of fields ten times a second grew this process's own peak RSS
    with the plate (~19 MiB at 3,456 fields)."""
    total = 0
    levels = [cache, *(p for top in ("fields", "packs") for p in _dirs(cache / top))]
    for folder in levels:
        with contextlib.suppress(FileNotFoundError), os.scandir(folder) as it:
            for entry in it:
                if entry.name.startswith(".scratch-") and entry.is_dir():
                    total += _tree_bytes(Path(entry.path))
    return total


def _dirs(folder: Path) -> list[Path]:
    with contextlib.suppress(FileNotFoundError), os.scandir(folder) as it:
        return [Path(e.path) for e in it if e.is_dir()]
    return []


def _status(key: str) -> int:
    """A size in this process's ``/proc/self/status`` (``VmHWM``, ``RssAnon``), bytes; 0 off
    Linux."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_anon() -> int:
    return _status("RssAnon")


def _peak_rss() -> int:
    """This process's own peak RSS: ``VmHWM``, not ``ru_maxrss``, which in a child starts at
    its parent's peak (Linux keeps the high-water mark of the address space it had before
    ``exec``: the forked parent's), so a bench that made a larger plate first reported a
    larger peak for the build: ~21 KB a field, none of it the build's."""
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(root: Path, table: str, cache: Path, workers: int) -> None:
    """One build, measured from inside: prints a JSON line."""
    from octstage.cellpainting import build as build_module
    from octstage.cellpainting.build import build
    from octstage.cellpainting.layout import PrefixMap

    # The peak while the plate is built, apart from the manifest written after it (whose
    # size grows with the fields it lists, whatever the pixels).
    plate_rss, plate_anon = [0], [0]
    build_plate = build_module.build_plate

    def measured(*args: object, **kwargs: object) -> object:
        out = build_plate(*args, **kwargs)  # type: ignore[arg-type]
        plate_rss[0] = _peak_rss()
        plate_anon[0] = max(anon[0], _rss_anon())
        return out

    build_module.build_plate = measured  # type: ignore[assignment]

    tmp = Path(tempfile.gettempdir())
    peak, anon = [0], [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            anon[0] = max(anon[0], _rss_anon())
            scratch = _tree_bytes(tmp) + _hidden_bytes(cache)
            peak[0] = max(peak[0], scratch)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0, c0 = time.perf_counter(), os.times()
    report, built = build(
        str(root),
        cache,
        load_data=[table],
        workers=workers,
        prefixes=PrefixMap.parse([f"{URL}={root}/"]),
    )
    wall, c1 = time.perf_counter() - t0, os.times()
    done.set()
    sampler.join()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    rss = _peak_rss()
    assert built.fields == report.fields and not report.rejected, report
    out = {"fields": report.fields, "wall": wall, "cpu": cpu, "rss": plate_rss[0]}
    out |= {"anon": plate_anon[0]}
    out |= {"rss_manifest": rss, "scratch": peak[0]}
    print(json.dumps({**out, "output": _tree_bytes(cache)}))


def decode_floor(root: Path, table: str) -> float:
    """Fields per CPU second to read and decode the plate's TIFFs, one thread."""
    from octstage.cellpainting.layout import PrefixMap, parse_load_data, read_table
    from octstage.cellpainting.normalize import decode_tiff

    rows = parse_load_data(
        read_table((root / table).read_bytes(), table),
        table,
        str(root),
        PrefixMap.parse([f"{URL}={root}/"]),
    )
    c0 = os.times()
    for r in rows:
        for _, name in r.images:
            decode_tiff((root / name).read_bytes(), name)
    c1 = os.times()
    return len(rows) / max(1e-9, (c1.user - c0.user) + (c1.system - c0.system))


def write_floor(size: int, n: int = 20) -> float:
    """Fields per CPU second to write a uint8 field of this size into a folder cache (the
    fixed cost of one OME-Zarr group and shard per field), one thread."""
    from octstage.cellpainting import fieldstore

    array = np.random.default_rng(0).integers(0, 255, (5, size, size), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        c0 = os.times()
        for i in range(n):
            fieldstore.write_field(Path(tmp), f"f/{i}.ome.zarr", array, CHANNELS, {}, 64, 3)
        c1 = os.times()
    return n / max(1e-9, (c1.user - c0.user) + (c1.system - c0.system))


def run(work: Path, n: int, size: int, workers: int) -> dict[str, float]:
    src, cache, tmp = work / f"src{size}", work / "cache", work / "tmp"
    t0 = time.perf_counter()
    table = make_plate(src, n, size)
    made = time.perf_counter() - t0
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    cmd = [sys.executable, __file__, "--child", str(src), table, str(cache), str(workers)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"build of {n} fields failed:\n{res.stderr[-3000:]}")
    out: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    out["floor"] = decode_floor(src, table)
    out["write"] = write_floor(size)
    out["made"] = made
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(src / SOURCE, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--fields", type=int, nargs="+", default=[384, 1152, 3456])
    ap.add_argument("--real-size", type=int, default=1080)
    ap.add_argument("--real-fields", type=int, nargs="*", default=[96, 192])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", type=Path)
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench-jump-"))
    mib = 1024 * 1024
    print(
        f"one plate per run, 5 channels, uint16 TIFFs, --workers {a.workers} "
        f"(window {2 * a.workers} fields); {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'px':>5} {'fields':>6} {'plate RSS':>10} {'anon':>8} {'+manifest':>10} {'scratch':>9} "
        f"{'output':>9} {'wall s':>7} "
        f"{'fields/s':>8} {'f/s/core':>8} {'decode floor':>12} {'build/floor':>11} "
        f"{'write floor':>11} {'2 decodes+write':>15}"
    )
    rows = [(a.size, n) for n in a.fields] + [(a.real_size, n) for n in a.real_fields]
    results = []
    for size, n in rows:
        r = run(work, n, size, a.workers)
        per_core = r["fields"] / max(1e-9, r["cpu"])
        results.append((size, n, r))
        print(
            f"{size:>5} {n:>6} {r['rss'] / mib:>6.0f} MiB {r['anon'] / mib:>4.0f} MiB "
            f"{r['rss_manifest'] / mib:>6.0f} MiB "
            f"{r['scratch'] / mib:>5.1f} MiB "
            f"{r['output'] / mib:>5.0f} MiB {r['wall']:>7.1f} {r['fields'] / r['wall']:>8.1f} "
            f"{per_core:>8.1f} {r['floor']:>12.1f} {per_core / r['floor']:>10.2f}x "
            f"{r['write']:>11.1f} {1 / (2 / r['floor'] + 1 / r['write']):>15.1f}",
            flush=True,
        )
    for size in sorted({s for s, _, _ in results}):
        rss = [r["rss"] for s, _, r in results if s == size]
        anon = [r["anon"] for s, _, r in results if s == size]
        ns = [n for s, n, _ in results if s == size]
        if len(rss) > 1:
            print(
                f"{size} px: peak RSS building the plate "
                f"{min(rss) / mib:.0f}-{max(rss) / mib:.0f} MiB from "
                f"{min(ns)} to {max(ns)} fields ({max(ns) / min(ns):.0f}x the fields, "
                f"{max(rss) / min(rss):.2f}x the RSS, "
                f"{(rss[-1] - rss[0]) / max(1, ns[-1] - ns[0]) / 1024:.1f} KB a field; anon "
                f"{min(anon) / mib:.0f}-{max(anon) / mib:.0f} MiB); scratch peak "
                f"{max(r['scratch'] for s, _, r in results if s == size) / mib:.1f} MiB"
            )
    window = 2 * a.workers
    for size in sorted({s for s, _, _ in results}):
        per_field = 5 * size * size * 7 + 5 * 65536 * 8
        print(
            f"{size} px: a field in flight holds ~{per_field / mib:.1f} MiB (raw, float32, uint8, "
            f"its histogram): the window's {window} ~{window * per_field / mib:.0f} MiB"
        )
    shutil.rmtree(work, ignore_errors=True) if a.workdir is None else None


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
