"""CPU and CUDA: one process, or DDP under torchrun (gloo on CPU, nccl on CUDA).

Started by torchrun, the process reads RANK / WORLD_SIZE / LOCAL_RANK; each process is one
replica and one host-side loader, so the step sees this process's shard of the global batch.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from octstage.manifest import ctrl_c_deferred
from octtrain.errors import BackendError, PeerLostError

CLOSE_BARRIER = datetime.timedelta(seconds=10)  # what close waits for the other hosts, at most
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
# What gloo and NCCL say when the peer of a collective is gone: its socket closed or reset, or
# no answer within the timeout. Anything else a collective raises (a bug) keeps its class.
_LOST = re.compile(
    r"closed by peer|reset by peer|broken pipe|timed out|timeout|communicator was aborted",
    re.IGNORECASE,
)
_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]+)\]:(\d+)")


@contextlib.contextmanager
def collective(what: str) -> Iterator[None]:
    """A collective whose peer is gone raises ``PeerLostError`` naming the peer's address (as
    gloo reports it), not gloo's RuntimeError traceback."""
    try:
        yield
    except RuntimeError as exc:
        text = str(exc)
        if not _LOST.search(text):
            raise
        found = _ADDRESS.search(text)
        peer = f"the process at {found[1]}:{found[2]}" if found else "another process"
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        raise PeerLostError(
            f"lost contact with {peer} of this run in {what} ({first[:300]}): it ended or "
            "stopped answering, and its own log says why; what was finished stays, and the "
            "same command run again on every host resumes"
        ) from None


class TorchBackend:
    """CPU or CUDA, single process or DDP under torchrun (gloo on CPU, nccl on CUDA)."""

    def __init__(self, kind: str, precision: str = "auto") -> None:
        if kind == "cuda" and not torch.cuda.is_available():
            raise BackendError("device 'cuda' requested but torch sees no CUDA device")
        self.kind = kind
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.process_index, self.process_count = self.rank, self.world_size
        self.step_is_global = False
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if kind == "cuda":
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device("cpu")
        if self.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(
                backend="nccl" if kind == "cuda" else "gloo",
                timeout=COLLECTIVE_TIMEOUT,
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
        # The loader's iterator (a validation loader forks its workers here) is built with
        # Ctrl-C held back, as the Prefetcher builds the training one: one cut off half-built
        # prints a traceback from its __del__, and workers forked as it arrives drop it in
        # their at-fork hooks ("Exception ignored"); forked while it is held, they keep it held.
        with ctrl_c_deferred():
            batches = iter(loader)
        try:
            for batch in batches:
                yield {
                    k: v.to(self.device, non_blocking=non_blocking)
                    if isinstance(v, torch.Tensor)
                    else v
                    for k, v in batch.items()
                }
        finally:
            # Closed early (a failed validation): its workers end now, not when the garbage
            # collector reaches the iterator. Persistent workers stay: the loader keeps them
            # (and this iterator) for its next pass.
            shutdown = getattr(batches, "_shutdown_workers", None)
            if shutdown is not None and not getattr(loader, "persistent_workers", False):
                shutdown()

    def sync(self) -> None:
        pass

    def reduce_step_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        if self.world_size > 1:
            with collective("a sum over the processes"):
                dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def reduce_host_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.reduce_step_sum(tensor.to(self.device)).cpu()

    def broadcast_object(self, obj: Any) -> Any:
        if self.world_size == 1:
            return obj
        box = [obj]
        with collective("a broadcast from process 0"):
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            with collective("a barrier"):
                dist.barrier()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if not self._bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def compile_count(self) -> int | None:
        return None

    def peak_memory_gib(self) -> float | None:
        if self.kind != "cuda":
            return None
        return torch.cuda.max_memory_allocated(self.device) / 2**30

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            if dist.get_backend() == "gloo":
                # Gloo aborts a process ("terminate called without an active exception", exit
                # 134) when its group is torn down while a peer's last collective is still in
                # flight: 1 in ~5 refusals agreed at setup did so. A barrier first; one that
                # fails (a peer gone) or times out only means there is nobody left to wait for.
                with contextlib.suppress(RuntimeError):
                    dist.monitored_barrier(timeout=CLOSE_BARRIER)
            dist.destroy_process_group()
