"""Every edit of the guard check still applies: its old text occurs exactly once in its file, and
the tests it names exist. A refactor that moves a guard's code leaves the edit stale, and
``scripts/guard_check.py`` then stops before any test runs (one went stale this way unnoticed)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from guard_edits import EDITS  # noqa: E402  (scripts/ is not a package)


def test_every_guard_edit_applies_once_and_names_existing_tests() -> None:
    stale = [e.id for e in EDITS if (ROOT / e.file).read_text(encoding="utf-8").count(e.old) != 1]
    assert not stale, f"edits whose old text is not found exactly once: {stale}"
    missing = [t for e in EDITS for t in e.tests if not (ROOT / t.split("::")[0]).exists()]
    assert not missing, f"tests named by no file: {missing}"
    assert len({e.id for e in EDITS}) == len(EDITS), "edit ids must be unique"
