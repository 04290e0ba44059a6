"""Device backends: one small interface so the training loop never branches on cpu/cuda/xla.

``make_backend("auto" | "cpu" | "cuda" | "xla", precision)`` returns a ``Backend``. CPU and CUDA
live here (DDP over gloo / nccl when started by torchrun, read from RANK / WORLD_SIZE /
LOCAL_RANK); XLA lives in ``octtrain.device_xla`` and is the only place that imports torch_xla.

Rules the loop follows so the same code runs on XLA: static shapes, ``drop_last`` for training,
no ``.item()`` inside a step, and every host-side read of a tensor (logging, NaN checks) through
``add_step_closure`` - called right away here, after the step's graph ran on XLA.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from octtrain.errors import BackendError


class Backend(Protocol):
    """What the training loop needs from a device.

    ``world_size`` counts data-parallel replicas (devices); ``process_count`` counts host
    processes. They differ under XLA SPMD (one process drives several devices). Each process
    loads ``global_batch / process_count`` samples per step.
    """

    kind: str
    device: torch.device
    rank: int
    world_size: int
    process_index: int
    process_count: int

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

    def add_step_closure(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` once the step's tensors are materialised (now, except on XLA)."""
        ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of ``tensor`` over all replicas (returns a new tensor; input unchanged)."""
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

    def close(self) -> None:
        """Release the process group / runtime."""
        ...


class TorchBackend:
    """CPU or CUDA, single process or DDP under torchrun (gloo on CPU, nccl on CUDA)."""

    def __init__(self, kind: str, precision: str = "auto") -> None:
        if kind == "cuda" and not torch.cuda.is_available():
            raise BackendError("device 'cuda' requested but torch sees no CUDA device")
        self.kind = kind
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.process_index, self.process_count = self.rank, self.world_size
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if kind == "cuda":
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device("cpu")
        if self.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(
                backend="nccl" if kind == "cuda" else "gloo",
                timeout=datetime.timedelta(minutes=10),
            )
        self._bf16 = precision == "bf16" or (
            precision == "auto" and kind == "cuda" and torch.cuda.is_bf16_supported()
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if self.world_size == 1:
            return model
        ids = [self.device.index] if self.kind == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def wrap_loader(self, loader: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        non_blocking = self.kind == "cuda"
        for batch in loader:
            yield {
                k: v.to(self.device, non_blocking=non_blocking)
                if isinstance(v, torch.Tensor)
                else v
                for k, v in batch.items()
            }

    def sync(self) -> None:
        pass

    def add_step_closure(self, fn: Callable[..., None], *args: Any) -> None:
        fn(*args)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        if self.world_size > 1:
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if not self._bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def compile_count(self) -> int | None:
        return None

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def resolve_kind(kind: str) -> str:
    """``auto``: CUDA if visible, XLA if PJRT_DEVICE is set, else CPU."""
    if kind != "auto":
        return kind
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("PJRT_DEVICE"):
        return "xla"
    return "cpu"


def make_backend(kind: str, precision: str = "auto") -> Backend:
    """The backend for ``kind`` (auto, cpu, cuda, xla) and ``precision`` (auto, bf16, fp32)."""
    kind = resolve_kind(kind)
    if kind == "xla":
        try:
            from octtrain.device_xla import XlaBackend
        except ImportError as exc:
            raise BackendError(
                f"device 'xla' needs torch_xla (the .venv-xla environment): {exc}"
            ) from exc
        backend: Backend = XlaBackend(precision=precision)
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
