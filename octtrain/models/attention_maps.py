"""The last block's self-attention, read through any wrapper (DDP, FSDP, ``torch.compile``).

A wrapper hides the model's own methods (FSDP hid the users' ``get_last_selfattention``), but
never its submodules: ``named_modules`` walks through ``.module`` (DDP), ``._orig_mod``
(compile) and FSDP's wrapped module alike. ``AttentionCapture`` puts a forward hook on the last
``Attention`` module found there and recomputes that layer's softmax weights from the input the
hook sees; the caller runs the *wrapper's* forward, so sharded parameters are gathered and the
compiled graph is what runs. Only the CLS query's row is kept: ``[B, heads, N]`` over the patches.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch import nn

from octtrain.models.vit3d import Attention

WRAPPER_ATTRIBUTES = ("module", "_orig_mod", "_fsdp_wrapped_module")


def unwrap_all(model: nn.Module) -> nn.Module:
    """The innermost model under any stack of DDP / FSDP / compile wrappers."""
    seen = 0
    while seen < 8:
        for name in WRAPPER_ATTRIBUTES:
            inner = getattr(model, name, None)
            if isinstance(inner, nn.Module):
                model = inner
                break
        else:
            return model
        seen += 1
    return model


def eager(model: nn.Module) -> nn.Module:
    """``model`` without its ``torch.compile`` layers; DDP and FSDP wrappers kept (a DDP around
    a compiled module gives way to it: without a graph, DDP adds nothing to a forward)."""
    for _ in range(8):
        orig = getattr(model, "_orig_mod", None)
        inner = getattr(model, "module", None)
        if isinstance(orig, nn.Module):
            model = orig
        elif isinstance(inner, nn.Module) and isinstance(
            getattr(inner, "_orig_mod", None), nn.Module
        ):
            model = inner
        else:
            break
    return model


def last_attention(model: nn.Module) -> Attention:
    """The last ``Attention`` module of ``model`` (wrapped or not), by type."""
    found = [m for m in unwrap_all(model).modules() if isinstance(m, Attention)]
    if not found:
        raise ValueError(f"{type(model).__name__} has no Attention module")
    return found[-1]


def cls_attention(module: Attention, x: torch.Tensor) -> torch.Tensor:
    """Softmax attention of the CLS token (token 0) to the patches: ``[B, heads, N - 1]``."""
    b, n, d = x.shape
    qkv: torch.Tensor = module.qkv(x).reshape(b, n, 3, module.num_heads, d // module.num_heads)
    q, k = qkv[:, :1, 0], qkv[:, :, 1]  # [B, 1, H, Dh], [B, N, H, Dh]
    scores = torch.einsum("bqhd,bnhd->bhqn", q.float(), k.float()) / q.shape[-1] ** 0.5
    weights: torch.Tensor = scores.softmax(dim=-1)
    return weights[:, :, 0, 1:]


class AttentionCapture:
    """``with AttentionCapture(wrapped) as cap: out = cap(x)`` then ``cap.weights``
    ``[B, H, N]``; ``out`` is what the wrapped model returned."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.module = last_attention(model)
        self.weights: torch.Tensor | None = None
        self._handle: Any = None

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        assert isinstance(module, Attention)
        with torch.no_grad():
            self.weights = cls_attention(module, args[0].detach()).cpu()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped model's forward (compiled layers stepped over), capturing on the way."""
        return eager(self.model)(*args, **kwargs)

    def __enter__(self) -> AttentionCapture:
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._handle.remove()
