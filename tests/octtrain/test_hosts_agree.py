"""``hosts.agreed`` on one process: a refusal and a bug keep their own class (the 2-process
agreement is in test_pod.py)."""

from __future__ import annotations

import pytest

from octtrain.errors import DataError, OcttrainError
from octtrain.runtime import hosts
from octtrain.runtime.backend import make_backend


def test_one_process_gets_what_it_built_its_refusal_or_its_bug_as_raised() -> None:
    backend = make_backend("cpu")
    assert hosts.agreed(backend, "building", lambda: 7) == 7

    def refused() -> int:
        raise DataError("volume 3: missing")

    with pytest.raises(DataError, match=r"^volume 3: missing$"):
        hosts.agreed(backend, "building", refused)

    def bug() -> int:
        return [1][2]  # IndexError: a bug, not a user's mistake

    # A bug keeps its class and traceback (the CLI then shows it), never an exit-2 refusal.
    with pytest.raises(IndexError) as caught:
        hosts.agreed(backend, "building", bug)
    assert not isinstance(caught.value, OcttrainError)
