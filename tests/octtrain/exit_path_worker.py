"""Run by test_exit_paths.py: a data-bound training loop driven to one exit path, in its own
process, with torch_xla's loader thread stood in for by plain threads.

``python exit_path_worker.py RUN_DIR PATH`` with PATH one of ``finished``, ``data``,
``nonfinite``, ``validation``, ``checkpoint``, ``interrupt``, ``close`` (the run finishes, then
the backend's close never returns, as a device wait whose peer hosts are gone). The loader is
slow (every batch takes ``BATCH_S``), so when the loop stops, the loader thread waits on the
prefetcher for a batch nothing will put. ``ThreadLoaderBackend`` is the CPU backend with torch_xla's
``ParallelLoader`` mechanics in plain threads: a thread pulls the wrapped loader's batches into
a small queue (the loader's errors carried as items, as ``runtime/xla.py`` does), and
``close`` joins that thread with no timeout, as torch_xla's does. Prints ``EXIT <code>`` (the
CLI's code for what the loop raised) and returns: the test checks that the process then ends.
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from octtrain import exitcodes
from octtrain.config.sections import CheckpointConfig, LoggingConfig, TrainConfig, ValidationConfig
from octtrain.errors import DataError, NonFiniteLossError, OcttrainError
from octtrain.eval.common.validation import ValidationError
from octtrain.runtime.handoff import carry_errors, raise_carried
from octtrain.runtime.torch_backend import TorchBackend
from octtrain.train.job import Evaluation, Settings, StepResult
from octtrain.train.loop import Trainer

BATCH_S = 0.2  # each batch's load: the loop always waits for data
FAIL_AT = 3  # the step (1-based) where the path's failure happens


class ThreadLoaderBackend(TorchBackend):
    """The CPU backend, with batches handed over by a thread as torch_xla's loader does."""

    def __init__(self, close_hangs: bool = False) -> None:
        super().__init__("cpu", "fp32")
        self._threads: list[threading.Thread] = []
        self.close_hangs = close_hangs

    def wrap_loader(self, loader: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        handed: queue.Queue[Any] = queue.Queue(maxsize=2)
        end = object()

        def pull() -> None:
            for item in carry_errors(loader):
                handed.put(item)
            handed.put(end)

        thread = threading.Thread(target=pull, name="xla-like-loader", daemon=True)
        thread.start()
        self._threads.append(thread)

        def batches() -> Iterator[dict[str, Any]]:
            while (item := handed.get()) is not end:
                yield raise_carried(item)

        return batches()

    def close(self) -> None:
        if self.close_hangs:
            threading.Event().wait()
        for thread in self._threads:
            thread.join()  # as torch_xla's ParallelLoader.close: no timeout
        super().close()


class DataBoundJob:
    kind = "pretrain"
    steps_per_unit = 1
    global_batch = 2
    validates_last = False

    def __init__(self, path: str, total_steps: int) -> None:
        self.path, self.total_steps = path, total_steps

    def load_state(self, state: dict[str, Any]) -> None:
        pass

    def state(self, step: int) -> dict[str, Any]:
        if self.path == "checkpoint":
            raise PermissionError("gs://bucket/ckpt: HTTP 401: the token has expired")
        return {"w": torch.tensor(step)}

    def start(self, start_step: int) -> Iterator[dict[str, Any]]:
        for i in itertools.count(start_step):
            time.sleep(BATCH_S)
            if self.path == "data" and i + 1 == FAIL_AT:
                raise DataError(f"volume {i}: unreadable chunk in the cache")
            yield {"x": torch.tensor(i)}

    def before_step(self, step: int) -> None:
        if self.path == "interrupt" and step + 1 == FAIL_AT:
            raise KeyboardInterrupt

    def train_step(self, batch: dict[str, Any], step: int) -> StepResult:
        nan = self.path == "nonfinite" and step + 1 == FAIL_AT
        return StepResult(torch.tensor(float("nan") if nan else 1.0), torch.tensor(1.0))

    def end_of_unit(self, unit: int) -> tuple[dict[str, float], str | None]:
        return {}, None

    def validate(self, unit: int) -> Evaluation:
        if self.path == "validation":
            raise ValidationError("validation failed on process 0: volume 9: short read")
        return Evaluation({"val/loss": 1.0})

    def images(self, batch: dict[str, Any], result: StepResult) -> dict[str, np.ndarray]:
        return {}


def main(run: Path, path: str) -> int:
    every = FAIL_AT if path in ("validation", "checkpoint") else 0
    settings = Settings(
        train=TrainConfig(
            max_steps=6,
            run_dir=str(run),
            # The watchdog's exit, for the close that never returns (steps take BATCH_S).
            stall_timeout_s=2.0 if path == "close" else 300.0,
            stall_exit_s=4.0 if path == "close" else 0.0,
        ),
        validation=ValidationConfig(every=every, continue_on_failure=False),
        logging=LoggingConfig(wandb_mode="disabled", log_every=1, console=False),
        checkpoint=CheckpointConfig(every=FAIL_AT if path == "checkpoint" else 100),
        config={},
        config_yaml="",
    )
    backend = ThreadLoaderBackend(close_hangs=path == "close")
    try:
        Trainer(DataBoundJob(path, 6), settings, backend).run()  # type: ignore[arg-type]
        return exitcodes.OK.code
    except NonFiniteLossError:
        return exitcodes.NONFINITE.code
    except DataError as exc:
        print(f"data error: {exc}", flush=True)
        return exitcodes.DATA.code
    except OcttrainError as exc:
        print(f"{exc}", flush=True)
        return exitcodes.REFUSED.code
    except KeyboardInterrupt:
        return exitcodes.INTERRUPTED.code
    finally:
        backend.close()


if __name__ == "__main__":
    code = main(Path(sys.argv[1]), sys.argv[2])
    print(f"EXIT {code}", flush=True)
    sys.exit(code)
