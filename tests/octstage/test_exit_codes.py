"""Exit codes a script can rely on: each subcommand documents its own in --help, and
build-cache tells clean, expected exclusions, retryable gaps and failure apart."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from octstage import manifest as mf
from octstage.cachebuild.run import exit_code
from octstage.cli import build_parser, main
from tests.octstage.build_helpers import Built, build, copy_cache

# The codes each subcommand's run_* can return: its --help must list exactly these.
# 130: Ctrl-C, one line, what was finished kept (every command).
CODES: dict[str, set[int]] = {
    "synth": {0, 2, 130},
    "audit-ids": {0, 1, 2, 130},
    "build-cache": {0, 1, 2, 3, 130},
    "verify": {0, 1, 2, 130},
    "mirror": {0, 1, 2, 130},
    "stage": {0, 1, 2, 130},
}


def _subcommands() -> list[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_the_exit_code_table_covers_every_subcommand() -> None:
    # A new subcommand must say what its codes are (here and in its --help).
    assert set(_subcommands()) == set(CODES)


@pytest.mark.parametrize("command", sorted(CODES))
def test_every_subcommand_documents_its_exit_codes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    codes = text[text.index("exit codes:") :]
    # The help's line breaks are kept (RawDescriptionHelpFormatter), one code per line.
    listed = [int(c) for c in re.findall(r"^  (\d+)  ", codes, flags=re.MULTILINE)]
    assert sorted(listed) == sorted(CODES[command])  # each once, none missing, none extra
    assert "\n  2  refused or failed" in codes
    if command == "build-cache":
        assert "--max-reject-share" in codes and "run the same command again" in codes
    if command == "mirror":  # the way out of exit 1 for objects without a source SHA1
        assert "--hash-missing" in codes
        assert "s3://" in text and "never by ETag" in " ".join(text.split())


def _stats(rejected: int = 0, environment: int = 0) -> dict[str, int]:
    return {"rejected": rejected, "environment": environment}


def test_build_exit_code_tells_the_outcomes_apart() -> None:
    assert exit_code(_stats(), listed=10, max_reject_share=None) == 0
    assert exit_code(_stats(rejected=2), listed=10, max_reject_share=None) == 1
    assert exit_code(_stats(rejected=3, environment=1), listed=10, max_reject_share=None) == 3
    assert exit_code(_stats(rejected=3, environment=1), listed=10, max_reject_share=0.2) == 2
    assert exit_code(_stats(rejected=2), listed=10, max_reject_share=0.2) == 1  # at the limit


def test_max_reject_share_turns_too_many_rejections_into_failure(
    built: Built, tmp_path: Path, scheduler: str
) -> None:
    cache = copy_cache(built, tmp_path / "cache")
    share = built.summary["rejected"] / (built.summary["rejected"] + built.summary["volumes"])
    code, _ = build(built.src, cache, scheduler=scheduler, max_reject_share=share)
    assert code == 1  # exactly the share allowed: still only expected exclusions
    (cache / "manifest.json").unlink()
    code, _ = build(built.src, cache, scheduler=scheduler, max_reject_share=share * 0.99)
    assert code == 2
    assert mf.load(cache / "manifest.json").volumes == built.manifest.volumes  # still written


def test_an_unexpected_crash_is_exit_2_not_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import octstage.dataset.synth

    def crash(*args: object, **kwargs: object) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(octstage.dataset.synth, "run_synth", crash)
    assert main(["synth", str(tmp_path / "x")]) == 2
    assert "unexpected RuntimeError: boom" in capsys.readouterr().err
