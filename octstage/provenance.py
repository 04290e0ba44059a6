"""Code version and config hashing, recorded beside every output so a result can be traced."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from octstage import __version__

_REPO = Path(__file__).resolve().parent.parent


def code_version(version: str = __version__) -> str:
    """``version`` plus the git commit (and ``-dirty``) when running from a checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(_REPO), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version}+g{out}" if out else version


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values always give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(value: Any) -> str:
    """A short, stable hash of a JSON-able configuration."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


@functools.cache
def installed_version(distribution: str) -> str:
    """The installed version of a distribution, ``"absent"`` when it is not installed. Cached: a
    metadata lookup scans sys.path, and cache keys ask for it per source file."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"
