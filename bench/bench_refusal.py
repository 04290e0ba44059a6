"""How long ``octstage`` and ``octtrain`` take to refuse a bad flag or setting (issue 20: under
a second).

Each command runs as a fresh subprocess, ``--repeat`` times; the median wall time is printed
beside baselines: a bare interpreter start, importing the build step (dask, zarr, pydicom...)
and importing torch, which is what a refusal cost when flags were checked inside the step.
Run from the repository root: ``python bench/bench_refusal.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def seconds(argv: list[str], repeat: int) -> float:
    """Median wall seconds of running ``argv`` (its exit code is not checked: refusals are 2)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=env, check=False)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        bad_yaml = Path(tmp) / "bad.yaml"
        bad_yaml.write_text("shape: 16\n")
        common = ["--source", tmp, "--labels", f"{tmp}/participants.tsv", "--out", f"{tmp}/c"]
        cli = [py, "-m", "octstage.cli", "build-cache", *common]
        tiny = str(REPO / "configs" / "pretrain" / "tiny.yaml")
        train = [py, "-m", "octtrain.cli", "pretrain", "--config", tiny, "--manifest", tmp]
        rows = [
            ("baseline: python -c pass", [py, "-c", "pass"]),
            (
                "baseline: import octstage.cachebuild.run",
                [py, "-c", "import octstage.cachebuild.run"],
            ),
            ("build-cache --workers -2", [*cli, "--workers", "-2"]),
            ("build-cache --config (shape: 16)", [*cli, "--config", str(bad_yaml)]),
            ("build-cache --max-reject-share 2", [*cli, "--max-reject-share", "2"]),
            ("baseline: import torch", [py, "-c", "import torch"]),
            ("octtrain pretrain train.max_stepz=1", [*train, "train.max_stepz=1"]),
            ("octtrain pretrain --bogus-flag", [*train, "--bogus-flag"]),
        ]
        for name, argv in rows:
            print(f"{name:40s} {seconds(argv, args.repeat):6.3f} s (median of {args.repeat})")


if __name__ == "__main__":
    main()
