"""Encoder, predictor and JEPA pieces: shapes, positions, presets, EMA, optimizer groups."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from octtrain.config.pretrain import OptimConfig, ScheduleConfig
from octtrain.config.sections import PRESETS, ModelConfig
from octtrain.models.jepa import build_student, ema_update, jepa_loss, make_target
from octtrain.models.vit3d import ViT3D, encoder_from_config, sincos_3d
from octtrain.train.optim import pretrain_optimizer

CFG = ModelConfig(preset="tiny", input_shape=(8, 32, 32), patch=(4, 8, 8))


def test_encoder_keeps_only_the_given_tokens() -> None:
    encoder = encoder_from_config(CFG)
    assert encoder.grid == (2, 4, 4) and encoder.num_patches == 32
    x = torch.randn(3, 1, 8, 32, 32)
    assert encoder(x).shape == (3, 32, 48)
    keep = torch.tensor([[0, 5, 9], [1, 2, 3], [31, 30, 29]])
    kept = encoder(x, keep)
    assert kept.shape == (3, 3, 48)


def test_encoder_tokens_depend_on_their_own_patch_and_position() -> None:
    encoder = encoder_from_config(CFG).eval()
    x = torch.zeros(1, 1, 8, 32, 32)
    out = encoder.patch_embed(x).flatten(2).transpose(1, 2) + encoder.pos_embed
    assert torch.unique(out.round(decimals=5), dim=1).shape[1] == 32  # positions tell tokens apart


def test_sincos_positions_are_distinct_and_fixed() -> None:
    pos = sincos_3d((2, 4, 4), 48)
    assert pos.shape == (32, 48)
    assert torch.cdist(pos, pos).fill_diagonal_(1.0).min() > 0.1
    legacy = encoder_from_config(dataclasses.replace(CFG, pos_embed="sincos"))
    assert "pos_embed" not in dict(legacy.named_parameters())
    assert "pos_embed" not in legacy.state_dict()  # old checkpoints never saved it


def test_learned_positions_start_at_dinov2_scale() -> None:
    encoder = encoder_from_config(CFG)
    pos = dict(encoder.named_parameters())["pos_embed"]
    assert pos.shape == (1, 32, 48)
    assert 0.015 < float(pos.detach().std()) < 0.025


def test_student_predicts_k_target_features() -> None:
    student = build_student(CFG)
    x = torch.randn(2, 1, 8, 32, 32)
    context = torch.arange(20).repeat(2, 1)
    target = torch.arange(20, 32).repeat(2, 1)
    assert student(x, context, target).shape == (2, 12, 48)


def test_input_shape_must_divide_by_patch() -> None:
    with pytest.raises(ValueError, match="not divisible"):
        ViT3D((8, 30, 32), (4, 8, 8), 48, 1, 3)


def test_presets_have_the_advertised_encoder_sizes() -> None:
    def count(preset: str) -> float:
        with torch.device("meta"):
            enc = encoder_from_config(ModelConfig(preset=preset, input_shape=(64, 384, 384)))
        # The learned position table grows with the input shape, not the preset (4.7M here).
        return sum(p.numel() for n, p in enc.named_parameters() if n != "pos_embed") / 1e6

    assert 27 < count("vit29m") < 31
    assert 84 < count("vit90m") < 92
    assert count("tiny") < 0.2
    assert set(PRESETS) >= {"tiny", "small", "vit29m", "vit90m"}


def test_losses_per_sample() -> None:
    a, b = torch.zeros(2, 3, 4), torch.ones(2, 3, 4)
    b[1] *= 2
    assert torch.allclose(jepa_loss(a, b, "l1"), torch.tensor([1.0, 2.0]))
    assert torch.allclose(jepa_loss(a, b, "mse"), torch.tensor([1.0, 4.0]))
    assert jepa_loss(a.bfloat16(), b.bfloat16(), "l1").dtype == torch.float32


def test_ema_moves_the_target_towards_the_online_encoder() -> None:
    online = encoder_from_config(CFG)
    target = make_target(online)
    assert all(not p.requires_grad for p in target.parameters())
    with torch.no_grad():
        for p in online.parameters():
            p.add_(1.0)
    before = [p.clone() for p in target.parameters()]
    ema_update(target, online, momentum=0.9)
    for b, t, o in zip(before, target.parameters(), online.parameters(), strict=True):
        assert torch.allclose(t, 0.9 * b + 0.1 * o, atol=1e-6)
    ema_update(target, online, momentum=1.0)  # momentum 1: frozen
    assert torch.allclose(next(target.parameters()), next(iter(target.parameters())))


def test_no_weight_decay_on_biases_and_norms() -> None:
    student = build_student(CFG)
    optimizer = pretrain_optimizer(student, OptimConfig(weight_decay=0.05))
    decay, plain = optimizer.param_groups
    assert decay["apply_wd"] and not plain["apply_wd"] and plain["weight_decay"] == 0.0
    names = {id(p): n for n, p in student.named_parameters()}
    assert all(p.ndim >= 2 for p in decay["params"])
    plain_names = [names[id(p)] for p in plain["params"]]
    assert any(n.endswith("norm1.weight") for n in plain_names)
    assert any(n.endswith("qkv.bias") for n in plain_names)
    assert len(decay["params"]) + len(plain["params"]) == len(list(student.parameters()))


def test_target_encoder_stays_in_eval_mode_and_mask_token_starts_at_zero() -> None:
    cfg = ModelConfig(preset="tiny", input_shape=(8, 32, 32), patch=(4, 8, 8), drop_path=0.1)
    student = build_student(cfg)
    target = make_target(student.encoder)
    student.train()
    assert not target.training and not any(m.training for m in target.modules())
    assert torch.count_nonzero(student.predictor.mask_token) == 0
    x = torch.randn(2, 1, 8, 32, 32)
    assert torch.equal(target(x), target(x))  # no drop path, no dropout: deterministic


def test_ema_never_reaches_one() -> None:
    assert ScheduleConfig().ema_end < 1.0
    with pytest.raises(ValueError, match="ema_end < 1"):
        ScheduleConfig(ema_end=1.0)
