"""Heads: every kind and pooling, the CLS guard, and a frozen encoder that really stays frozen."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from octtrain.config.finetune import HeadConfig
from octtrain.config.sections import ModelConfig
from octtrain.errors import ConfigError
from octtrain.models.classifier import build_classifier
from octtrain.models.heads import AttentivePooler, ClassifierHead
from octtrain.models.vit3d import encoder_from_config

DIM, C = 48, 4


def _encoder() -> nn.Module:
    return encoder_from_config(ModelConfig(preset="tiny", input_shape=(8, 32, 32), patch=(4, 8, 8)))


@pytest.mark.parametrize(
    ("kind", "pooling"),
    [("linear", "mean"), ("mlp", "mean"), ("linear", "attentive"), ("attentive", "attentive")],
)
def test_head_kinds_and_poolings_give_logits(kind: str, pooling: str) -> None:
    torch.manual_seed(0)
    model = build_classifier(_encoder(), HeadConfig(kind=kind, pooling=pooling), DIM, C)
    logits = model(torch.randn(3, 1, 8, 32, 32))
    assert logits.shape == (3, C) and torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(p.grad is not None for p in model.head.parameters())


def test_mlp_head_has_hidden_layer_gelu_and_dropout() -> None:
    head = ClassifierHead(HeadConfig(kind="mlp", hidden_dim=32, dropout=0.3), DIM, C, False)
    kinds = [type(m) for m in head.classifier]
    assert kinds == [nn.Linear, nn.GELU, nn.Dropout, nn.Linear]
    assert head.classifier[0].out_features == 32
    assert head.classifier[2].p == pytest.approx(0.3)


def test_cls_pooling_needs_a_cls_token() -> None:
    with pytest.raises(ConfigError, match="no CLS token"):
        build_classifier(_encoder(), HeadConfig(pooling="cls"), DIM, C)
    head = ClassifierHead(HeadConfig(pooling="cls"), DIM, C, has_cls=True)
    tokens = torch.zeros(2, 5, DIM)
    tokens[:, 0] = 1.0  # only the CLS token carries signal
    assert torch.equal(head.pool(tokens), tokens[:, 0])
    # mean pooling skips the CLS token when there is one
    mean_head = ClassifierHead(HeadConfig(pooling="mean"), DIM, C, has_cls=True)
    assert torch.equal(mean_head.pool(tokens), torch.zeros(2, DIM))


def test_head_config_is_validated() -> None:
    with pytest.raises(ValueError, match="needs pooling=attentive"):
        HeadConfig(kind="attentive", pooling="mean")
    with pytest.raises(ValueError, match="kind must be one of"):
        HeadConfig(kind="transformer")
    with pytest.raises(ValueError, match="dropout"):
        HeadConfig(dropout=1.0)


def test_attentive_pooler_attends_to_tokens() -> None:
    torch.manual_seed(0)
    pooler = AttentivePooler(DIM, num_heads=4, num_queries=2)
    a = pooler(torch.randn(2, 10, DIM))
    b = pooler(torch.randn(2, 10, DIM))
    assert a.shape == (2, DIM) and not torch.allclose(a, b)


def test_frozen_encoder_gets_no_gradient_and_stays_in_eval_mode() -> None:
    torch.manual_seed(0)
    model = build_classifier(_encoder(), HeadConfig(), DIM, C)
    model.freeze_encoder(True)
    model.train()
    assert not model.encoder.training and model.head.training
    model(torch.randn(2, 1, 8, 32, 32)).sum().backward()
    assert all(p.grad is None and not p.requires_grad for p in model.encoder.parameters())
    assert all(p.grad is not None for p in model.head.parameters())
    model.freeze_encoder(False)
    assert model.encoder.training
    model(torch.randn(2, 1, 8, 32, 32)).sum().backward()
    assert all(p.grad is not None for p in model.encoder.parameters())


def test_batchnorm_probe_standardises_features_across_samples() -> None:
    head = ClassifierHead(HeadConfig(norm="batch"), DIM, C, has_cls=False)
    assert isinstance(head.norm, nn.BatchNorm1d) and head.norm.weight is None  # no affine
    # A large shared component with smaller per-sample differences: LayerNorm keeps the shared
    # part dominant, BatchNorm removes it.
    shared = torch.linspace(-3, 3, DIM)
    tokens = shared + 0.3 * torch.randn(16, 5, DIM)
    head.train()
    normed = head.norm(head.pool(tokens))
    assert torch.allclose(normed.mean(dim=0), torch.zeros(DIM), atol=1e-4)
    assert torch.allclose(normed.std(dim=0, unbiased=False), torch.ones(DIM), atol=0.01)
    assert isinstance(ClassifierHead(HeadConfig(norm="none"), DIM, C, False).norm, nn.Identity)
    with pytest.raises(ValueError, match="norm must be one of"):
        HeadConfig(norm="group")
