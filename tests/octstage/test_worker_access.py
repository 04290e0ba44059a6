"""What a dask worker gets of a run's storage settings (``cluster.WorkerAccess``): the
variables while the run lasts, nothing of their values in a repr (a worker's logs print
plugins), and the worker's own environment back after it, also where a variable was unset."""

from __future__ import annotations

import os

import pytest

from octstage.cachebuild.cluster import WorkerAccess


def test_worker_access_shows_names_only_and_restores_the_workers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OCTSTAGE_TEST_KEPT", "worker's own")
    monkeypatch.delenv("OCTSTAGE_TEST_SECRET", raising=False)
    access = WorkerAccess({"OCTSTAGE_TEST_SECRET": "s3cr3t", "OCTSTAGE_TEST_KEPT": "run's"})
    assert "s3cr3t" not in repr(access) and "OCTSTAGE_TEST_SECRET" in repr(access)
    access.setup(None)
    assert os.environ["OCTSTAGE_TEST_SECRET"] == "s3cr3t"
    assert os.environ["OCTSTAGE_TEST_KEPT"] == "run's"
    access.teardown(None)
    assert "OCTSTAGE_TEST_SECRET" not in os.environ  # unset before the run: unset after it
    assert os.environ["OCTSTAGE_TEST_KEPT"] == "worker's own"
