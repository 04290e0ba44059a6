"""Run in its own process by test_xla_attention.py (the pytest process never imports
torch_xla): the kernel ``auto`` picks on XLA:CPU, and the largest differences between the
scan-based blocked kernel and the materialized reference, and between checkpointing on and off,
on XLA. Prints one ``XLA-RESULT {json}`` line."""

from __future__ import annotations

import json

import torch
import torch_xla

from octtrain.config.sections import ModelConfig
from octtrain.models.attention import attend, resolve
from octtrain.models.jepa import build_student

RESULT_PREFIX = "XLA-RESULT "


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b) > 0
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def blocked_vs_math() -> float:
    device = torch_xla.device()
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 3, 37, 8, generator=gen) for _ in range(4))
    results = {}
    for kind in ("math", "blocked"):
        qq, kk, vv = (t.to(device).requires_grad_() for t in (q, k, v))
        out = attend(qq, kk, vv, kind, 8)  # 37 rows over blocks of 8: a padded last chunk
        out.backward(grad_out.to(device))
        torch_xla.sync()
        results[kind] = [t.cpu() for t in (out, qq.grad, kk.grad, vv.grad) if t is not None]
    return max_diff(results["blocked"], results["math"])


def checkpointing_on_vs_off() -> dict[str, float]:
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
    return {
        "loss": abs(float(plain_loss) - float(ckpt_loss)),
        "grads": max_diff(ckpt_grads, plain_grads),
        "grad_count": float(len(plain_grads)),
    }


if __name__ == "__main__":
    result = {
        "auto": resolve("auto", torch_xla.device()),
        "blocked_vs_math": blocked_vs_math(),
        "checkpointing": checkpointing_on_vs_off(),
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)
