"""What is per host and what is global: the one place a pod and a laptop differ.

* **Batches.** ``data.batch_size`` is global. Each process loads ``global / process_count``
  samples (``local_batch``). The step then sees either that shard (DDP: one process, one
  replica) or the global batch (XLA SPMD: the hosts' shards form one global array); the sizes of
  buffers filled inside the step come from ``step_batch``, never from the per-host batch.
* **Randomness.** Everything random in a step (augmentations, masks) is a pure function of the
  run's seed, shared by all hosts, and of the sample's position in the global sampling order
  (``data/samplers.py``), so it is drawn in the loader workers of whichever host loads the
  sample, and every host agrees on it without communicating.
* **Reductions.** A sum of values computed in the step goes through ``reduce_step_sum`` (an
  all-reduce under DDP, nothing under SPMD, where the value is already global); a sum of
  host-local values (a failure flag, a count made on the host) through ``reduce_host_sum``.
  ``gather_step_rows`` assembles per-sample rows of the whole global batch on every process.
* **Decisions.** Whether and from where to resume is decided on process 0 and broadcast, and the
  checkpoint is read there and broadcast, so no process can start fresh while another resumes,
  even when only process 0 can see the checkpoint folder.
* **Failures.** A failure on one host must not leave the others waiting in a collective.
  Where hosts must agree (setting up the job, each step's batch, a validation, a checkpoint
  write, the resume decision) every process calls ``agree`` with its own failure or None: a
  host sum of one flag per process (and, only when one is set, of the first failing host's
  message), after which
  every process raises the same kind of error with that host's message, or all go on.
* **Ctrl-C.** On a pod a Ctrl-C only sets a flag (``runtime/interrupt.py``), which ``agree``
  carries with the failures: when any host was interrupted every host raises KeyboardInterrupt
  at that same agreement (before the same step, validation batch or after the same checkpoint
  write), so all exit 130 together and none waits for another in a collective. It outranks a
  failure at that point: on the interrupted host a failure may be the Ctrl-C's own echo (a
  loader worker it ended), and the operator asked for the stop.
"""

from __future__ import annotations

import io
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from octtrain.config.sections import CheckpointConfig
from octtrain.errors import (
    BackendError,
    CheckpointError,
    ConfigError,
    DataError,
    NonFiniteLossError,
    OcttrainError,
)
from octtrain.runtime import checkpoint as ckpt
from octtrain.runtime.backend import Backend
from octtrain.runtime.interrupt import interrupt_pending

log = logging.getLogger("octtrain")

# The kinds ``agree`` carries between hosts (their index + 1 is the flag; 0: no failure), so
# every host raises the class its exit code comes from (cli.main: 3 non-finite, 2 the others).
AGREED_KINDS: tuple[type[OcttrainError], ...] = (
    OcttrainError,
    ConfigError,
    DataError,
    BackendError,
    CheckpointError,
    NonFiniteLossError,
)
MESSAGE_BYTES = 1000  # of the failing host's message sent to the others
BEAT_S = 5.0  # the longest ``beating`` keeps a process in one collective (a tiny host sum)
T = TypeVar("T")


def agree(
    backend: Backend,
    failure: OcttrainError | None,
    where: str,
    kind: type[OcttrainError] | None = None,
    going: bool = False,
) -> int:
    """Every process learns whether any failed at this point and all raise together.

    Call on every process at the same point, with this process's failure or None. The failing
    process raises its own error; the others raise ``kind`` (default: the failing one's class
    among ``AGREED_KINDS``) with ``host i failed <where>: <its message>``. Two host sums, the
    second only when something failed: cheap enough for every step. A Ctrl-C on any host
    (``interrupt_pending``) makes every process raise KeyboardInterrupt here instead.

    Returns how many processes said ``going`` (work left): a loop whose processes hold unequal
    shares agrees once a round until none is going (``beating``, the export's parts).
    """
    if backend.process_count == 1:
        if failure is not None:
            raise failure
        return int(going)
    me, flags = backend.process_index, torch.zeros(3, backend.process_count, dtype=torch.int64)
    if failure is not None:
        flags[0, me] = 1 + max(i for i, k in enumerate(AGREED_KINDS) if isinstance(failure, k))
    flags[1, me] = int(interrupt_pending())
    flags[2, me] = int(going)
    flags = backend.reduce_host_sum(flags)
    interrupted = [i for i, flag in enumerate(flags[1].tolist()) if flag]
    if interrupted:
        if failure is not None:
            log.warning("%s: this host's failure gives way to the Ctrl-C: %s", where, failure)
        log.warning("Ctrl-C on host(s) %s: every host stops here (%s)", interrupted, where)
        raise KeyboardInterrupt
    failed = [i for i, flag in enumerate(flags[0].tolist()) if flag]
    if not failed:
        return int(flags[2].sum())
    first = failed[0]
    text = torch.zeros(MESSAGE_BYTES, dtype=torch.int64)
    if me == first:
        data = str(failure).encode("utf-8")[:MESSAGE_BYTES]
        text[: len(data)] = torch.tensor(list(data), dtype=torch.int64)
    text = backend.reduce_host_sum(text)
    if failure is not None:
        raise failure
    message = bytes(int(b) for b in text.tolist()).rstrip(b"\0").decode("utf-8", "replace")
    raised = kind or AGREED_KINDS[int(flags[0, first]) - 1]
    raise raised(f"host {first} failed {where}: {message}")


def agreed(backend: Backend, where: str, build: Callable[[], T]) -> T:
    """``build()`` on every process, agreed: an ``OcttrainError`` on any host (a manifest or a
    cache that host alone cannot read, a kernel refusal) stops every host here, with its
    message, instead of leaving the others to wait for it in their first collective."""
    result: T | None = None
    failure: OcttrainError | None = None
    try:
        result = build()
    except OcttrainError as exc:
        failure = exc
    except Exception as exc:  # a bug too must not leave the other hosts waiting
        if backend.process_count == 1:
            raise  # no other host to tell: the bug keeps its own class and traceback
        log.error("%s failed:\n%s", where, traceback.format_exc())
        failure = OcttrainError(f"{where}: {type(exc).__name__}: {exc}")
    agree(backend, failure, where)
    assert result is not None
    return result


def beating(backend: Backend, where: str, work: Callable[[], T], beat_s: float = BEAT_S) -> T:
    """``work()`` on process 0 alone (the export's group table and header) while every process
    agrees once every ``beat_s`` seconds that it still runs: no process waits longer than that
    in one collective, however long the work takes (the backend's collective timeout is 10
    minutes), and its failure, of any class, is raised on every process (as ``agreed``). The
    others return None."""
    if backend.process_count == 1:
        return work()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except OcttrainError as exc:
            box["failure"] = exc
        except Exception as exc:  # noqa: BLE001 - a bug too, with its traceback, on every host
            log.error("%s failed:\n%s", where, traceback.format_exc())
            box["failure"] = OcttrainError(f"{where}: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name=where, daemon=True) if backend.is_main else None
    if thread is not None:
        thread.start()
    going = True
    while going:
        if thread is not None:
            thread.join(beat_s)
        alive = thread is not None and thread.is_alive()
        failure = None if alive else box.get("failure")
        going = agree(backend, failure, where, going=alive) > 0
    return box.get("result")  # type: ignore[return-value]  # the others': None


def local_batch(global_batch: int, backend: Backend) -> int:
    """Samples this process loads per step; ConfigError when the global batch does not split
    over the processes, or a process's share over its devices."""
    if global_batch % backend.process_count:
        raise ConfigError(
            f"data.batch_size {global_batch} is not divisible by the "
            f"{backend.process_count} processes"
        )
    per_host = global_batch // backend.process_count
    devices_per_host = max(1, backend.world_size // backend.process_count)
    if backend.step_is_global and per_host % devices_per_host:
        raise ConfigError(
            f"data.batch_size {global_batch} gives {per_host} samples per host, which do not "
            f"split over its {devices_per_host} devices"
        )
    return per_host


def step_batch(global_batch: int, backend: Backend) -> int:
    """Rows of the batch tensors the step sees: global under SPMD, this process's under DDP."""
    return global_batch if backend.step_is_global else local_batch(global_batch, backend)


def gather_step_rows(backend: Backend, rows: torch.Tensor) -> npt.NDArray[np.float64]:
    """Every process's 2-D ``rows`` (filled inside steps, same shape everywhere) as one array.

    Under SPMD ``rows`` already holds the global batch's rows. Under DDP each process writes its
    rows into its own slot of a zero table and one all-reduce assembles it, in process order.
    """
    if backend.step_is_global or backend.process_count == 1:
        return rows.detach().cpu().double().numpy()
    table = torch.zeros(backend.process_count, *rows.shape, device=rows.device)
    table[backend.process_index] = rows
    reduced = backend.reduce_step_sum(table).cpu().double().numpy()
    return reduced.reshape(-1, rows.shape[-1])


def mean_over_replicas(backend: Backend, value: torch.Tensor) -> float:
    """The mean over data-parallel replicas of a per-replica mean (e.g. a step's loss)."""
    if backend.step_is_global:
        return float(value.detach().cpu())
    total = backend.reduce_step_sum(value.detach().reshape(1))
    return float(total.cpu()[0]) / backend.world_size


def decide_resume(cfg: CheckpointConfig, directory: str | None, backend: Backend) -> str | None:
    """The checkpoint to resume from (or None), decided on process 0 and broadcast; any failure
    there is raised on every process (``on_main``)."""
    return on_main(
        backend, "finding the checkpoint to resume from", ckpt.resume_url, cfg, directory
    )


def load_once(url: str, backend: Backend) -> dict[str, Any]:
    """Checkpoint ``url`` read on process 0 and broadcast, so every process resumes from the
    same bytes even when only process 0 can read the folder; any failure there is raised on
    every process (``on_main``)."""
    if backend.process_count == 1:
        state: dict[str, Any] = on_main(backend, f"reading {url}", ckpt.load_checkpoint, url)
        return state
    payload: bytes = on_main(backend, f"reading {url}", _checkpoint_bytes, url)
    state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    return state


def _checkpoint_bytes(url: str) -> bytes:
    buffer = io.BytesIO()
    torch.save(ckpt.load_checkpoint(url), buffer)
    return buffer.getvalue()


def on_main(backend: Backend, where: str, read: Callable[..., T], *args: Any) -> T:
    """``read(*args)`` on process 0, its result broadcast to every process. Any failure there (a
    ``CheckpointError``, or a storage client's HTTP 401/5xx, an auth refresh error: the resume
    side of what the checkpoint write agrees on) is raised on every process as a
    ``CheckpointError``: process 0's own message (its traceback logged for what is not a
    ``CheckpointError``), the others' ``host 0 failed <where>: <its message>``."""
    result: T | None = None
    error: str | None = None
    if backend.is_main:
        try:
            result = read(*args)
        except CheckpointError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - every host must learn of it, with its cause
            log.error("%s failed:\n%s", where, traceback.format_exc())
            error = f"{where}: {type(exc).__name__}: {exc}"
    if backend.process_count > 1:
        result, error = backend.broadcast_object((result, error))
    if error is not None:
        raise CheckpointError(error if backend.is_main else f"host 0 failed {where}: {error}")
    return result  # type: ignore[return-value]  # None is a result too (no checkpoint)
