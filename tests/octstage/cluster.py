"""A dask cluster of separate processes, as on machines that share no disk with the driver.

The scheduler and each worker are ``dask`` CLI processes with their own working folder, temp dir
and HOME, and an environment stripped of every storage setting and credential: a worker can reach
a bucket only with what the build hands it. Their output is kept, so a test can check that no
credential reached a log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

WORKER_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "dask" / "worker.yaml"
# Everything that could let a worker reach a store on its own.
_ACCESS_PREFIXES = ("STORAGE_EMULATOR", "RCLONE_", "B2_", "AWS_", "OCTSTAGE_", "GOOGLE_")


@dataclass(frozen=True)
class Cluster:
    address: str
    worker_dirs: tuple[Path, ...]
    logs: tuple[Path, ...]

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def bare_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_ACCESS_PREFIXES)}
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), TMPDIR=str(tmp), RCLONE_CONFIG="/dev/null")
    env["DASK_CONFIG"] = str(WORKER_CONFIG)  # what the README tells users to start workers with
    return env


@contextmanager
def separate_cluster(base: Path, workers: int = 2) -> Iterator[Cluster]:
    """A scheduler and ``workers`` single-threaded workers, each its own process and folder."""
    dask = str(Path(sys.executable).parent / "dask")
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(name: str, args: list[str]) -> None:
        home = base / name
        home.mkdir(parents=True)
        log = base / f"{name}.log"
        logs.append(log)
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [dask, *args],
                    cwd=home,
                    env=bare_env(home),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    file = base / "scheduler.json"
    try:
        start(
            "scheduler",
            [
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(file),
            ],
        )
        deadline = time.monotonic() + 60
        while not file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError("dask scheduler did not start:\n" + logs[0].read_text())
            time.sleep(0.1)
        address = json.loads(file.read_text())["address"]
        dirs = []
        for n in range(workers):
            name = f"worker{n}"
            start(
                name,
                [
                    "worker",
                    address,
                    "--nthreads",
                    "1",
                    "--nworkers",
                    "1",
                    "--host",
                    "127.0.0.1",
                    "--no-dashboard",
                    "--local-directory",
                    str(base / name),
                ],
            )
            dirs.append(base / name)
        _wait_for_workers(address, workers)
        yield Cluster(address, tuple(dirs), tuple(logs))
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_for_workers(address: str, n: int) -> None:
    from dask.distributed import Client

    with Client(address, timeout="30s") as client:
        client.wait_for_workers(n, timeout=60)
