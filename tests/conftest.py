"""Shared fixtures. Heavy fixtures (cloud doubles, datasets) live beside the tests that use them."""

import os
import signal
from collections.abc import Iterator

import pytest

# fake-gcs-server serves no gRPC storage-layout API; gcsfs would spend 60 s per bucket probing
# it. Set before anything imports gcsfs (octtrain's checkpoint folder sets it too, for users).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

pytest_plugins = ["tests.doubles.fixtures"]


@pytest.fixture(autouse=True)
def _sigint_handler_restored() -> Iterator[None]:
    """Each test starts with the SIGINT handler the previous one found and gets it back after:
    the Ctrl-C tests send SIGINT to this very process, and a handler left behind by another
    test (an ignored SIGINT while dask workers start, a context cut short) would turn their
    Ctrl-C into nothing. Twice, in the full suite under load, the report-swap test saw no
    KeyboardInterrupt; alone and in its neighbours' company it passed (the leak is not found)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before and before is not None:
        signal.signal(signal.SIGINT, before)
