"""The run folder: ``<output_dir>/<name>-<timestamp>/`` with the resolved config and code version.

Layout: ``config.yaml`` (every value the run used), ``code_version``, ``metrics.jsonl``,
``checkpoints/`` (unless checkpoint.dir points elsewhere), ``images/``, ``wandb/``.

An explicit ``train.run_dir`` that already holds a run is refused (its checkpoints, index and
metrics would mix with the new run's) unless the run resumes (``checkpoint.resume``) or
``train.overwrite=true`` asks for a new run there: then the old run's folder is first renamed
aside to ``<run_dir>.replaced-<timestamp>``, so nothing of it is lost.
"""

from __future__ import annotations

import datetime
import functools
import subprocess
from pathlib import Path

import octtrain
from octtrain.errors import ConfigError

_CHECKOUT = Path(__file__).resolve().parents[2]
RUN_MARKERS = ("config.yaml", "code_version", "metrics.jsonl", "checkpoints")  # what a run leaves


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


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds what an earlier run left there."""
    return any((path / marker).exists() for marker in RUN_MARKERS)


def claim_run_dir(path: Path, resume: bool, overwrite: bool) -> Path:
    """The explicit run folder ``path``, made; ConfigError when it holds a run and neither
    ``resume`` nor ``overwrite`` says what to do with it (``overwrite`` renames it aside)."""
    if resume and overwrite:
        raise ConfigError(
            "train.overwrite=true and checkpoint.resume contradict each other: choose one"
        )
    if path.is_dir() and holds_run(path) and not resume:
        if not overwrite:
            raise ConfigError(
                f"train.run_dir {str(path)!r} already holds a run; continue it with "
                "checkpoint.resume=auto, or start a new run there with train.overwrite=true "
                "(the old run is moved to <run_dir>.replaced-<timestamp>)"
            )
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        aside = path.with_name(f"{path.name}.replaced-{stamp}")
        path.rename(aside)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"train.run_dir {str(path)!r}: cannot create: {exc.strerror}") from None
    return path


def new_run_dir(
    output_dir: str, name: str, explicit: str | None, resume: bool = False, overwrite: bool = False
) -> Path:
    """``explicit`` if given (see ``claim_run_dir``), else ``output_dir/name-YYYYmmdd-HHMMSS``
    (suffixed if taken)."""
    if explicit is not None:
        return claim_run_dir(Path(explicit), resume, overwrite)
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
