"""Failure and exit paths through torch_xla's real ``ParallelLoader`` (the XLA tier's subprocess).

``python -m tests.xla.loader_probe`` builds ``make_backend("xla")`` and prints one line
``XLA-RESULT {json}``:

* ``train_error``: the class and message a training loop sees when the loader raises a
  ``DataError`` at its third batch (torch_xla's thread alone would end the pass quietly);
* ``validation_error``: what ``eval/validation.collect`` raises when the validation loader fails
  (before: a broken exact-once invariant that names no volume);
* ``close_s``: seconds ``Prefetcher.close`` + ``backend.close`` take when the loader thread waits
  on a data-bound prefetcher that will never be fed again (before: forever).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from octtrain.data.loaders import Prefetcher
from octtrain.errors import DataError
from octtrain.eval.common.validation import ValidationError, collect
from octtrain.runtime.backend import make_backend
from octtrain.runtime.xla import DeviceLoader

RESULT_PREFIX = "XLA-RESULT "
BATCH = 4  # splits over the mesh's devices


def batch(i: int) -> dict[str, Any]:
    return {
        "x": torch.full((BATCH, 3), float(i)),
        "index": torch.arange(BATCH) + BATCH * i,
        "valid": torch.ones(BATCH),
    }


def failing(n_good: int, message: str) -> Iterator[dict[str, Any]]:
    for i in range(n_good):
        yield batch(i)
    raise DataError(message)


def stalled() -> Iterator[dict[str, Any]]:
    # torch_xla's transfer thread gathers device_prefetch_size batches before sending any.
    yield from (batch(i) for i in range(DeviceLoader.DEVICE_PREFETCH))
    threading.Event().wait()  # a read from a dead mount: nothing more, ever


def main() -> dict[str, Any]:
    backend = make_backend("xla", "fp32")
    result: dict[str, Any] = {}
    seen = 0
    try:
        for _ in backend.wrap_loader(failing(2, "volume 7: unreadable chunk in the cache")):
            seen += 1
        result["train_error"] = None
    except DataError as exc:
        result["train_error"] = [type(exc).__name__, str(exc)]
    result["train_batches"] = seen
    try:
        batches = backend.wrap_loader(failing(1, "volume 9: short read"))
        collect(lambda b: b["x"], batches, backend, n=3 * BATCH, width=3)
        result["validation_error"] = None
    except ValidationError as exc:
        result["validation_error"] = str(exc)
    prefetcher = Prefetcher(stalled())
    batches = iter(backend.wrap_loader(prefetcher))
    next(batches)
    started = time.monotonic()
    prefetcher.close(timeout_s=5)
    backend.close()
    result["close_s"] = time.monotonic() - started
    return result


if __name__ == "__main__":
    print(RESULT_PREFIX + json.dumps(main()), flush=True)
