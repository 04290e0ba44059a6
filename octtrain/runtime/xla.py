"""The XLA backend (TPU; XLA:CPU in tests): the one module that imports torch_xla up front
(models/attention.py and models/vit3d.py import its kernels lazily, on XLA devices only).

One process per host drives every device it sees. With more than one device in the job the
backend switches to SPMD data parallelism: a 1-D device mesh ``('data',)`` over all devices,
parameters replicated, each batch sharded along dim 0 as torch_xla's ``ParallelLoader`` (the
engine of ``MpDeviceLoader``) sends it to the device. The compiler then partitions the one
traced graph and inserts the gradient all-reduce itself, so the loop stays the single-device
loop. With one device, no SPMD.

Under SPMD ``world_size`` counts devices (data-parallel replicas) while ``process_index`` /
``process_count`` count host processes: each host loads ``global_batch / process_count`` samples
and the per-host batches form the global batch (``minibatch`` sharding on multi-host jobs).

The loop reads a step's values back only after the next step was launched (``train/loop.py``),
so a step is one graph and no ``.item()`` forces an early execution. ``compile_count`` exposes
torch_xla's ``CompileTime`` metric: it must stop growing after the first steps, or shapes or
Python scalars are changing from step to step. With ``train.xla_cache_dir`` compiled programs
persist on local disk (torch_xla's persistent cache), so a restart skips the first compile.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch import nn
from torch_xla.distributed import xla_backend  # noqa: F401  (registers "xla://" for gloo)

from octtrain.runtime.handoff import carry_errors, raise_carried, run_within, within_or_exit
from octtrain.runtime.torch_backend import CLOSE_BARRIER

MESH_AXIS = "data"
AUTO_COMPILE_CACHE = "~/.cache/octtrain/xla"  # train.xla_cache_dir=auto on a TPU
CLOSE_TIMEOUT_S = 30.0  # for each loader thread to stop at close (a batch in flight may finish)
# For the device's pending work at close: the last step or a checkpoint's copy (seconds on a
# TPU); past it the host's peers are gone and the program never ends (exit 5, named).
DEVICE_WAIT_S = 300.0


class BatchDimSharding:
    """The loader's input sharding: every tensor of a batch split over the mesh along dim 0.

    ``xs.ShardingSpec(mesh, ('data', None, ...))`` fits one tensor rank only, and tensors of
    other ranks silently stay replicated; batches mix ranks (image ``[B, 1, D, H, W]``, label
    and index ``[B]``), so this keeps one ShardingSpec per rank. It offers the two members
    torch_xla's loader uses (``xla_spec``, ``minibatch``). Scalars stay replicated.
    """

    def __init__(self, mesh: xs.Mesh, minibatch: bool) -> None:
        self.mesh = mesh
        self.minibatch = minibatch
        self._specs: dict[int, xs.ShardingSpec] = {}

    def spec(self, rank: int) -> xs.ShardingSpec:
        """The ``('data', None, ...)`` ShardingSpec for tensors of ``rank`` dimensions."""
        if rank not in self._specs:
            partition = (MESH_AXIS,) + (None,) * (rank - 1)
            self._specs[rank] = xs.ShardingSpec(self.mesh, partition, minibatch=self.minibatch)
        return self._specs[rank]

    def xla_spec(self, tensor: torch.Tensor) -> Any:
        """torch_xla's per-tensor spec (None: replicate)."""
        if tensor.dim() == 0:
            return None
        return self.spec(tensor.dim()).xla_spec(tensor)


class DeviceLoader:
    """``MpDeviceLoader`` that its backend can stop: batches on the device, sharded as asked.

    torch_xla's loader keeps a background thread prefetching from the wrapped loader; on an
    endless training loader that thread outlives the loop (and dies noisily at interpreter exit,
    inside zarr's event loop). Each iteration's ``ParallelLoader`` is therefore registered with
    the backend, whose ``close()`` stops it (within ``CLOSE_TIMEOUT_S``: its own ``close`` joins
    the thread with no limit). The prefetch depths are small on purpose: a batch of full-size
    volumes is ~1 GB on the host, and torch_xla's defaults queue 16 of them on the host and 8 on
    the device.

    That thread turns the wrapped loader's exception into a quiet end of the pass in the main
    thread; the loader is therefore wrapped in ``carry_errors`` and the error item re-raised
    here, in the main thread, with its class and message (a ``DataError`` stays exit 4).
    """

    HOST_PREFETCH = 2
    DEVICE_PREFETCH = 2

    def __init__(
        self,
        loader: Iterable[dict[str, Any]],
        device: torch.device,
        sharding: BatchDimSharding | None,
        registry: list[pl.ParallelLoader],
    ) -> None:
        self.loader, self.device, self.sharding = loader, device, sharding
        self._registry = registry
        self._current: pl.ParallelLoader | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._current is not None:  # a new pass replaces the previous one, as MpDeviceLoader
            self._current.close()
            self._registry.remove(self._current)
        self._current = pl.ParallelLoader(
            carry_errors(self.loader),
            [self.device],
            loader_prefetch_size=self.HOST_PREFETCH,
            device_prefetch_size=self.DEVICE_PREFETCH,
            input_sharding=self.sharding,
        )
        self._registry.append(self._current)
        return self._batches(self._current)

    def _batches(self, parallel: pl.ParallelLoader) -> Iterator[dict[str, Any]]:
        try:
            for item in parallel.per_device_loader(self.device):
                batch: dict[str, Any] = raise_carried(item)
                yield batch
        finally:
            # A pass closed before its end (a validation that failed on some host: every host
            # stops at the same batch) releases its thread and the batches it holds on the
            # device now, not at the backend's close (one loader per failed validation).
            if parallel in self._registry:
                run_within(parallel.close, CLOSE_TIMEOUT_S, "torch_xla's loader thread")
                self._registry.remove(parallel)
            if self._current is parallel:
                self._current = None


class XlaBackend:
    """torch_xla on every device of the job: plain single device, or SPMD data parallel."""

    kind = "xla"

    def __init__(self, precision: str = "auto", compile_cache: str | None = None) -> None:
        if compile_cache == "auto":
            tpu = os.environ.get("PJRT_DEVICE", "").upper() == "TPU"
            compile_cache = AUTO_COMPILE_CACHE if tpu else None
        if compile_cache:
            # Before the runtime starts; every host keeps its own copy on its local disk.
            path = Path(compile_cache).expanduser()
            path.mkdir(parents=True, exist_ok=True)
            xr.initialize_cache(str(path), readonly=False)
        self.compile_cache = compile_cache
        devices: int = xr.global_runtime_device_count()
        self.spmd = devices > 1
        self.mesh: xs.Mesh | None = None
        if self.spmd:
            # Before any tensor reaches a device: tensors created earlier would be replicated.
            xr.use_spmd()
            self.mesh = xs.Mesh(np.arange(devices), (devices,), (MESH_AXIS,))
            xs.set_global_mesh(self.mesh)
        self.device: torch.device = torch_xla.device()
        self.world_size: int = devices
        self.process_index: int = xr.process_index()
        self.process_count: int = xr.process_count()
        self.rank = self.process_index
        # With ``minibatch`` sharding the per-host shards form one global array: the step's
        # tensors hold the global batch on every host (one device: the host batch is global).
        self.step_is_global = True
        self.device_type: str = xr.device_type() or "unknown"
        # auto: bf16 where XLA runs it natively (TPU); XLA:CPU only emulates it, slowly.
        self._bf16 = precision == "bf16" or (precision == "auto" and self.device_type == "TPU")
        self._gloo_ready = False
        self._loaders: list[pl.ParallelLoader] = []

    @property
    def is_main(self) -> bool:
        return self.process_index == 0

    def wrap_model(self, model: nn.Module) -> nn.Module:
        # Unannotated tensors are replicated under SPMD, which is data parallelism for the
        # parameters; sharding the inputs (wrap_loader) is all the partitioner needs.
        return model.to(self.device)

    def wrap_loader(self, loader: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        sharding = None
        if self.mesh is not None:
            sharding = BatchDimSharding(self.mesh, minibatch=self.process_count > 1)
        return DeviceLoader(loader, self.device, sharding, self._loaders)

    def sync(self) -> None:
        torch_xla.sync()

    def reduce_step_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        # The step's tensors are global arrays (SPMD, minibatch sharding): a sum over the batch
        # dimension already covers every device and host. Single device: nothing either.
        return tensor.clone()

    def reduce_host_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.detach().cpu().clone()
        if self.process_count > 1:
            self._host_group()
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        if self.process_count == 1:
            return obj
        self._host_group()
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _host_group(self) -> None:
        # Multi-host SPMD has no XLA-level collective for host values outside a graph;
        # torch_xla's recipe is a gloo group rendezvousing through "xla://".
        if not self._gloo_ready:
            dist.init_process_group("gloo", init_method="xla://")
            self._gloo_ready = True

    def barrier(self) -> None:
        torch_xla.sync()
        xm.wait_device_ops()
        if self.process_count == 1:
            return
        self._host_group()
        dist.barrier()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if not self._bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type="xla", dtype=torch.bfloat16)

    def compile_count(self) -> int | None:
        data = met.metric_data("CompileTime")
        return 0 if data is None else int(data[0])

    def peak_memory_gib(self) -> float | None:
        return None  # XLA's per-program figures come from its buffer assignment (bench_model)

    def close(self) -> None:
        for loader in self._loaders:
            run_within(loader.close, CLOSE_TIMEOUT_S, "torch_xla's loader thread")
        self._loaders.clear()
        within_or_exit(xm.wait_device_ops, DEVICE_WAIT_S, "the device's pending work at close")
        if self._gloo_ready and dist.is_initialized():
            # As the torch backend's close: a bounded barrier first (gloo aborts a process whose
            # group is torn down while a peer's last collective is in flight); one that fails or
            # times out means nobody is left to wait for.
            with contextlib.suppress(RuntimeError):
                dist.monitored_barrier(timeout=CLOSE_BARRIER)
            dist.destroy_process_group()
            self._gloo_ready = False
