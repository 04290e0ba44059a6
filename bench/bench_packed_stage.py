"""Claim: a packed Cell Painting cache (``build-cache --pack K``) is under 0.05 objects per field
where the per-field form is 3, and ``octstage stage`` pulls it from an object store in a
fraction of the per-field form's time (one request per object: the object count is the cost).

A synthetic cache of ``--items`` fields (5x64x64, one chunk each, in plates of 3,456 fields:
JUMP's 384 wells x 9 sites) in both forms, side by side in one run: the per-field form (an
OME-Zarr group per field: group ``zarr.json``, array ``zarr.json``, one shard) and the packed
form (``--pack`` fields per array: ``zarr.json`` and one shard; each plate's fields in
``packstore.plan_packs``' near-equal packs). Every field's objects are copies of one field
encoded by octstage's own writers (``fieldstore.encode_field``; ``fieldwriter.PackWriter`` for a
pack of each size), under names of their own, and the manifest (columnar form) lists each field
with its own id, cache key and source files. Per form it prints the objects per item (data
objects and the manifest's two files, over the items), then, per double, the wall time of
``octstage stage`` (``--transfers`` threads, every field's checksum verified) into an empty
folder, the objects fetched per second and the stage's peak RSS (each command runs as its
console script does, in a child process of its own: its ``VmHWM``, read by itself at its
end); with ``--verify``, ``octstage verify`` of the staged copy likewise (every row against
the schema, every field's checksum). ``--doubles local`` serves the objects from a local
folder instead: what staging and verifying a million items cost without an object store's
per-request price.

The doubles are the test suite's: the S3 double (moto, ``tests/doubles/s3.py``) in a child
process of its own (it would share this process's GIL with stage's threads), its objects put
straight into moto's in-memory backend; the GCS double (fake-gcs-server, ``tests/doubles/
gcs.py``, filesystem backend), its objects written into its folder with the metadata it keeps
beside each (an upload through HTTP takes 3 ms an object: 300,000 would take 15 minutes before
any staging). Both serve every request over real HTTP to octstage's own storage backends.

    nice -n 10 python bench/bench_packed_stage.py [--items 100000] [--pack 64] [--transfers 16]
        [--doubles s3,gcs,local] [--forms per-field,packed] [--per-field-items N] [--verify]

Measured (bench/results/packed-stage.log, final code; ``--items 100000 --per-field-items
10000``, 2 cores, another bench beside it): per field 3.0002 objects per item, staged at 37
fields/s from S3 (272.7 s for 10,000) and 59 from GCS (168.6 s); packed 0.0313 objects per
item, 1,530 fields/s from S3 (65.4 s for 100,000) and 1,795 from GCS (55.7 s). A million packed
fields from a local folder (bench/results/packed-stage-1m*.log): stage 377.2 s, peak 598 MB;
verify 171.9 s, peak 544 MB (packed-stage-1m-verify.log, on a more loaded machine; 1,205.1 s
and 560 MB before the rows were checked on typed columns and packs read from their shards).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from octstage import manifest as mf  # noqa: E402
from octstage.cache.store import CacheStore  # noqa: E402
from octstage.cellpainting import fieldstore, packstore  # noqa: E402
from octstage.cellpainting.fieldwriter import PackWriter  # noqa: E402

PLATE = 3456  # fields of a JUMP plate: 384 wells x 9 sites
CHANNELS = mf.CELLPAINTING_CHANNELS
SIZE = 64
BUCKET = "bench-packed"

Objects = list[tuple[str, bytes]]


def _field() -> np.ndarray:
    """One field's values: smooth per channel (it compresses as a real field's chunk would)."""
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    return np.stack([((y * (c + 1) + x) % 256).astype(np.uint8) for c in range(len(CHANNELS))])


def _record(n: int, zarr_path: str, slot: int | None, checksum: str, plate: str) -> mf.Field:
    norm = mf.Normalization(0.1, 99.9, 0.0, 1.0)
    well, site = divmod(n % PLATE, 9)
    key = hashlib.sha256(str(n).encode()).hexdigest()[:32]
    return mf.Field(
        item_id=f"source_0/{plate}/W{well:03d}/{site}",
        split="train",
        label=None,
        zarr_path=zarr_path,
        shape=(len(CHANNELS), SIZE, SIZE),
        dtype="uint8",
        checksum=checksum,
        cache_key=key,
        sources=tuple(
            mf.ChannelSource(c, f"images/{plate}/{n}-{c}.tiff", "0" * 40, 1) for c in CHANNELS
        ),
        source="source_0",
        batch="b",
        plate=plate,
        well=f"A{well % 100:02d}",
        site=site,
        channels=CHANNELS,
        perturbation="",
        perturbation_type="",
        is_control=False,
        normalization=(norm,) * len(CHANNELS),
        pack_index=slot,
    )


def _plates(items: int) -> Iterator[tuple[str, range]]:
    for start in range(0, items, PLATE):
        yield f"P{start // PLATE:04d}", range(start, min(items, start + PLATE))


def per_field(items: int, work: Path) -> tuple[list[mf.Field], dict[str, Objects], list[str]]:
    """The per-field form: records, the one field's objects (template "f"), object names."""
    array = _field()
    checksum = "sha256:" + hashlib.sha256(array.tobytes()).hexdigest()
    template = fieldstore.encode_field("x.ome.zarr", array, CHANNELS, {"item_id": "x"})
    fields, names = [], []
    for plate, rows in _plates(items):
        for n in rows:
            rel = fieldstore.field_relpath(plate, f"{n:08d}")
            fields.append(_record(n, rel, None, checksum, plate))
            names.append(rel)
    return fields, {"f": template}, names


def packed(
    items: int, pack: int, work: Path
) -> tuple[list[mf.Field], dict[str, Objects], list[tuple[str, str]]]:
    """The packed form: records, one pack's objects per pack size, (pack, size) names."""
    array = _field()
    checksum = "sha256:" + hashlib.sha256(array.tobytes()).hexdigest()
    templates: dict[str, Objects] = {}
    fields, names = [], []
    for plate, rows in _plates(items):
        for members in packstore.plan_packs(len(rows), pack):
            size = str(len(members))
            if size not in templates:
                templates[size] = _pack_objects(len(members), array, work / f"t{size}")
            rel = packstore.pack_relpath(plate, f"{plate}-{members.start:06d}")
            for slot, i in enumerate(members):
                fields.append(_record(rows[i], rel, slot, checksum, plate))
            names.append((rel, size))
    return fields, templates, names


def _pack_objects(size: int, array: np.ndarray, folder: Path) -> Objects:
    writer = PackWriter(CacheStore(str(folder)), "t", 64, 3, size)
    keys = [f"k{i}" for i in range(size)]
    writer.plan(keys)
    rel = ""
    for k in keys:
        rel = writer.write(k, k, array, CHANNELS).zarr_path
    writer.close()
    base = folder / rel
    return [
        (p.relative_to(base).as_posix(), p.read_bytes())
        for p in sorted(base.rglob("*"))
        if p.is_file()
    ]


def manifest_files(fields: list[mf.Field], folder: Path) -> list[tuple[str, bytes]]:
    plates = len({f.plate for f in fields})
    counts = {"fields": len(fields), "plates": plates, "rejected": 0}  # verify checks them
    header = mf.Header("bench", "2026-01-01T00:00:00Z", "bench", mf.CACHE_VERSION, "0", {}, counts)
    m = mf.Manifest(header, (), (), (), kind="cellpainting", fields=tuple(fields))
    folder.mkdir(parents=True, exist_ok=True)
    mf.write(m, folder / "manifest.json", "table")
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir())]


def objects(
    form: str, names: list[Any], templates: dict[str, Objects]
) -> Iterator[tuple[str, bytes]]:
    """Every data object of a form: (name in the cache, bytes)."""
    for entry in names:
        rel, tid = (entry, "f") if form == "per-field" else entry
        for key, data in templates[tid]:
            yield f"{rel}/{key}", data


# ---- the S3 double in a child process ------------------------------------------------------


def _s3_child(conn: Any, source: str) -> None:
    """Start moto, put the objects listed in ``source`` (a pickle) into its backend, report the
    port, serve until told to stop."""
    import pickle

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    from tests.doubles.s3 import S3Double

    double = S3Double().start()
    os.environ.update(double.env())
    double.create_bucket(BUCKET)
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    with open(source, "rb") as f:
        listing = pickle.load(f)
    for name, data in listing:
        backend.put_object(BUCKET, name, data)
    conn.send(double.env())
    conn.recv()  # stop
    double.stop()


@contextmanager
def s3_serving(listing: list[tuple[str, bytes]], work: Path) -> Iterator[dict[str, str]]:
    import pickle

    source = work / "s3-listing.pickle"
    with open(source, "wb") as f:
        pickle.dump(listing, f)
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_s3_child, args=(child, str(source)))
    proc.start()
    try:
        env = parent.recv()
        source.unlink()
        yield env
    finally:
        parent.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.kill()


@contextmanager
def gcs_serving(listing: list[tuple[str, bytes]], _work: Path) -> Iterator[dict[str, str]]:
    from tests.doubles.gcs import GcsDouble

    with GcsDouble() as double:
        double.create_bucket(BUCKET)
        assert double._tmp is not None
        root = Path(double._tmp.name) / BUCKET
        meta_of: dict[bytes, bytes] = {}
        for name, data in listing:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if data not in meta_of:
                meta_of[data] = _gcs_metadata(data)
            os.setxattr(path, "user.metadata", meta_of[data])
        yield double.env()


def _gcs_metadata(data: bytes) -> bytes:
    """What fake-gcs-server's filesystem backend keeps beside an object (as it writes it)."""
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    crc = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    return json.dumps(
        {
            "StorageClass": "STANDARD",
            "ContentType": "application/octet-stream",
            "ContentEncoding": "",
            "ContentDisposition": "",
            "ContentLanguage": "",
            "CacheControl": "",
            "Crc32c": crc,
            "Md5Hash": md5,
            "Etag": md5,
            "ACL": [],
            "Metadata": None,
            "Created": now,
            "Deleted": "0001-01-01T00:00:00Z",
            "Updated": now,
            "CustomTime": "0001-01-01T00:00:00Z",
            "Generation": time.time_ns() // 1000,
            "RetentionMode": "",
            "RetentionRetainUntil": "",
        }
    ).encode()


@contextmanager
def local_serving(listing: list[tuple[str, bytes]], work: Path) -> Iterator[dict[str, str]]:
    """The objects as files in a local folder (``stage``'s folder source): what the object
    stores' request costs hide, staging's own work and memory."""
    root = work / "local-source"
    for name, data in listing:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    try:
        yield {}
    finally:
        shutil.rmtree(root, ignore_errors=True)


# The child's own peak, read by itself at its end: ``ru_maxrss`` of a child (``wait4``) starts
# at its parent's peak (Linux keeps the high-water mark of the address space it had before
# ``exec``), and this bench's process holds every field's record: it would report the bench.
CHILD = """import os, sys
from octstage.cli import main
try:
    rc = main()
finally:
    peak = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    with open(os.environ["BENCH_PEAK_FILE"], "w") as f:
        f.write(peak.split()[1])
sys.exit(rc)
"""


def timed_command(args: list[str], env: dict[str, str], work: Path) -> tuple[float, int, float]:
    """``octstage ARGS`` as its console script runs it, in a child process of its own:
    (seconds, exit code, the child's peak RSS in MB: its ``VmHWM``). Progress lines pass
    through."""
    peak = work / "peak.txt"
    started = time.monotonic()
    rc = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        env={**os.environ, **env, "PYTHONPATH": str(ROOT), "BENCH_PEAK_FILE": str(peak)},
        stdout=subprocess.DEVNULL,
        check=False,
    ).returncode
    seconds = time.monotonic() - started
    return seconds, rc, int(peak.read_text()) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--pack", type=int, default=packstore.DEFAULT_PACK)
    ap.add_argument("--transfers", type=int, default=16)
    ap.add_argument("--doubles", default="s3,gcs", help="s3, gcs and/or local (a folder)")
    ap.add_argument(
        "--verify", action="store_true", help="also time `octstage verify` of each staged copy"
    )
    ap.add_argument("--forms", default="per-field,packed")
    ap.add_argument(
        "--per-field-items",
        type=int,
        default=0,
        help="fields of the per-field form's cache, when fewer than --items (it stages at ~20-50 "
        "fields/s from the doubles on 2 shared cores: 100,000 would take 35-80 minutes a double)",
    )
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-packed-"))
    rows = []
    try:
        for form in a.forms.split(","):
            t = time.monotonic()
            items = a.per_field_items or a.items if form == "per-field" else a.items
            if form == "per-field":
                fields, templates, names = per_field(items, work)
            else:
                fields, templates, names = packed(items, a.pack, work)  # type: ignore[assignment]
            man = manifest_files(fields, work / f"manifest-{form}")
            del fields
            listing = list(objects(form, names, templates)) + man
            data_objects = len(listing) - len(man)
            per_item = len(listing) / items
            print(
                f"{form:>9}: {items:,} fields, {data_objects:,} data objects + "
                f"{len(man)} manifest files = {per_item:.4f} objects per item "
                f"({sum(len(d) for _, d in listing) / 1e6:,.1f} MB; prepared in "
                f"{time.monotonic() - t:.1f} s)",
                flush=True,
            )
            for double in a.doubles.split(","):
                serving = {"s3": s3_serving, "gcs": gcs_serving, "local": local_serving}[double]
                dst = work / f"staged-{form}-{double}"
                with serving(listing, work) as env:
                    src = {"s3": f"s3://{BUCKET}", "gcs": f"gs://{BUCKET}"}.get(
                        double, str(work / "local-source")
                    )
                    stage = ["stage", src, str(dst), "--transfers", str(a.transfers)]
                    stage += ["--progress-seconds", "60"]
                    seconds, rc, rss = timed_command(stage, env, work)
                rate = data_objects / seconds
                row = [form, items, double, per_item, seconds, rc, rss, None, None, None]
                print(
                    f"{form:>9} from {double}: stage {seconds:,.1f} s (exit {rc}), "
                    f"{rate:,.0f} objects/s, {items / seconds:,.0f} fields/s, "
                    f"peak RSS {rss:,.0f} MB",
                    flush=True,
                )
                if a.verify:
                    verify = ["verify", str(dst / "manifest.json"), "--progress-seconds", "60"]
                    row[7:] = timed_command(verify, {}, work)
                    print(
                        f"{form:>9} verify of the staged copy: {row[7]:,.1f} s (exit {row[8]}), "
                        f"{items / row[7]:,.0f} fields/s, peak RSS {row[9]:,.0f} MB",
                        flush=True,
                    )
                shutil.rmtree(dst, ignore_errors=True)
                rows.append(tuple(row))
            del listing
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n--pack {a.pack}, {a.transfers} transfers; MB: the command's peak RSS (VmHWM)")
    print(
        f"{'form':>9} {'fields':>9} {'double':>6} {'objects/item':>13} {'stage s':>9} "
        f"{'fields/s':>9} {'exit':>5} {'stage MB':>9} {'verify s':>9} {'exit':>5} {'verify MB':>9}"
    )
    for form, items, double, per_item, seconds, rc, rss, vs, vrc, vrss in rows:
        verified = (
            f"{vs:>9.1f} {vrc:>5} {vrss:>9,.0f}"
            if vs is not None
            else f"{'-':>9} {'-':>5} {'-':>9}"
        )
        print(
            f"{form:>9} {items:>9,} {double:>6} {per_item:>13.4f} {seconds:>9.1f} "
            f"{items / seconds:>9,.0f} {rc:>5} {rss:>9,.0f} {verified}"
        )


if __name__ == "__main__":
    main()
