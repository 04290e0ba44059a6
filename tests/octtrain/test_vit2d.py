"""The 2D ViT and the attention reader: shapes, the mask token, and the last block's CLS
attention read identically through DDP, torch.compile and FSDP wrappers."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from octtrain.models.attention_maps import (
    AttentionCapture,
    cls_attention,
    unwrap_all,
)
from octtrain.models.vit2d import ViT2D, build_vit2d
from octtrain.models.vit3d import Block


def _model() -> ViT2D:
    torch.manual_seed(0)
    return build_vit2d("tiny", 5)


def test_global_and_local_crops_share_weights_and_give_cls_and_patches() -> None:
    m = _model()
    cls, patches = m(torch.randn(2, 5, 32, 32))
    assert cls.shape == (2, 48) and patches.shape == (2, 64, 48)  # patch 4: 8 x 8 grid
    cls, patches = m(torch.randn(3, 5, 16, 16))
    assert cls.shape == (3, 48) and patches.shape == (3, 16, 48)
    with pytest.raises(ValueError, match="not divisible"):
        m(torch.randn(1, 5, 30, 30))


def test_vits8_preset_is_vit_small() -> None:
    m = build_vit2d("vits8", 5)
    assert (m.embed_dim, len(m.blocks), m.num_heads, m.patch) == (384, 12, 6, 8)
    assert 21e6 < sum(p.numel() for p in m.parameters()) < 22e6


def test_fully_masked_crops_do_not_see_their_pixels() -> None:
    m = _model().eval()
    a, b = torch.randn(1, 5, 32, 32), torch.randn(1, 5, 32, 32)
    all_masked = torch.ones(1, 64, dtype=torch.bool)
    assert torch.allclose(m(a, all_masked)[0], m(b, all_masked)[0])
    none = torch.zeros(1, 64, dtype=torch.bool)
    assert torch.allclose(m(a, none)[0], m(a)[0])
    assert not torch.allclose(m(a)[0], m(b)[0])


def _reference(model: ViT2D, x: torch.Tensor) -> torch.Tensor:
    """The CLS row of the last block's attention, computed by hand on the bare model."""
    seen: list[torch.Tensor] = []
    block = model.blocks[-1]
    assert isinstance(block, Block)
    attn = block.attn
    h = attn.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    with torch.no_grad():
        model(x)
    h.remove()
    return cls_attention(attn, seen[-1])


@pytest.fixture(scope="module")
def process_group() -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _wrappers() -> list[str]:
    return ["plain", "compile", "ddp", "fsdp", "ddp+compile"]


@pytest.mark.parametrize("kind", _wrappers())
def test_attention_is_read_through_any_wrapper(kind: str, process_group: None) -> None:
    model = _model().eval()
    x = torch.randn(2, 5, 32, 32)
    expected = _reference(model, x)
    wrapped: nn.Module = model
    if kind.startswith("ddp"):
        wrapped = nn.parallel.DistributedDataParallel(model)
    if kind.endswith("compile"):
        wrapped = torch.compile(wrapped, backend="eager")  # type: ignore[assignment]
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        wrapped = fully_shard(model)  # type: ignore[assignment]  # FSDP2: parameters become sharded DTensors
    assert unwrap_all(wrapped) is model
    with torch.no_grad():
        wrapped(torch.randn(2, 5, 32, 32))  # a step ran (and compiled) before the picture
    with torch.no_grad(), AttentionCapture(wrapped) as cap:
        out = cap(x)
    assert torch.allclose(out[0], model(x)[0], atol=1e-5)
    assert cap.weights is not None and cap.weights.shape == (2, 3, 64)
    assert torch.allclose(cap.weights, expected, atol=1e-5)
    # The hook is gone afterwards: a later forward does not overwrite the capture.
    before = cap.weights.clone()
    with torch.no_grad():
        wrapped(torch.randn(2, 5, 32, 32))
    assert torch.equal(cap.weights, before)
