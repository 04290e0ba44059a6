"""The plate bench's peak RSS is the build's own: a child's ``ru_maxrss`` starts at its parent's
peak on Linux (the address space before ``exec`` is the forked parent's), which made a build
look ~21 KB a field larger whenever the bench had made a larger plate first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc only")
def test_a_child_reports_its_own_peak_not_its_parents() -> None:
    ballast = bytearray(400 * MIB)
    ballast[::4096] = b"\1" * len(range(0, len(ballast), 4096))  # resident, not just reserved
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
        "from bench_jump_plate import _peak_rss; print(_peak_rss())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    del ballast
    assert int(out.stdout) < 300 * MIB, int(out.stdout) // MIB
