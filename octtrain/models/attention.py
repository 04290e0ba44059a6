"""The attention kernel the transformer blocks call, chosen per config and device.

``attend(q, k, v, kind, block)`` takes ``[B, H, N, Dh]`` queries, keys and values and returns
``softmax(q k^T / sqrt(Dh)) v``. ``kind`` is ``model.attention``:

- ``sdpa``: torch's fused kernel (flash / memory-efficient on CUDA and CPU);
- ``blocked``: exact attention over chunks of ``block`` query rows that never holds the
  ``N x N`` matrix, in the forward or the backward pass (the backward recomputes each chunk's
  probabilities from the saved row log-sum-exp, as FlashAttention does); for XLA devices that have
  no fused kernel, where the materialized matrix is 2.7 GB per layer at 9,216 tokens;
- ``flash``: torch_xla's Pallas FlashAttention, TPU only;
- ``math``: the plain materialized reference;
- ``auto``: sdpa on CPU and CUDA, flash on TPU, blocked on other XLA devices (XLA:CPU).

torch_xla is imported here only when an XLA device asks, lazily, so CPU/CUDA installs never need
it (``runtime/xla.py`` owns everything else about XLA).
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


def resolve(kind: str, device: torch.device) -> str:
    """The concrete kernel (sdpa, blocked, flash, math) ``kind`` means on ``device``."""
    if kind == "flash":
        device_type, kernel = _xla_flash() if device.type == "xla" else ("", None)
        if kernel is None or device_type != "TPU":
            raise ConfigError(
                f"model.attention 'flash' needs torch_xla's flash kernel on a TPU, not {device} "
                "(use auto, sdpa or blocked)"
            )
        return kind
    if kind != "auto":
        return kind
    if device.type != "xla":
        return "sdpa"
    device_type, kernel = _xla_flash()
    return "flash" if kernel is not None and device_type == "TPU" else "blocked"


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in at least float32: softmax and gradient sums in bf16 would lose too much."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _fence(tensors: list[torch.Tensor]) -> None:
    """On XLA, an optimization barrier: the next chunk's work waits for this chunk's results.

    Without it XLA sees independent chunks, may schedule all their ``block x N`` buffers live at
    once and may merge (CSE) the backward's recomputation with the forward's scores, both of which
    bring back the whole matrix (measured: 38 GiB for vit29m at 9,216 tokens). Elsewhere a no-op:
    eager execution already runs the chunks one by one.
    """
    if tensors[0].device.type == "xla":
        import torch_xla.core.xla_model as xm

        xm.optimization_barrier_(tensors)


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
        outs, lses = [], []
        kc, vc = k.clone(), v.clone()  # fenced copies: k and v themselves are saved untouched
        for start in range(0, q.shape[-2], block):
            scores = _wide(q[..., start : start + block, :] @ kc.transpose(-2, -1)) * scale
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            outs.append(torch.exp(scores - lse).to(v.dtype) @ vc)
            lses.append(lse)
            _fence([outs[-1], lse, kc, vc])
        out = torch.cat(outs, dim=-2)
        ctx.save_for_backward(q, k, v, out, torch.cat(lses, dim=-2))
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        block: int = ctx.block
        scale = q.shape[-1] ** -0.5
        kf, vf, gf = _wide(k), _wide(v), _wide(grad_out)
        # Scaling k (not the scores, as the forward does) keeps the recomputed scores a different
        # expression, so XLA's CSE cannot merge them with the forward's and keep those alive.
        ks = kf * scale
        delta = (gf * _wide(out)).sum(dim=-1, keepdim=True)  # rowsum(dO * O) = rowsum(P * dP)
        dqs, dk, dv = [], torch.zeros_like(kf), torch.zeros_like(vf)
        for start in range(0, q.shape[-2], block):
            rows = slice(start, start + block)
            qc, gc = _wide(q[..., rows, :]), gf[..., rows, :]
            p = torch.exp(qc @ ks.transpose(-2, -1) - lse[..., rows, :])
            dv = dv + p.transpose(-2, -1) @ gc
            ds = p * (gc @ vf.transpose(-2, -1) - delta[..., rows, :])
            dqs.append(ds @ ks)
            dk = dk + ds.transpose(-2, -1) @ qc * scale
            _fence([dqs[-1], dk, dv, ks, vf, gf, delta, lse])
        dq = torch.cat(dqs, dim=-2)
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
        return kernel(q, k, v, sm_scale=1.0 / math.sqrt(q.shape[-1]))
    return math_attention(q, k, v)
