"""Device backends: one small interface so the training loop never branches on cpu/cuda/xla.

``make_backend("auto" | "cpu" | "cuda" | "xla", precision)`` returns a ``Backend``. CPU and CUDA
live in ``runtime/torch_backend.py`` (DDP over gloo / nccl when started by torchrun); XLA lives in
``runtime/xla.py``. What is per host and what is global
(batches, reductions, the resume decision) is decided in ``runtime/hosts.py`` on top of this.

Rules the loop follows so the same code runs on XLA: static shapes, ``drop_last`` for training,
no ``.item()`` inside a step, and host-side reads of a step's tensors (logging, NaN checks) one
step later, after ``sync`` launched the next step (``train/loop.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import nn

from octtrain.errors import BackendError
from octtrain.runtime.torch_backend import TorchBackend


class Backend(Protocol):
    """What the training loop needs from a device.

    ``world_size`` counts data-parallel replicas (devices); ``process_count`` counts host
    processes. They differ under XLA SPMD (one process drives several devices). Each process
    loads ``global_batch / process_count`` samples per step. ``step_is_global`` says what the
    step's tensors hold: the global batch (XLA SPMD, where per-host shards form one global
    array) or this process's shard (DDP, one process).
    """

    kind: str
    device: torch.device
    rank: int
    world_size: int
    process_index: int
    process_count: int
    step_is_global: bool

    @property
    def is_main(self) -> bool:
        """True on the one process that logs and writes checkpoints."""
        ...

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to the device and wrap it for data parallelism (DDP, SPMD sharding)."""
        ...

    def wrap_loader(self, loader: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        """Yield the loader's batches with every tensor on the device."""
        ...

    def sync(self) -> None:
        """End of a step: run the traced graph (XLA); nothing elsewhere."""
        ...

    def reduce_step_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel group of a device tensor computed from the step's batch
        (DDP: an all-reduce; SPMD: the tensor is global already). Returns a new tensor."""
        ...

    def reduce_host_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over processes of a host-local value (a CPU tensor in, a CPU tensor out)."""
        ...

    def broadcast_object(self, obj: Any) -> Any:
        """Process 0's ``obj`` (picklable), returned on every process."""
        ...

    def barrier(self) -> None:
        """Wait for every process."""
        ...

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast where the device supports it and precision allows; else a no-op."""
        ...

    def compile_count(self) -> int | None:
        """Number of graph compilations so far (XLA); None where it does not apply."""
        ...

    def peak_memory_gib(self) -> float | None:
        """The most device memory this process's tensors have held so far, in GiB (CUDA's
        allocator); None where the device keeps no such count (CPU, XLA)."""
        ...

    def close(self) -> None:
        """Release the process group / runtime."""
        ...


def resolve_kind(kind: str, xla: bool = True) -> str:
    """``auto``: CUDA if visible, XLA if PJRT_DEVICE is set (and ``xla``: not for ``embed``,
    which runs on CPU or CUDA only), else CPU."""
    if kind != "auto":
        return kind
    if torch.cuda.is_available():
        return "cuda"
    if xla and os.environ.get("PJRT_DEVICE"):
        return "xla"
    return "cpu"


def make_backend(kind: str, precision: str = "auto", xla_cache_dir: str | None = None) -> Backend:
    """The backend for ``kind`` (auto, cpu, cuda, xla) and ``precision`` (auto, bf16, fp32);
    ``xla_cache_dir``: XLA's persistent compilation cache (XLA only; None: none)."""
    kind = resolve_kind(kind)
    if kind == "xla":
        try:
            from octtrain.runtime.xla import XlaBackend
        except ImportError as exc:
            raise BackendError(
                f"device 'xla' needs torch_xla (the .venv-xla environment): {exc}"
            ) from exc
        backend: Backend = XlaBackend(precision=precision, compile_cache=xla_cache_dir)
        return backend
    if kind not in ("cpu", "cuda"):
        raise BackendError(f"unknown device {kind!r} (auto, cpu, cuda, xla)")
    return TorchBackend(kind, precision)


def cpu_threads(configured: int, num_workers: int) -> int:
    """Intra-op threads: ``configured``, else this process's share of the cores minus workers.

    Oversubscribed OpenMP threads spin against the loader workers: on 2 busy cores, 2 threads
    made the demo model's step 16x slower than 1 thread (1.03 s vs 0.064 s).
    """
    if configured:
        return configured
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = (os.cpu_count() or 1) // local_processes
    return max(1, cores - num_workers)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a data-parallel wrapper (DDP keeps it in ``.module``)."""
    inner = getattr(model, "module", model)
    assert isinstance(inner, nn.Module)
    return inner
