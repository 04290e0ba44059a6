"""Attention and checkpointing on XLA:CPU: the scan-based blocked kernel and torch_xla's checkpoint
give the eager reference's results."""

from __future__ import annotations

import pytest
import torch

from octtrain.config.sections import ModelConfig
from octtrain.models.attention import attend, resolve
from octtrain.models.jepa import build_student

pytestmark = pytest.mark.xla
torch_xla = pytest.importorskip("torch_xla")


def test_auto_is_blocked_on_xla_cpu() -> None:
    assert resolve("auto", torch_xla.device()) == "blocked"


def test_blocked_matches_math_forward_and_backward_on_xla() -> None:
    device = torch_xla.device()
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 3, 37, 8, generator=gen) for _ in range(4))
    results = {}
    for kind in ("math", "blocked"):
        qq, kk, vv = (t.to(device).requires_grad_() for t in (q, k, v))
        out = attend(qq, kk, vv, kind, 8)  # 37 rows over blocks of 8: a padded last chunk
        out.backward(grad_out.to(device))
        torch_xla.sync()
        results[kind] = [t.cpu() for t in (out, qq.grad, kk.grad, vv.grad)]
    for got, want in zip(results["blocked"], results["math"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_checkpointing_keeps_loss_and_gradients_on_xla() -> None:
    device = torch_xla.device()
    found = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        cfg = ModelConfig(
            preset="tiny", input_shape=(8, 32, 32), patch=(4, 8, 8), activation_checkpointing=ckpt
        )
        student = build_student(cfg).to(device).train()
        x = torch.randn(1, 1, 8, 32, 32, generator=torch.Generator().manual_seed(1)).to(device)
        context, target = torch.arange(8)[None].to(device), torch.arange(8, 32)[None].to(device)
        loss = student(x, context, target).abs().mean()
        loss.backward()  # type: ignore[no-untyped-call]
        torch_xla.sync()
        grads = [p.grad.cpu() for p in student.parameters() if p.grad is not None]
        found.append((loss.cpu(), grads))
    (plain_loss, plain_grads), (ckpt_loss, ckpt_grads) = found
    torch.testing.assert_close(ckpt_loss, plain_loss)
    assert len(ckpt_grads) == len(plain_grads) > 0
    for got, want in zip(ckpt_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
