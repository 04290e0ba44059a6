"""The run folder: ``<output_dir>/<name>-<timestamp>/`` with the resolved config and code version.

Layout: ``config.yaml`` (every value the run used), ``code_version``, ``metrics.jsonl``,
``checkpoints/`` (unless checkpoint.dir points elsewhere), ``images/``, ``wandb/``.

An explicit ``train.run_dir`` is claimed by the one rule for output folders
(``octstage.manifest.claim_run_folder``, octstage/outputs.py; table in docs/output-folders.md):
a folder holding a run is refused unless the run resumes from a checkpoint its index lists or
``train.overwrite=true`` moves the old run aside to ``<run_dir>.replaced-<timestamp>``.
"""

from __future__ import annotations

import datetime
import functools
import subprocess
from pathlib import Path

import octtrain
from octstage.manifest import claim_run_folder
from octtrain.errors import ConfigError

_CHECKOUT = Path(__file__).resolve().parents[2]


@functools.cache
def code_version() -> str:
    """octtrain's version plus the git commit (and ``-dirty``) when running from a checkout."""
    try:
        described = subprocess.run(
            ["git", "-C", str(_CHECKOUT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        described = ""
    return f"{octtrain.__version__}+g{described}" if described else octtrain.__version__


def claim_run_dir(
    path: Path, resume: bool, overwrite: bool, checkpoints: str | None = None
) -> Path:
    """The explicit run folder ``path``, made (see ``octstage.manifest.claim_run_folder``);
    ``checkpoints``: ``checkpoint.dir`` when it is set."""
    return claim_run_folder(path, resume, overwrite, ConfigError, checkpoints)


def new_run_dir(
    output_dir: str,
    name: str,
    explicit: str | None,
    resume: bool = False,
    overwrite: bool = False,
    checkpoints: str | None = None,
) -> Path:
    """``explicit`` if given (see ``claim_run_dir``), else ``output_dir/name-YYYYmmdd-HHMMSS``
    (suffixed if taken)."""
    if explicit is not None:
        return claim_run_dir(Path(explicit), resume, overwrite, checkpoints)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"{name}-{stamp}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


def write_run_info(run_dir: Path, config_yaml: str, version: str | None = None) -> str:
    """Save the resolved config and the code version (computed if not given); returns it."""
    version = version or code_version()
    (run_dir / "config.yaml").write_text(f"# code_version: {version}\n{config_yaml}")
    (run_dir / "code_version").write_text(version + "\n")
    return version
