"""Hand-offs between threads that neither lose an error nor wait forever.

torch_xla's ``ParallelLoader`` pulls batches in a background thread and turns any exception
raised there into a plain ``StopIteration`` in the main thread: a host whose loader fails would
end its pass quietly and pair its next collective with the other hosts' next batch. So the
loader's error travels as data: ``carry_errors`` wraps the loader the thread iterates and turns
its exception into one ``CarriedError`` item; ``raise_carried`` re-raises it, with its class
and message, in the thread that consumes the batches.

``run_within`` runs a blocking call (torch_xla's ``ParallelLoader.close`` joins its thread with
no timeout) with a time limit, so no exit path waits on a thread that will never end.
``within_or_exit`` does the same for a call the process cannot end without (the device's
pending work at close, ``xm.wait_device_ops``: a program whose peer hosts are gone never
finishes, and a TPU pod has no coordination service to tear it down): past its limit the
process exits with the watchdog's code, 5, naming what it waited for.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from octtrain import exitcodes

log = logging.getLogger("octtrain")


class CarriedError:
    """A loader's exception, sent as the next item in place of a batch (no tensors in it, so
    torch_xla's device transfer passes it through untouched)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _CarryErrors(Iterable[Any]):
    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self.items
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            yield CarriedError(exc)


def carry_errors(items: Iterable[Any]) -> Iterable[Any]:
    """``items``, re-iterable, with an exception while iterating turned into one last
    ``CarriedError`` item."""
    return _CarryErrors(items)


def raise_carried(item: Any) -> Any:
    """``item``, or the exception it carries raised here."""
    if isinstance(item, CarriedError):
        raise item.error
    return item


def run_within(call: Callable[[], object], timeout_s: float, what: str) -> bool:
    """Run ``call`` in a daemon thread and wait at most ``timeout_s`` for it; False (and a
    warning naming ``what``) when it is still running, which the process exit then abandons."""
    thread = threading.Thread(target=call, name=f"stop {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning(
            "%s did not stop within %.0f s; leaving it to the process exit", what, timeout_s
        )
        return False
    return True


def within_or_exit(call: Callable[[], object], timeout_s: float, what: str) -> None:
    """``call`` within ``timeout_s``, or the process ends now with exit code 5 (stalled) and an
    error naming ``what``: an exit path must not wait forever on it (module docstring)."""
    if run_within(call, timeout_s, what):
        return
    log.error(
        "%s did not return within %g s: exiting with code %d (stalled). A host that stopped "
        "or failed earlier leaves the device's programs waiting for it: its log says why.",
        what,
        timeout_s,
        exitcodes.STALLED.code,
    )
    logging.shutdown()
    os._exit(exitcodes.STALLED.code)
