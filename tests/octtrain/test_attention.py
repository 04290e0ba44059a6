"""Attention kernels agree (forward and gradients); checkpointing changes memory, not results."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from octtrain.cli import main
from octtrain.config.sections import ModelConfig
from octtrain.errors import ConfigError
from octtrain.models import attention
from octtrain.models.attention import attend, choose, resolve
from octtrain.models.jepa import build_student, jepa_loss

TINY = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "tiny.yaml"
KINDS = ("math", "sdpa", "blocked")


def _qkv(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize(("n", "block"), [(16, 4), (37, 8), (5, 64)])
def test_kernels_agree_forward_and_backward(n: int, block: int) -> None:
    # 37 tokens over blocks of 8 leaves a short last block; 5 over 64 is a single partial block.
    grad_out = torch.randn(2, 3, n, 8, dtype=torch.float64)
    results = {}
    for kind in KINDS:
        q, k, v = (t.clone().requires_grad_() for t in _qkv(n))
        out = attend(q, k, v, kind, block)
        out.backward(grad_out)
        results[kind] = (out, q.grad, k.grad, v.grad)
    for kind in ("sdpa", "blocked"):
        for got, want in zip(results[kind], results["math"], strict=True):
            assert got is not None and want is not None
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_blocked_gradients_pass_gradcheck() -> None:
    q, k, v = (t[:1, :1, :7].clone().requires_grad_() for t in _qkv(7))
    assert torch.autograd.gradcheck(lambda a, b, c: attend(a, b, c, "blocked", 3), (q, k, v))


def test_auto_is_sdpa_on_cpu_and_flash_needs_a_tpu() -> None:
    assert resolve("auto", torch.device("cpu")) == "sdpa"
    assert resolve("blocked", torch.device("cpu")) == "blocked"
    with pytest.raises(ConfigError, match="flash"):
        resolve("flash", torch.device("cpu"))


def test_config_rejects_unknown_attention() -> None:
    with pytest.raises(ConfigError, match="attention"):
        ModelConfig(attention="fast")
    with pytest.raises(ConfigError, match="attention_block"):
        ModelConfig(attention_block=0)


def _loss_and_grads(cfg: ModelConfig) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    student = build_student(cfg).train()
    x = torch.randn(2, 1, 8, 32, 32, generator=torch.Generator().manual_seed(1))
    context, target = torch.arange(20).repeat(2, 1), torch.arange(20, 32).repeat(2, 1)
    prediction = student(x, context, target)
    loss = jepa_loss(prediction, torch.ones_like(prediction), "l1").mean()
    loss.backward()  # type: ignore[no-untyped-call]
    return loss.detach(), [p.grad.clone() for p in student.parameters() if p.grad is not None]


@pytest.mark.parametrize("attention", ["sdpa", "blocked"])
def test_checkpointing_keeps_loss_and_gradients(attention: str) -> None:
    base = dict(preset="tiny", input_shape=(8, 32, 32), patch=(4, 8, 8), attention=attention)
    plain_loss, plain_grads = _loss_and_grads(ModelConfig(**base, attention_block=8))
    ckpt_loss, ckpt_grads = _loss_and_grads(
        ModelConfig(**base, attention_block=8, activation_checkpointing=True)
    )
    torch.testing.assert_close(ckpt_loss, plain_loss, rtol=0, atol=0)
    assert len(ckpt_grads) == len(plain_grads) > 0
    for got, want in zip(ckpt_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_checkpointing_recomputes_blocks_in_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each checkpointed block runs twice per training step (forward, then recompute in backward).
    calls = {"n": 0}
    import octtrain.models.vit3d as vit3d

    original = vit3d.Block.forward

    def counting(self: vit3d.Block, x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return original(self, x)

    monkeypatch.setattr(vit3d.Block, "forward", counting)
    cfg = ModelConfig(preset="tiny", input_shape=(8, 32, 32), patch=(4, 8, 8))
    _loss_and_grads(cfg)
    plain = calls["n"]
    calls["n"] = 0
    _loss_and_grads(ModelConfig(**{**cfg.__dict__, "activation_checkpointing": True}))
    assert plain == 3 and calls["n"] == 2 * plain  # tiny: 2 encoder + 1 predictor blocks


def _tpu(monkeypatch: pytest.MonkeyPatch, pallas_missing: str | None) -> torch.device:
    """An XLA device whose runtime says TPU, with or without the Pallas dependencies."""
    monkeypatch.setattr(attention, "_xla_flash", lambda: ("TPU", attention.math_attention))
    monkeypatch.setattr(attention, "_pallas_missing", lambda: pallas_missing)
    return torch.device("xla")


def test_auto_picks_flash_on_a_tpu_only_when_pallas_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    device = _tpu(monkeypatch, None)
    assert choose("auto", device) == ("flash", "auto on a TPU with Pallas")
    missing = "No module named 'jax' (install torch_xla[pallas])"
    device = _tpu(monkeypatch, missing)
    assert choose("auto", device) == ("blocked", f"auto: no flash, {missing}")
    with pytest.raises(ConfigError, match="No module named 'jax'"):
        choose("flash", device)


def test_pallas_check_reports_what_does_not_import() -> None:
    # This environment has no torch_xla: the check names the missing module, never raises.
    attention._pallas_missing.cache_clear()
    found = attention._pallas_missing()
    assert found is not None and "No module named" in found


def test_first_log_line_names_the_kernel_and_why(
    tiny_cache: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = ["pretrain", "--config", str(TINY), "--manifest", str(tiny_cache[0])]
    overrides = [f"train.output_dir={tmp_path}", "train.max_steps=1", "checkpoint.dir=None"]
    overrides.append("schedule.warmup_steps=1")  # no warning about a warm-up past the run
    with caplog.at_level(logging.INFO, logger="octtrain"):
        assert main(args + overrides) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "octtrain"]
    assert lines[0] == "attention: sdpa (auto on cpu)"


def test_finetuning_s_first_log_line_names_the_kernel_too(
    tiny_cache: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = TINY.parents[1] / "finetune" / "tiny.yaml"
    args = ["finetune", "--config", str(config), "--manifest", str(tiny_cache[0])]
    overrides = [f"train.output_dir={tmp_path}", "train.epochs=1", "init_encoder=random"]
    with caplog.at_level(logging.INFO, logger="octtrain"):
        assert main([*args, *overrides, "checkpoint.dir=None"]) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "octtrain"]
    assert lines[0] == "attention: sdpa (auto on cpu)"
