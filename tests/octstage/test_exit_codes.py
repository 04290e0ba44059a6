"""Exit codes a script can rely on: each subcommand documents its own in --help, and
build-cache tells clean, expected exclusions, retryable gaps and failure apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from octstage import manifest as mf
from octstage.build import exit_code
from octstage.cli import build_parser, main
from tests.octstage.build_helpers import Built, build, copy_cache

SUBCOMMANDS = ("synth", "audit-ids", "build-cache", "verify", "mirror", "stage")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_documents_its_exit_codes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    codes = text[text.index("exit codes:") :]
    assert "  0  " in codes and "  2  refused or failed" in codes
    # The help's line breaks are kept (RawDescriptionHelpFormatter), one code per line.
    assert codes.count("\n  2  ") == 1
    if command == "build-cache":
        assert "  1  " in codes and "  3  " in codes and "--max-reject-share" in codes


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
    import octstage.synth

    def crash(*args: object, **kwargs: object) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(octstage.synth, "run_synth", crash)
    assert main(["synth", str(tmp_path / "x")]) == 2
    assert "unexpected RuntimeError: boom" in capsys.readouterr().err
