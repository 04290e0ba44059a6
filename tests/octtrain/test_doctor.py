"""``octtrain doctor`` on one process, and the comparison it makes between hosts (the 2-host
runs are in test_pod.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from octtrain.cli import main
from octtrain.train.doctor import AGREED, disagreements

TINY = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "tiny.yaml"


def test_doctor_describes_this_host(
    tiny_cache: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--config", str(TINY), "--manifest", str(tiny_cache[0])]) == 0
    host, verdict = capsys.readouterr().out.splitlines()
    assert host.startswith("host 0 (") and "attention sdpa (auto on cpu)" in host
    assert re.search(r"cache (\d+)/\1 volumes sha256:", host)  # every volume's files present
    assert verdict == "doctor: every host agrees"


def test_a_refused_flash_length_shows_in_the_attention_field(
    tiny_cache: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["doctor", "--config", str(TINY), "--manifest", str(tiny_cache[0])]
    assert main([*args, "model.attention=flash"]) == 0  # every host refuses alike: they agree
    assert "attention refused: model.attention 'flash' needs" in capsys.readouterr().out


def test_disagreements_name_the_field_and_the_hosts() -> None:
    base = {k: "x" for k in AGREED}
    views = [{**base, "host": "0 (a)"}, {**base, "host": "1 (b)", "cache": "y"}]
    assert disagreements(views) == ["cache differs from host 0's on host(s) 1 (b)"]
    assert disagreements(views[:1]) == []
