"""The attention kernel the transformer blocks call, chosen per config and device.

``attend(q, k, v, kind, block)`` takes ``[B, H, N, Dh]`` queries, keys and values and returns
``softmax(q k^T / sqrt(Dh)) v``. ``kind`` is ``model.attention``:

- ``sdpa``: torch's fused kernel (flash / memory-efficient on CUDA and CPU);
- ``blocked``: exact attention over chunks of ``block`` query rows that never holds the
  ``N x N`` matrix, in the forward or the backward pass (the backward recomputes each chunk's
  probabilities from the saved row log-sum-exp, as FlashAttention does); for XLA devices that have
  no fused kernel, where the materialized matrix is 2.7 GB per layer at 9,216 tokens;
- ``flash``: torch_xla's Pallas FlashAttention, TPU only, and only with the Pallas dependencies
  (jax, jaxlib: ``torch_xla[pallas]``; ``custom_kernel`` imports without them and fails at the
  first call). Under SPMD it gets the batch-axis partition spec and the global mesh when the
  batch divides the mesh, so each chip computes its own samples' attention (unpartitioned, XLA
  would replicate the custom call: every chip doing the whole global batch); the lengths it
  takes are checked before compiling (``models/flash_blocks.py``);
- ``math``: the plain materialized reference;
- ``auto``: sdpa on CPU and CUDA, flash on TPU when Pallas imports, blocked on other XLA devices
  (XLA:CPU) and on a TPU without Pallas. ``choose`` says which and why.

torch_xla (and jax) are imported here only when an XLA device asks, lazily, so CPU/CUDA installs
never need them (``runtime/xla.py`` owns everything else about XLA).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from octtrain.errors import ConfigError

FlashFn = Callable[..., torch.Tensor]


@functools.cache
def _xla_flash() -> tuple[str, FlashFn | None]:
    """(the XLA runtime's device type, torch_xla's flash kernel or None when not importable)."""
    try:
        import torch_xla.runtime as xr
    except ImportError:
        return "", None
    try:
        from torch_xla.experimental.custom_kernel import flash_attention
    except ImportError:
        return str(xr.device_type()), None
    return str(xr.device_type()), flash_attention


@functools.cache
def _pallas_missing() -> str | None:
    """Why the Pallas kernels cannot run here (None: jax, jaxlib and JAX's flash kernel import)."""
    try:
        # torch_xla's guard: the XLA runtime must hold the TPU before JAX is imported.
        from torch_xla.experimental.custom_kernel import jax_import_guard

        jax_import_guard()
        import jax
        import jax.experimental.pallas  # noqa: F401
        import jaxlib  # noqa: F401
        from jax.experimental.pallas.ops.tpu import flash_attention  # noqa: F401
    except ImportError as exc:
        return f"{exc} (install torch_xla[pallas])"
    return None


def choose(kind: str, device: torch.device) -> tuple[str, str]:
    """(the concrete kernel ``kind`` means on ``device``: sdpa, blocked, flash or math; why)."""
    if kind not in ("flash", "auto"):
        return kind, "set in model.attention"
    if device.type != "xla":
        if kind == "flash":
            raise ConfigError(
                f"model.attention 'flash' needs torch_xla's flash kernel on a TPU, not {device} "
                "(use auto, sdpa or blocked)"
            )
        return "sdpa", f"auto on {device.type}"
    device_type, kernel = _xla_flash()
    missing = "torch_xla's custom_kernel does not import" if kernel is None else None
    if device_type != "TPU":
        missing = f"the XLA device is {device_type or 'unknown'}, not a TPU"
    missing = missing or _pallas_missing()
    if kind == "flash":
        if missing:
            raise ConfigError(f"model.attention 'flash' cannot run: {missing}")
        return "flash", "set in model.attention"
    if missing:
        return "blocked", f"auto: no flash, {missing}"
    return "flash", "auto on a TPU with Pallas"


def resolve(kind: str, device: torch.device) -> str:
    """The concrete kernel (sdpa, blocked, flash, math) ``kind`` means on ``device``."""
    return choose(kind, device)[0]


def flash_sharding(batch: int) -> tuple[tuple[str | None, ...] | None, Any]:
    """(partition spec, mesh) for torch_xla's flash call on a ``batch``: the batch axis over the
    global mesh under SPMD when the mesh divides the batch; (None, None) otherwise (no SPMD, or
    a batch such as the one-volume picture forward that cannot be split)."""
    import torch_xla.runtime as xr

    if not xr.is_spmd():
        return None, None
    import torch_xla.distributed.spmd as xs

    mesh = xs.get_global_mesh()
    if mesh is None or batch % int(mesh.mesh_shape[0]):
        return None, None
    return (str(mesh.axis_names[0]), None, None, None), mesh


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in at least float32: softmax and gradient sums in bf16 would lose too much."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


Tree = Any  # a tensor or a tuple of tensors
Step = Callable[[Tree, Tree], tuple[Tree, Tree]]


def _chunks(t: torch.Tensor, block: int, fill: float = 0.0) -> torch.Tensor:
    """``[..., N, C]`` as ``[ceil(N / block), ..., block, C]``, the last chunk padded with
    ``fill`` (padded query rows are dropped from the result and carry zero gradients)."""
    pad = -t.shape[-2] % block
    t = F.pad(t, (0, 0, 0, pad), value=fill)
    chunked = t.reshape(*t.shape[:-2], t.shape[-2] // block, block, t.shape[-1])
    return chunked.movedim(-3, 0)


def _unchunk(t: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of ``_chunks``: ``[..., N, C]`` without the padding."""
    return t.movedim(0, -3).flatten(-3, -2)[..., :n, :]


def _scan(step: Step, carry: Tree, xs: Tree) -> tuple[Tree, Tree]:
    """``step`` over the leading dimension of ``xs``, carrying ``carry``; stacked outputs.

    On XLA this is torch_xla's ``scan``, one While loop: the loop body's buffers are reused
    for every chunk. Unrolled chunks are independent to XLA's scheduler, which (on XLA:CPU, which
    also drops optimization barriers) keeps all of them live: measured, 38 GiB for vit29m at
    9,216 tokens, as much as the materialized matrix. Elsewhere a Python loop: eager execution
    already frees each chunk before the next.
    """
    first = xs[0] if isinstance(xs, tuple) else xs
    if first.device.type == "xla":
        from torch_xla.experimental.scan import scan

        return scan(step, carry, xs)  # type: ignore[no-any-return]
    ys = []
    for i in range(first.shape[0]):
        carry, y = step(carry, tuple(x[i] for x in xs) if isinstance(xs, tuple) else xs[i])
        ys.append(y)
    if isinstance(ys[0], tuple):
        return carry, tuple(torch.stack(parts) for parts in zip(*ys, strict=True))
    return carry, torch.stack(ys)


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The reference: the whole ``N x N`` probability matrix, softmax in (at least) float32."""
    scores = _wide(q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


class _BlockedAttention(torch.autograd.Function):
    """Exact attention, ``block`` query rows at a time; saves q, k, v, out and the row
    log-sum-exp (``N`` floats per head) instead of the probabilities."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int
    ) -> torch.Tensor:
        scale = q.shape[-1] ** -0.5

        def step(kv: Tree, qc: torch.Tensor) -> tuple[Tree, Tree]:
            scores = _wide(qc @ kv[0].transpose(-2, -1)) * scale
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            return kv, (torch.exp(scores - lse).to(v.dtype) @ kv[1], lse)

        _, (outs, lses) = _scan(step, (k, v), _chunks(q, block))
        out, lse = _unchunk(outs, q.shape[-2]), _unchunk(lses, q.shape[-2])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        block: int = ctx.block
        scale = q.shape[-1] ** -0.5
        gf = _wide(grad_out)
        delta = (gf * _wide(out)).sum(dim=-1, keepdim=True)  # rowsum(dO * O) = rowsum(P * dP)

        def step(carry: Tree, x: Tree) -> tuple[Tree, Tree]:
            ks, vf, dk, dv = carry
            qc, gc, lc, dc = x
            p = torch.exp(qc @ ks.transpose(-2, -1) - lc)  # this chunk's probabilities, again
            ds = p * (gc @ vf.transpose(-2, -1) - dc)
            dk = dk + ds.transpose(-2, -1) @ qc * scale
            return (ks, vf, dk, dv + p.transpose(-2, -1) @ gc), ds @ ks

        kf, vf = _wide(k), _wide(v)
        # Padded rows (zero q, zero gradient, zero lse and delta) add nothing to dk and dv.
        xs = tuple(_chunks(t, block) for t in (_wide(q), gf, lse, delta))
        init = (kf * scale, vf, torch.zeros_like(kf), torch.zeros_like(vf))
        (_, _, dk, dv), dqs = _scan(step, init, xs)
        dq = _unchunk(dqs, q.shape[-2])
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def blocked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int
) -> torch.Tensor:
    """Exact attention that holds at most ``block x N`` scores per head at a time."""
    return _BlockedAttention.apply(q, k, v, block)  # type: ignore[no-untyped-call,no-any-return]


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str, block: int
) -> torch.Tensor:
    """Attention of ``q, k, v [B, H, N, Dh]`` with the kernel ``kind`` resolves to on q's device."""
    choice = resolve(kind, q.device)
    if choice == "sdpa":
        return F.scaled_dot_product_attention(q, k, v)
    if choice == "blocked":
        return blocked_attention(q, k, v, block)
    if choice == "flash":
        kernel = _xla_flash()[1]
        assert kernel is not None  # resolve() checked
        spec, mesh = flash_sharding(q.shape[0])
        scale = 1.0 / math.sqrt(q.shape[-1])
        return kernel(q, k, v, sm_scale=scale, partition_spec=spec, mesh=mesh)
    return math_attention(q, k, v)
