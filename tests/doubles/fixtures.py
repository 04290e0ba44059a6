"""pytest fixtures for the cloud doubles (registered from tests/conftest.py).

- ``gcs_server``: one fake-gcs-server per session (a Go process; starting it takes ~0.2 s).
- ``gcs_bucket``: a fresh, uniquely named bucket in it per test.
- ``b2``: a fresh B2 double per test (in-process thread; faults and counters start at zero)
  with a bucket ``src``.
- ``s3_server``: one moto server per session (in a daemon thread, on a free loopback port).
- ``s3_bucket``: a fresh, uniquely named bucket in it per test.
- ``cloud_env``: the process environment pointing rclone remotes ``b2:`` and ``gcs:``,
  google-cloud-storage and b2sdk at those doubles, and the standard AWS variables (dummy keys,
  the endpoint) at the S3 double, so ``s3://`` URLs reach it (no config file or HOME state).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    # Imported inside the fixtures: the XLA tier's environment has no cloud SDKs, and this
    # plugin is loaded for every test session.
    from tests.doubles.b2_server import B2Double
    from tests.doubles.gcs import GcsDouble
    from tests.doubles.s3 import S3Double


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsDouble]:
    from tests.doubles.gcs import GcsDouble

    with GcsDouble() as server:
        yield server


@pytest.fixture
def gcs_bucket(gcs_server: GcsDouble) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    gcs_server.create_bucket(name)
    return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Double]:
    from tests.doubles.s3 import S3Double

    with S3Double() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: S3Double) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def b2() -> Iterator[B2Double]:
    from tests.doubles.b2_server import B2Double

    with B2Double() as double:
        double.create_bucket("src")
        yield double


def clear_client_caches() -> None:
    """Per-process SDK clients are cached by remote name; each test's doubles differ."""
    from octstage.storage import b2 as b2_backend
    from octstage.storage import gcs as gcs_backend
    from octstage.storage.s3 import S3FileSystem

    gcs_backend._clients.clear()
    b2_backend._apis.clear()
    S3FileSystem.clear_instance_cache()


@pytest.fixture
def cloud_env(
    monkeypatch: pytest.MonkeyPatch,
    b2: B2Double,
    gcs_server: GcsDouble,
    s3_server: S3Double,
    tmp_path: Path,
) -> Iterator[dict[str, str]]:
    """Environment for commands under test; returns the variables it set."""
    for key in list(os.environ):
        if key.startswith(("RCLONE_", "B2_", "OCTSTAGE_", "AWS_")):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "RCLONE_CONFIG": "/dev/null",
        "HOME": str(home),  # so a test can check nothing was written there
        **b2.rclone_env(),
        **gcs_server.env(),
        **s3_server.env(),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    clear_client_caches()
    yield env
    clear_client_caches()
