"""Claim: audit-ids reads headers only, so it costs a small, size-independent time per file.

Prints, side by side: header-only read vs full decode per transfer syntax (full-size
Spectralis volume), header scan of the default synthetic dataset with 1 vs 16 threads, and the
pure audit over 25,000 records (the size of the release the users work with).

    python bench/audit_ids.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydicom.uid import UID, ExplicitVRLittleEndian, JPEG2000Lossless, JPEGBaseline8Bit, RLELossless

from octstage.audit.core import audit, list_oct, read_headers
from octstage.dataset.dicom import read_header, read_volume
from octstage.dataset.labels import read_participants
from octstage.dataset.synth import generate
from octstage.dataset.synth_oct import render_retina, write_oct_dicom
from octstage.storage import LocalStorage


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-audit-"))

    print("header-only read vs full decode, 61x496x768 (Spectralis posterior pole)")
    vol = render_retina((61, 496, 768), 0.1, "R", np.random.default_rng(0))
    for ts in (ExplicitVRLittleEndian, RLELossless, JPEGBaseline8Bit, JPEG2000Lossless):
        path = work / f"full-{UID(ts).keyword}.dcm"
        write_oct_dicom(
            path, vol, patient_id="1001", laterality="R", transfer_syntax=ts,
            spacing_mm=(0.12, 0.0039, 0.0113), device="heidelberg_spectralis",
            sop_instance_uid="1.2.826.0.1.3680043.8.498.1.1001.1.10",
        )  # fmt: skip
        header = timed(lambda p=path: read_header(p, p.name), repeat=10)
        full = timed(lambda p=path: read_volume(p, p.name))
        print(
            f"  {UID(ts).name[:34]:34s} {path.stat().st_size / 1e6:6.1f} MB  header "
            f"{header * 1e3:6.1f} ms  decode {full * 1e3:8.0f} ms  ratio {full / header:6.0f}x"
        )

    info = generate(work / "synth")
    storage = LocalStorage(info.root)
    objects = list_oct(storage)
    print(f"header scan of the default synthetic dataset ({len(objects)} files, local disk)")
    for workers in (1, 16):
        t = timed(lambda w=workers: read_headers(storage, objects, workers=w))
        print(f"  workers {workers:2d}: {t:6.2f} s, {len(objects) / t:7.0f} files/s")

    participants, _ = read_participants(str(info.root / "participants.tsv"))
    records = read_headers(storage, objects)
    many = (records * (25_000 // len(records) + 1))[:25_000]  # same verdicts, 25,000 times
    t = timed(lambda: audit(participants, many))
    base = timed(lambda: audit(participants, records))
    print(
        f"pure audit: {len(records)} records {base * 1e3:.0f} ms, 25,000 records "
        f"{t * 1e3:.0f} ms ({t / base:.0f}x the time for {25_000 / len(records):.0f}x the files)"
    )
    print(f"(files in {work})")


if __name__ == "__main__":
    main()
