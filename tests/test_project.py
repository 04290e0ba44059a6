"""The project's promises about itself: which Pythons it installs on, and that CI tries one."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def test_requires_python_allows_the_versions_the_pinned_torch_has_wheels_for() -> None:
    spec = SpecifierSet(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    )
    assert all(version in spec for version in ("3.11", "3.12", "3.13"))
    assert "3.10" not in spec and "3.14" not in spec


def test_ci_runs_the_default_suite_on_a_newer_python_too() -> None:
    steps = (ROOT / ".ci" / "run").read_text().split()
    assert "test" in steps and "test-py312" in steps
    assert "test-py312:" in (ROOT / "Makefile").read_text()


def test_ci_removes_an_environment_only_after_every_tier_that_uses_it() -> None:
    """CI frees each environment's ~3-8 GB once its tiers are done (its disk is not sized); a
    tier run after its environment went would rebuild it, and the disk it was freed for."""
    lines = [line.split() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    uses = {".venv": {"test", "test-slow"}, ".venv-py312": {"test-py312"}}
    for venv, targets in uses.items():
        gone = [i for i, words in enumerate(lines) if words == ["rm", "-rf", venv]]
        runs = [i for i, words in enumerate(lines) if words[:1] == ["make"] and words[1] in targets]
        assert runs, f"no tier of {venv} in .ci/run"
        assert not gone or max(runs) < min(gone), f"{venv} removed before {targets} ran"


# Folders the standard Python .gitignore template (GitHub's Python.gitignore) ignores anywhere in
# a tree: a package folder with one of these names vanishes from a fork that adopts it.
IGNORED_BY_THE_PYTHON_TEMPLATE = {"build", "dist", "develop-eggs", "downloads", "eggs", "lib"}
IGNORED_BY_THE_PYTHON_TEMPLATE |= {"lib64", "parts", "sdist", "var", "wheels", "env", "venv"}


def test_no_package_folder_has_a_name_the_python_gitignore_template_ignores() -> None:
    folders = [p for pkg in ("octstage", "octtrain") for p in (ROOT / pkg).rglob("*") if p.is_dir()]
    assert folders, "no package folders found"
    clashes = [p.relative_to(ROOT) for p in folders if p.name in IGNORED_BY_THE_PYTHON_TEMPLATE]
    assert not clashes, f"renamed build stage? these folders would be ignored: {clashes}"


def test_every_benchmark_starts_from_a_checkout_as_the_readme_runs_it(tmp_path: Path) -> None:
    """``python bench/X.py`` with no PYTHONPATH (the README's command): a benchmark that imports
    the test doubles or a sibling module must put the checkout on its path itself.
    ``--help`` parses after the imports, so each start proves them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for script in sorted((ROOT / "bench").glob("*.py")):
        text = script.read_text()
        if "sys.path.insert" not in text:
            continue  # imports only the installed packages
        proc = subprocess.run(
            [sys.executable, str(script), "--help"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{script.name}: {proc.stderr[-2000:]}"
