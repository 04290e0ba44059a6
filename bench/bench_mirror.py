"""Measure ``octstage mirror`` against plain ``rclone copy`` on a simulated AI-READI bucket.

Both doubles run on loopback (B2: b2sdk's simulator behind tests/doubles/b2_server.py, in this
process; GCS: fake-gcs-server), seeded with N tiny objects in the AI-READI layout (five files per
participant folder, so N/5 folders). Every command runs as a subprocess with the real rclone.
What is measured, side by side:

1. listing the source: B2 list calls and seconds with and without ``--fast-list``;
2. a first full copy: ``rclone copy`` vs ``octstage mirror`` (new empty prefixes), and our
   overhead before verification (listing for the inventory, planning, saving the inventory):
   (mirror time - verification time) / rclone copy time - 1, target < 10 %;
3. verification throughput: MB hashed per second at the destination, on the tiny objects and on
   a few larger ones (``--large``);
4. a second run over the unchanged source: seconds and bytes pulled from B2.

Default: 1,000 objects, first copies run twice (about 3 minutes on a busy 2-core machine);
``--objects 25000 --repeat 1`` for the full size (tens of minutes: verification hashes every
object through the Python client, a few ms of CPU each).
Run from the repository root: ``python bench/bench_mirror.py [--objects N] [--json OUT]``.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from octstage.storage.locations import rclone_binary  # noqa: E402
from tests.doubles.b2_server import B2Double  # noqa: E402
from tests.doubles.gcs import GcsDouble  # noqa: E402

DEVICES = ("heidelberg_spectralis", "topcon_maestro2", "topcon_triton", "zeiss_cirrus")
PROTOCOLS = ("spectralis_ppol_mac_hr_oct", "maestro2_3d_macula_oct", "triton_3d_oct", "cirrus_mac")
FILES_PER_FOLDER = 5
MTIME = 1_700_000_000_000


def seed(b2: B2Double, objects: int, prefix: str) -> int:
    """``objects`` tiny files, five per participant folder; returns the total bytes."""
    total = 0
    for i in range(objects):
        folder = i // FILES_PER_FOLDER
        device = folder % len(DEVICES)
        pid = f"{'147'[(folder // 4) % 3]}{(folder // 12) % 1000:03d}"
        eye = "lr"[i % 2]
        name = (
            f"{prefix}/retinal_oct/structural_oct/{DEVICES[device]}/{pid}/"
            f"{pid}_{PROTOCOLS[device]}_{eye}_1.2.826.0.1.3680043.8.498.{folder}.{i}.dcm"
        )
        data = os.urandom(256 + (i * 7919) % 1792)
        b2.put("src", name, data, large=i % 10 == 0, mtime_ms=MTIME)
        total += len(data)
    return total


def timed(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    seconds = time.perf_counter() - start
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{args[:4]} failed ({out.returncode}): {out.stderr[-2000:]}")
    return seconds, out


class Counter:
    """Deltas of the B2 double's counters around one command."""

    def __init__(self, b2: B2Double) -> None:
        self.b2 = b2
        self.lists = b2.stats.calls["b2_list_file_names"]
        self.bytes = b2.stats.downloaded_bytes

    def delta(self) -> tuple[int, int]:
        calls = self.b2.stats.calls["b2_list_file_names"] - self.lists
        return calls, self.b2.stats.downloaded_bytes - self.bytes


def mirror(env: dict[str, str], src: str, dst: str, work: Path) -> tuple[float, dict[str, Any]]:
    report = work / f"mirror-{time.monotonic_ns()}.json"
    args = [sys.executable, "-m", "octstage.cli", "mirror", src, dst, "--json", str(report)]
    seconds, _ = timed(args, env)
    return seconds, json.loads(report.read_text())


def run(
    objects: int, large: int, large_mb: int, transfers: int, checkers: int, repeat: int
) -> dict[str, Any]:
    results: dict[str, Any] = {"objects": objects, "folders": objects // FILES_PER_FOLDER}
    rclone = rclone_binary()
    with B2Double() as b2, GcsDouble() as gcs, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        b2.create_bucket("src")
        t0 = time.perf_counter()
        results["bytes"] = seed(b2, objects, "v3")
        for i in range(large):
            data = os.urandom(large_mb * 1024 * 1024)
            b2.put("src", f"large/volume-{i}.dcm", data, large=True, mtime_ms=MTIME)
        results["seed_seconds"] = round(time.perf_counter() - t0, 1)
        env = {**os.environ, "RCLONE_CONFIG": "/dev/null", **b2.rclone_env(), **gcs.env()}
        flags = ["--transfers", str(transfers), "--checkers", str(checkers), "-q"]

        # 1. listing (a dry-run copy into an empty folder lists the source and nothing else)
        for label, extra in (("fast_list", ["--fast-list"]), ("per_folder", [])):
            count = Counter(b2)
            cmd = [rclone, "copy", "--dry-run", *extra, *flags, "b2:src/v3", str(work / "none")]
            seconds, _ = timed(cmd, env)
            results[f"list_{label}"] = {"seconds": round(seconds, 2), "calls": count.delta()[0]}

        # 2. first copy: plain rclone vs octstage mirror, each into its own new bucket (the
        #    fake's filesystem backend slows down as a folder fills), the order alternating
        #    over --repeat runs and the best of each kept (a shared 2-core machine is noisy)
        best: dict[str, Any] = {}
        for rep in range(repeat):
            for kind in ("rclone_copy", "mirror") if rep % 2 == 0 else ("mirror", "rclone_copy"):
                bucket = f"{kind.replace('_', '-')}-{rep}"
                gcs.create_bucket(bucket)
                count = Counter(b2)
                if kind == "rclone_copy":
                    cmd = [rclone, "copy", "--fast-list", *flags, "b2:src/v3", f"gcs:{bucket}/v3"]
                    seconds, _ = timed(cmd, env)
                    calls, pulled = count.delta()
                    if kind not in best or seconds < best[kind]["seconds"]:
                        best[kind] = {"seconds": round(seconds, 2), "calls": calls, "bytes": pulled}
                        best["plain_bucket"] = bucket
                    continue
                seconds, report = mirror(env, "b2:src/v3", f"gs://{bucket}/v3", work)
                calls, pulled = count.delta()
                before_verify = seconds - report["verify_seconds"]
                if kind in best and before_verify >= best[kind]["before_verify_seconds"]:
                    continue
                best["mirror_bucket"] = bucket
                best[kind] = {
                    "seconds": round(seconds, 2),
                    "before_verify_seconds": round(before_verify, 2),
                    "copy_seconds": report["copy_seconds"],
                    # Everything but rclone's copy: start-up, inventory, plan, saving it.
                    "own_seconds": round(before_verify - report["copy_seconds"], 2),
                    "inventory_seconds": report["list_seconds"],
                    "plan_seconds": report["plan_seconds"],
                    "verify_seconds": report["verify_seconds"],
                    "hashed_bytes": report["hashed_bytes"],
                    "verified": report["verified"],
                    "calls": calls,
                    "bytes": pulled,
                    "exit_code": report["exit_code"],
                }
        results.update(best)
        m = results["mirror"]
        results["overhead_ratio"] = round(
            m["before_verify_seconds"] / results["rclone_copy"]["seconds"] - 1, 3
        )
        results["own_overhead_ratio"] = round(m["own_seconds"] / m["copy_seconds"], 3)

        # 3. verification throughput on larger objects
        if large:
            gcs.create_bucket("large")
            seconds, report = mirror(env, "b2:src/large", "gs://large/v", work)
            results["large"] = {
                "objects": large,
                "mb_each": large_mb,
                "verify_seconds": report["verify_seconds"],
                "hashed_bytes": report["hashed_bytes"],
            }

        # 4. second runs over the unchanged source
        plain = f"gcs:{results.pop('plain_bucket')}/v3"
        copy_cmd = [rclone, "copy", "--fast-list", *flags, "b2:src/v3", plain]
        count = Counter(b2)
        seconds, _ = timed(copy_cmd, env)
        calls, pulled = count.delta()
        results["rclone_copy_again"] = {
            "seconds": round(seconds, 2),
            "calls": calls,
            "bytes": pulled,
        }
        count = Counter(b2)
        seconds, report = mirror(env, "b2:src/v3", f"gs://{results.pop('mirror_bucket')}/v3", work)
        calls, pulled = count.delta()
        results["mirror_again"] = {
            "seconds": round(seconds, 2),
            "calls": calls,
            "bytes": pulled,
            "copied_bytes": report["copied_bytes"],
            "in_sync": report["plan"]["in_sync"],
        }
    return results


def _mbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:,.1f} MB/s" if seconds else "-"


def print_table(r: dict[str, Any], console: Console) -> None:
    t = Table(title=f"mirror bench: {r['objects']:,} objects in {r['folders']:,} folders, "
              f"{r['bytes'] / 1e6:,.1f} MB (B2 double -> fake-gcs-server, loopback)")  # fmt: skip
    t.add_column("measure")
    t.add_column("plain rclone", justify="right")
    t.add_column("octstage mirror", justify="right")
    t.add_column("note")
    fl, pf = r["list_fast_list"], r["list_per_folder"]
    t.add_row("list source: calls", f"{pf['calls']:,} per folder", f"{fl['calls']:,} --fast-list",
              "mirror always uses --fast-list")  # fmt: skip
    t.add_row("list source: seconds", f"{pf['seconds']:.1f}", f"{fl['seconds']:.1f}",
              f"{pf['seconds'] / fl['seconds']:.1f}x faster")  # fmt: skip
    rc, m = r["rclone_copy"], r["mirror"]
    t.add_row("first copy: seconds", f"{rc['seconds']:.1f}", f"{m['before_verify_seconds']:.1f}",
              "mirror without its verification phase")  # fmt: skip
    t.add_row("  overhead before verification", "", f"{100 * r['overhead_ratio']:+.1f} %",
              "vs plain rclone copy; target < +10 %")  # fmt: skip
    t.add_row("  own time / its rclone copy", "", f"{100 * r['own_overhead_ratio']:.1f} %",
              f"{m['own_seconds']:.1f} s start-up, inventory, plan; same run")  # fmt: skip
    listing = m["inventory_seconds"] + m["plan_seconds"]
    t.add_row("  of which inventory + plan", "", f"{listing:.1f}",
              "b2sdk listing, GCS listing (seconds)")  # fmt: skip
    t.add_row("  B2 list calls", f"{rc['calls']}", f"{m['calls']}", "inventory listing adds these")
    t.add_row("  bytes from B2", f"{rc['bytes'] / 1e6:,.1f} MB", f"{m['bytes'] / 1e6:,.1f} MB", "")
    t.add_row("verification: seconds", "none", f"{m['verify_seconds']:.1f}",
              f"{m['verified']:,} objects hashed at the destination")  # fmt: skip
    t.add_row("verification: tiny objects", "", _mbps(m["hashed_bytes"], m["verify_seconds"]),
              "per-object latency bound")  # fmt: skip
    if "large" in r:
        lg = r["large"]
        t.add_row(f"verification: {lg['objects']} x {lg['mb_each']} MB", "",
                  _mbps(lg["hashed_bytes"], lg["verify_seconds"]), "streamed SHA1")  # fmt: skip
    ra, ma = r["rclone_copy_again"], r["mirror_again"]
    t.add_row("second run: seconds", f"{ra['seconds']:.1f}", f"{ma['seconds']:.1f}",
              "unchanged source")  # fmt: skip
    t.add_row("second run: bytes from B2", f"{ra['bytes']:,}", f"{ma['bytes']:,}",
              f"mirror: {ma['in_sync']:,} already verified, no rclone run")  # fmt: skip
    t.add_row("total (first run)", f"{rc['seconds']:.1f}", f"{m['seconds']:.1f}",
              "mirror includes verifying every object")  # fmt: skip
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=1000, help="tiny objects (25000: full size)")
    p.add_argument("--large", type=int, default=4, help="larger objects for hashing throughput")
    p.add_argument("--large-mb", type=int, default=16, help="size of each larger object (MB)")
    p.add_argument("--transfers", type=int, default=32)
    p.add_argument("--checkers", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2, help="first copies to run; the best counts")
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args(argv)
    results = run(a.objects, a.large, a.large_mb, a.transfers, a.checkers, a.repeat)
    print_table(results, Console(width=120))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
