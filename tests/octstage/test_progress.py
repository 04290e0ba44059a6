"""Progress in logs: every long command prints plain lines when stderr is no terminal."""

from __future__ import annotations

import io
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from rich.console import Console

from octstage.cli import main
from octstage.errors import ConfigError
from octstage.progress import counter, interval
from tests.octtrain.tiny_cache import write_tiny_cache


def counts(text: str, label: str) -> list[tuple[int, int]]:
    """(done, total) of every plain progress line of ``label`` in ``text``."""
    found = re.findall(rf"^{re.escape(label)}: (\d+)/(\d+) \(\d+%\)", text, flags=re.M)
    return [(int(done), int(total)) for done, total in found]


def test_counter_prints_one_line_per_item_from_many_threads_in_order() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=80)
    with counter(console, "job", 200, 0.0) as advance, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: advance("detail"), range(200)))
    assert counts(out.getvalue(), "job") == [(n, 200) for n in range(1, 201)]
    assert out.getvalue().splitlines()[-1].startswith("job: 200/200 (100%), detail, ")


def test_counter_prints_only_the_last_line_within_its_interval() -> None:
    out = io.StringIO()
    with counter(Console(file=out, force_terminal=False), "job", 5, 3600.0) as advance:
        for _ in range(5):
            advance("")
    assert counts(out.getvalue(), "job") == [(5, 5)]


def test_counter_draws_a_bar_on_a_terminal_and_no_lines() -> None:
    out = io.StringIO()
    with counter(Console(file=out, force_terminal=True), "job", 3, 0.0) as advance:
        for _ in range(3):
            advance("")
    assert counts(out.getvalue(), "job") == []


def test_a_bad_interval_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCTSTAGE_PROGRESS_SECONDS", "soon")
    with pytest.raises(ConfigError, match="OCTSTAGE_PROGRESS_SECONDS"):
        interval()
    with pytest.raises(ConfigError, match="--progress-seconds"):
        interval(-1.0)


def test_audit_stage_and_verify_print_progress_lines_into_a_log(
    synth_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Captured stderr is no terminal, as in a batch job: rich's bars would print nothing there.
    (build-cache and mirror: test_build_resume.py and test_mirror.py.)"""
    labels = str(synth_root / "participants.tsv")
    args = ["--progress-seconds", "0"]
    assert main(["audit-ids", "--labels", labels, "--oct", str(synth_root), *args]) == 0
    lines = counts(capsys.readouterr().err, "audit-ids")
    assert len(lines) > 100 and lines == [(n, len(lines)) for n in range(1, len(lines) + 1)]

    _manifest, cache = write_tiny_cache(tmp_path / "tiny", shape=(8, 32, 32))
    volumes = len(list((cache / "volumes").iterdir()))
    ssd = tmp_path / "ssd"
    assert main(["stage", str(cache), str(ssd), *args]) == 0
    err = capsys.readouterr().err
    assert counts(err, "stage") == [(n, volumes) for n in range(1, volumes + 1)]
    assert f"stage: {volumes}/{volumes} (100%), {volumes} downloaded, 0 present" in err

    assert main(["verify", str(ssd / "manifest.json"), *args]) == 0
    err = capsys.readouterr().err
    assert counts(err, "verify") == [(n, volumes) for n in range(1, volumes + 1)]
    assert f"verify: {volumes}/{volumes} (100%), {volumes} verified, 0 missing" in err
