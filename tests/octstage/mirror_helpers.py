"""Shared by the mirror tests: a seeded B2 double, one mirror run, the mirrored GCS objects."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from octstage.mirror.inventory import INVENTORY_NAME
from octstage.mirror.run import run_mirror
from tests.doubles.b2_server import B2Double
from tests.doubles.gcs import GcsDouble, client_for

REPO = Path(__file__).resolve().parents[2]
MTIME = 1_700_000_000_000
ODD_NAMES = [
    "odd/with space.dcm",
    "odd/quote'single\"double.dcm",
    "odd/ünïcödé/日本語.dcm",
    "odd/plus+and&$(echo x);.dcm",
]


def seed(b2: B2Double, prefix: str = "v3", participants: int = 4) -> dict[str, bytes]:
    """An AI-READI-like tree (plus odd names) in the B2 double; every third file a large file."""
    files: dict[str, bytes] = {"participants.tsv": b"participant_id\tstudy_group\n"}
    for n in range(participants):
        pid = ("1001", "4150", "7111", "1002", "4151", "7112")[n % 6]
        for eye in "lr":
            name = (
                f"retinal_oct/structural_oct/zeiss_cirrus/{pid}/{pid}_cirrus_mac_{eye}_1.2.{n}.dcm"
            )
            files[name] = os.urandom(3000 + 17 * n)
    for name in ODD_NAMES:
        files[name] = os.urandom(500)
    for i, (name, data) in enumerate(sorted(files.items())):
        b2.put("src", f"{prefix}/{name}", data, large=i % 3 == 0, mtime_ms=MTIME)
    return files


def gcs_objects(server: GcsDouble, bucket: str, prefix: str) -> dict[str, Any]:
    client: Any = client_for(server)
    return {b.name[len(prefix) + 1 :]: b for b in client.list_blobs(bucket, prefix=f"{prefix}/")}


def mirror(tmp_path: Path, src: str, dst: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"report-{time.monotonic_ns()}.json"
    code = run_mirror(src, dst, json_out=out, transfers=4, checkers=8, **kwargs)
    return code, json.loads(out.read_text())


def assert_mirrored(server: GcsDouble, bucket: str, files: dict[str, bytes]) -> None:
    blobs = gcs_objects(server, bucket, "m")
    assert set(blobs) == set(files) | {INVENTORY_NAME}
    for name, data in files.items():
        assert blobs[name].download_as_bytes() == data, name
        assert blobs[name].metadata["source-sha1"] == hashlib.sha1(data).hexdigest()


def cli_process(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[str]:
    """``python -m octstage.cli ARGS`` in the background, with ``env`` added."""
    return subprocess.Popen(
        [sys.executable, "-m", "octstage.cli", *args],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # so the test can kill octstage and its rclone together
        **kwargs,
    )
