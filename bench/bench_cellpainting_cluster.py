"""Claim: the Cell Painting build's plates spread over dask worker processes: fields/s per worker
from a folder and from the S3 double, and the scaling from 1 to 2 workers, beside the
one-process build (plates one after the other, the baseline), with the same manifest each time.

The twin (``octstage synth --kind cellpainting``: 5 channels of uncompressed 16-bit TIFFs at
``--size`` px, as the release's 1,080 px Phenix fields are, illumination functions, no traps) is
built into a fresh folder cache per run: in this process (``build``), and on a local dask
cluster of 1 and of 2 worker processes (``build(processes=N)``, one task per plate), each
reading a plate's fields with ``--threads`` threads. The S3 double is the test suite's (moto in
server mode, ``tests/doubles/s3.py``) in a child process of its own. Every run's manifest items
must equal the baseline's (checked: the bench stops otherwise).

Printed per run: wall seconds, fields/s, fields/s per worker process, the scaling over the
1-worker run, the machine's busy CPU seconds per field (``/proc/stat``: everything that ran,
the S3 double included; leave the machine quiet), and the bytes each field reads (its five
TIFFs, twice: once for the plate's percentiles, once to write it) and writes (the cache's bytes
per field): the planning figures ``docs/jump-release.md`` turns into a JUMP source's and
cpg0016's time on N machines.

    nice -n 10 python bench/bench_cellpainting_cluster.py [--size 1080] [--plates 4]
        [--sites 1] [--threads 2] [--sources folder,s3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.doubles, from a checkout

from octstage import manifest as mf
from octstage.cellpainting.build import build
from octstage.cellpainting.layout import PrefixMap
from octstage.cellpainting.synth import generate

BUCKET = "bench-cp-cluster"


def _s3_child(conn: Any) -> None:
    """Serve the S3 double until told to stop (its own process: its GIL is not the build's)."""
    from tests.doubles.s3 import S3Double

    double = S3Double().start()
    double.create_bucket(BUCKET)
    conn.send(double.env())
    conn.recv()
    double.stop()


@contextmanager
def s3_double() -> Iterator[dict[str, str]]:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_s3_child, args=(child,))
    proc.start()
    try:
        yield parent.recv()
    finally:
        parent.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def upload(root: Path, dataset: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        client.put_object(
            Bucket=BUCKET, Key=f"{dataset}/{path.relative_to(root)}", Body=path.read_bytes()
        )


def busy_cpu_seconds() -> float:
    """The machine's CPU seconds spent on anything but idling so far (``/proc/stat``): the
    driver's, the workers' and the S3 double's alike, on a machine left quiet for the bench."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def one_run(
    source: str, prefixes: PrefixMap, metadata: str, out: Path, processes: int, threads: int
) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    start, cpu = time.perf_counter(), busy_cpu_seconds()
    report, built = build(
        source,
        out,
        metadata=metadata,
        workers=threads,
        prefixes=prefixes,
        processes=processes,
        progress_seconds=3600,
    )
    wall, cpu = time.perf_counter() - start, busy_cpu_seconds() - cpu
    if report.environment or report.rejected:
        raise SystemExit(f"the build left fields out: {report.environment or report.rejected}")
    m = built.load()
    return {
        "wall": wall,
        "cpu": cpu,
        "fields": len(m.fields),
        "written": tree_bytes(out / "fields"),
        "read": 2 * sum(s.size for f in m.fields for s in f.sources),
        "items": m.fields,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1080, help="field side in px (real: ~1,080)")
    ap.add_argument("--plates", type=int, default=4)
    ap.add_argument("--sites", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="--workers: threads per plate")
    ap.add_argument("--sources", default="folder,s3", help="folder and/or s3")
    ap.add_argument("--workdir", type=Path, help="default: a temporary folder, removed")
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench-cp-cluster-"))
    try:
        twin = generate(
            work / "twin",
            plates=a.plates,
            sites=a.sites,
            size=a.size,
            traps=False,
            bucket=BUCKET,
            seed=5,
        )
        root = work / "twin" / twin.dataset
        metadata = str(work / "twin" / twin.metadata)
        load = os.getloadavg()[0]
        print(
            f"twin: {a.plates} plates, {twin.fields} fields of 5 x {a.size}^2 uint16 TIFFs "
            f"({tree_bytes(root) / 1e6:.0f} MB); --workers {a.threads} threads per plate; "
            f"{os.cpu_count()} CPUs, load {load:.1f}",
            flush=True,
        )
        print(
            f"{'source':<7} {'run':<22} {'fields':>6} {'wall s':>7} {'fields/s':>8} "
            f"{'/worker':>8} {'scaling':>7} {'CPU s/f':>7} {'MB read/f':>9} {'MB written/f':>12}",
            flush=True,
        )
        for kind in a.sources.split(","):
            with contextlib_for(kind) as env:
                os.environ.update(env)
                if kind == "s3":
                    upload(root, twin.dataset)
                url = f"s3://{BUCKET}/{twin.dataset}"
                source = str(root) if kind == "folder" else url
                # The tables name the bucket: a folder copy maps their URLs onto itself.
                prefixes = PrefixMap.parse([f"{url}/={root}/"] if kind == "folder" else [])
                base: list[mf.Field] | None = None
                one_worker = 0.0
                for label, processes in (
                    ("one process (baseline)", 0),
                    ("dask, 1 worker process", 1),
                    ("dask, 2 worker processes", 2),
                ):
                    r = one_run(source, prefixes, metadata, work / "cache", processes, a.threads)
                    if base is None:
                        base = r["items"]
                    elif r["items"] != base:
                        raise SystemExit(f"{label}: the manifest differs from the baseline's")
                    rate = r["fields"] / r["wall"]
                    one_worker = rate if processes == 1 else one_worker
                    scaling = f"{rate / one_worker:.2f}x" if processes == 2 else ""
                    print(
                        f"{kind:<7} {label:<22} {r['fields']:>6} {r['wall']:>7.1f} {rate:>8.2f} "
                        f"{rate / max(processes, 1):>8.2f} {scaling:>7} "
                        f"{r['cpu'] / r['fields']:>7.3f} "
                        f"{r['read'] / r['fields'] / 1e6:>9.1f} "
                        f"{r['written'] / r['fields'] / 1e6:>12.2f}",
                        flush=True,
                    )
        print("every run's manifest items equal the baseline's")
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


@contextmanager
def contextlib_for(kind: str) -> Iterator[dict[str, str]]:
    """The S3 double's environment while it serves, or nothing for a folder."""
    if kind == "s3":
        with s3_double() as env:
            yield env
    else:
        yield {}


if __name__ == "__main__":
    main()
