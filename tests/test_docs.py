"""The documentation's promises: a short README that links every page, the exit-code page
generated from the code's tables, and no README, docs/ page, preset or ``--help`` naming an exit
code that the code does not use for the cause it names."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octstage.cli.parser import EXIT_CODES as OCTSTAGE_CODES
from octstage.cli.parser import build_parser as octstage_parser
from octtrain import exitcodes
from octtrain.cli import build_parser as octtrain_parser

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200

# "exit 4", "exits 2", "exit code 5", "with exit\n code 5", "(exit 1)": the number is the code.
MENTION = re.compile(
    r"\bexit(?:s|ed|ing)?(?:\s+with)?(?:\s+the\s+same)?(?:\s+(?:code|status))?\s+\(?(\d+)\b", re.I
)
# A mention whose clause holds one of these is about octstage (a command, or staging's own words).
OCTSTAGE_WORDS = re.compile(
    r"\boctstage\b|\b("
    + "|".join(re.escape(c) for c in OCTSTAGE_CODES)
    + r")\b|reject|\bsha1\b|\bb2\b|\bs3\b|rclone|\btiff?\b|\bplates?\b|\bdicom\b|bucket",
    re.I,
)
BEFORE, AFTER = 200, 80  # characters of context looked at around a mention
# A clause ends at a sentence's end, a table cell or a blank line (before the mention), and also
# at a comma or semicolon after it: the cause is named before the code, or right after it.
BOUNDARY_BEFORE = re.compile(r"\.\s|\||\n\s*\n")
BOUNDARY_AFTER = re.compile(r"\.\s|\||\n\s*\n|[,;]")


def octstage_codes(command: str | None) -> set[int]:
    blocks = [OCTSTAGE_CODES[command]] if command else list(OCTSTAGE_CODES.values())
    found = {int(c) for text in blocks for c in re.findall(r"^\s+(\d+)\s", text, re.M)}
    return found | {130}  # every octstage command exits 130 on Ctrl-C


def clause(text: str, match: re.Match[str]) -> tuple[str, str]:
    """The text of the mention's clause before its number and after it."""
    before = text[max(0, match.start() - BEFORE) : match.start()]
    cuts = list(BOUNDARY_BEFORE.finditer(before))
    before = before[cuts[-1].end() :] if cuts else before
    after = text[match.end() : match.end() + AFTER]
    cut = BOUNDARY_AFTER.search(after)
    return before, after[: cut.start()] if cut else after


def nearest_row(before: str, after: str) -> exitcodes.ExitCode | None:
    """The table row whose keyword stands nearest before the code, else nearest after it."""
    for part, reverse in ((before, True), (after, False)):
        best: tuple[int, exitcodes.ExitCode] | None = None
        low = part.lower()
        for row in exitcodes.TABLE:
            for word in row.keywords:
                for m in re.finditer(re.escape(word), low):
                    distance = len(low) - m.end() if reverse else m.start()
                    if best is None or distance < best[0]:
                        best = (distance, row)
        if best is not None:
            return best[1]
    return None


def verdict(text: str, match: re.Match[str]) -> str | None:
    """None when the mention agrees with the tables, else why not."""
    code = int(match.group(1))
    before, after = clause(text, match)
    for part in (before, after):
        found = list(OCTSTAGE_WORDS.finditer(part))
        if found:
            command = (found[-1] if part is before else found[0]).group(1)
            allowed = octstage_codes(command)
            where = f"octstage {command}" if command else "octstage"
            return None if code in allowed else f"{where} never exits {code}"
    line = text[text.rfind("\n", 0, match.start()) + 1 : match.start()]
    if line.startswith("|"):  # a table row: its first cell names what the row is about
        found = list(OCTSTAGE_WORDS.finditer(line.split("|")[1]))
        if found:
            command = found[0].group(1)
            allowed = octstage_codes(command)
            return None if code in allowed else f"octstage {command or ''} never exits {code}"
    row = nearest_row(before, after)
    if row is None:
        codes = {r.code for r in exitcodes.TABLE}
        return None if code in codes else f"octtrain never exits {code}"
    return None if row.code == code else f"octtrain exits {row.code} for {row.cause}, not {code}"


def mentions(text: str) -> list[tuple[int, str, str]]:
    """(line, the mention in context, what is wrong) for every wrong mention in ``text``."""
    wrong = []
    for match in MENTION.finditer(text):
        why = verdict(text, match)
        if why:
            line = text.count("\n", 0, match.start()) + 1
            context = " ".join(text[max(0, match.start() - 80) : match.end() + 40].split())
            wrong.append((line, context, why))
    return wrong


def documents() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return found + sorted((ROOT / "configs").rglob("*.yaml"))


def helps() -> dict[str, str]:
    out = {}
    for name, parser in (("octtrain", octtrain_parser()), ("octstage", octstage_parser())):
        out[f"{name} --help"] = parser.format_help()
        sub = next(a for a in parser._actions if a.dest == "command")
        for command, p in sub.choices.items():  # type: ignore[union-attr]
            out[f"{name} {command} --help"] = p.format_help()
    return out


def test_every_exit_code_mention_in_docs_presets_and_help_matches_the_tables() -> None:
    wrong = []
    for path in documents():
        for line, context, why in mentions(path.read_text(encoding="utf-8")):
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {why}: ...{context}...")
    assert not wrong, "\n".join(wrong)
    checked = sum(len(MENTION.findall(p.read_text(encoding="utf-8"))) for p in documents())
    assert checked >= 15  # the checker reads the mentions, not an empty set


def test_every_help_lists_exactly_its_table() -> None:
    octtrain_codes = {row.code for row in exitcodes.TABLE}
    for name, text in helps().items():
        if name == "octstage --help":
            continue  # the top level lists the commands; each command's help lists its codes
        section = text.split("exit codes:", 1)[1]
        listed = {int(c) for c in re.findall(r"^\s+(\d+)\s", section, re.M)}
        if name.startswith("octtrain"):
            assert listed == octtrain_codes, name
        else:
            command = name.split()[1]
            if command != "--help":
                assert listed | {130} == octstage_codes(command), name


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("a data failure exits 2 on every host", True),  # the README before issue 30
        ("(its peer gone) ends with exit 4 instead of holding the pod: the watchdog", True),
        ("the stall watchdog ends the run with exit 5", False),
        ("a bad volume is a data error (exit 4)", False),
        ("octstage build-cache exits 3 when the disk fills up", False),
        ("octstage verify exits 3 on a missing volume", True),
        ("stopped on a non-finite loss (exit 3)", False),
    ],
)
def test_the_checker_catches_a_code_named_for_the_wrong_cause(text: str, wrong: bool) -> None:
    assert bool(mentions(text)) == wrong


def test_the_exit_code_page_is_generated_from_the_tables() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "exit_codes_page.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


README_LINKS = (
    "tpu-runbook",
    "ai-readi",
    "cell-painting",
    "benchmarks",
    "module-map",
    "exit-codes",
)


def test_the_readme_is_short_and_every_page_is_navigable() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < README_MAX_LINES
    assert "make demo" in readme and "make test" in readme
    for page in README_LINKS:  # the runbook, the two data kinds, the benchmarks, the map...
        assert f"](docs/{page}.md)" in readme, f"the README does not link docs/{page}.md"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f" {page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"


def test_the_runbook_launches_detached_with_per_host_logs_and_says_how_to_stop() -> None:
    runbook = (ROOT / "docs" / "tpu-runbook.md").read_text(encoding="utf-8")
    assert "scripts/pod-run.sh" in runbook and "tmux send-keys -t train C-c" in runbook
    assert "$(hostname).log" in (ROOT / "scripts" / "pod-run.sh").read_text(encoding="utf-8")
    assert "## Where the cache lives" in runbook and "## The first hour" in runbook


def test_pod_run_starts_a_command_that_outlives_its_shell(tmp_path: Path) -> None:
    """The launcher returns at once; the command goes on, logs to logs/RUN-<host>.log and
    writes its exit code as the log's last line."""
    script = ROOT / "scripts" / "pod-run.sh"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMUX_TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(script), "t", "bash", "-c", "sleep 1; echo trained; exit 3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    logs = tmp_path / "logs"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = list(logs.glob("t-*.log"))
        if found and "exit code" in found[0].read_text():
            break
        time.sleep(0.2)
    assert len(found) == 1 and found[0].read_text().splitlines()[-2:] == ["trained", "exit code 3"]
