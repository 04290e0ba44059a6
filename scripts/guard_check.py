"""Guard check: single edits that remove or weaken one guard, each tried against its tests.

Every edit in ``EDITS`` names a file, an exact text that occurs once in it, its replacement,
the tests that should notice (pytest arguments: one to three files or node ids) and a line
saying what it breaks. The working tree (tracked and untracked, not ignored files) is copied
once to a temporary folder; each edit is applied there, its tests run with ``-x -q`` under a
timeout, and the file is restored. The real tree is never edited. An edit whose tests still pass
SURVIVED: no test notices that guard going. Usage::

    python scripts/guard_check.py            # every edit; a table and a summary line
    python scripts/guard_check.py --json     # the same results as JSON
    python scripts/guard_check.py -k dino    # only edits whose id contains "dino"
    python scripts/guard_check.py --baseline # first run every test selection unedited

Exit status: 0 when nothing survived, 1 when something did, 2 for a stale edit (its old text
is not found exactly once) or a baseline that fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from guard_edits import EDITS, Edit

ROOT = Path(__file__).resolve().parent.parent
MARKERS = "not xla"


@dataclass(frozen=True)
class Result:
    """One edit's outcome: ``killed`` (a test failed), ``survived`` or ``timeout``."""

    id: str
    file: str
    what: str
    outcome: str
    seconds: float
    tests: tuple[str, ...]


def copy_tree(dst: Path) -> None:
    """Tracked and untracked-but-not-ignored files of the working tree, as they are now."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in names:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.is_file():  # deleted but still tracked
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float]:
    """``passed``, ``failed`` or ``timeout`` for ``tests`` run in ``tree``, and the seconds."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        MARKERS,
        *tests,
    ]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=tree, env=env, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start
    # 5: nothing collected, which must not count as a pass or a kill.
    if proc.returncode == 5:
        raise SystemExit(f"no tests collected for {' '.join(tests)}")
    return ("passed" if proc.returncode == 0 else "failed"), time.monotonic() - start


def apply(tree: Path, edit: Edit) -> str:
    """Apply ``edit`` in ``tree``; returns the original text to restore."""
    path = tree / edit.file
    text = path.read_text()
    count = text.count(edit.old)
    if count != 1:
        raise SystemExit(f"stale edit {edit.id}: its old text occurs {count} times in {edit.file}")
    path.write_text(text.replace(edit.old, edit.new))
    return text


def check_all(tree: Path, edits: list[Edit]) -> None:
    """Every edit's old text occurs exactly once (before any test runs)."""
    for edit in edits:
        text = (tree / edit.file).read_text()
        if text.count(edit.old) != 1:
            raise SystemExit(
                f"stale edit {edit.id}: its old text occurs {text.count(edit.old)} times "
                f"in {edit.file}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("-k", default="", help="only edits whose id contains this")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per edit")
    parser.add_argument("--baseline", action="store_true", help="run each selection unedited")
    args = parser.parse_args()
    edits = [e for e in EDITS if args.k in e.id]
    ids = [e.id for e in EDITS]
    if len(set(ids)) != len(ids):
        raise SystemExit("duplicate edit ids")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="guard-check-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        check_all(tree, edits)
        if args.baseline:
            for tests in sorted({e.tests for e in edits}):
                outcome, secs = run_tests(tree, tests, args.timeout)
                print(f"baseline {outcome:7} {secs:6.1f}s {' '.join(tests)}", file=sys.stderr)
                if outcome != "passed":
                    return 2
        for edit in edits:
            original = apply(tree, edit)
            try:
                outcome, secs = run_tests(tree, edit.tests, args.timeout)
            finally:
                (tree / edit.file).write_text(original)
            verdict = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[outcome]
            results.append(Result(edit.id, edit.file, edit.what, verdict, secs, edit.tests))
            print(f"{verdict:8} {secs:6.1f}s {edit.id}", file=sys.stderr, flush=True)
    killed = sum(r.outcome == "killed" for r in results)
    survived = sum(r.outcome == "survived" for r in results)
    timeouts = sum(r.outcome == "timeout" for r in results)
    summary = f"{len(results)} edits, {killed} killed, {survived} survived"
    if timeouts:
        summary += f", {timeouts} timed out"
    if args.json:
        print(json.dumps({"summary": summary, "results": [asdict(r) for r in results]}, indent=1))
    else:
        width = max((len(r.id) for r in results), default=2)
        print(f"| {'edit':{width}} | outcome  | file | what it breaks |")
        print(f"|{'-' * (width + 2)}|----------|------|----------------|")
        for r in results:
            print(f"| {r.id:{width}} | {r.outcome:8} | {r.file} | {r.what} |")
        print(summary)
    return 0 if survived == 0 and timeouts == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
