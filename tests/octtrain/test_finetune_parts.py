"""Finetuning's pieces checked directly (class weights, losses, early stopping, learning-rate
factors, layer-wise decay, the epoch sampler, config checks) and manifests that contradict
themselves: no training run."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from octstage import manifest as mf
from octtrain.config.finetune import (
    FinetuneConfig,
    FinetuneOptimConfig,
    FinetuneScheduleConfig,
    HeadConfig,
    LossConfig,
)
from octtrain.config.loader import load_config
from octtrain.config.sections import ModelConfig
from octtrain.data.samplers import EpochSampler, balanced_probabilities
from octtrain.data.splits import check_splits, class_weights
from octtrain.errors import ConfigError, DataError
from octtrain.eval.common.selection import EarlyStopping
from octtrain.models.classifier import build_classifier, make_loss
from octtrain.models.vit3d import encoder_from_config
from octtrain.train.optim import encoder_groups, finetune_optimizer, lr_factors
from tests.octtrain.finetune_fixtures import FINETUNE_TINY, REPO, manifest_variant

# --- pieces, checked directly -------------------------------------------------------------------


def test_auto_class_weights_are_inverse_frequency() -> None:
    weights = class_weights(LossConfig(class_weights="auto"), [8, 4, 2, 2])
    assert weights is not None
    np.testing.assert_allclose(weights, [0.5, 1.0, 2.0, 2.0])  # n / (C * n_c), n=16, C=4
    balanced = class_weights(LossConfig(), [5, 5, 5, 5])
    assert balanced is not None
    np.testing.assert_allclose(balanced, [1, 1, 1, 1])
    absent = class_weights(LossConfig(), [6, 0, 3, 3])
    assert absent is not None and absent[1] == 0.0 and absent[0] == pytest.approx(12 / (3 * 6))
    assert class_weights(LossConfig(class_weights="none"), [1, 2, 3, 4]) is None
    manual = LossConfig(class_weights="manual", class_weight_values=(1.0, 2.0, 3.0, 4.0))
    given = class_weights(manual, [1, 1, 1, 1])
    assert given is not None
    np.testing.assert_allclose(given, [1, 2, 3, 4])
    with pytest.raises(DataError, match="3 values for 4 classes"):
        class_weights(LossConfig("manual", (1.0, 2.0, 3.0)), [1, 1, 1, 1])
    with pytest.raises(ValueError, match="exactly when class_weights=manual"):
        LossConfig(class_weights="auto", class_weight_values=(1.0,))


def test_weighted_loss_matches_the_formula() -> None:
    torch.manual_seed(0)
    logits, y = torch.randn(6, 4), torch.tensor([0, 1, 1, 2, 3, 3])
    w = torch.tensor([0.5, 1.0, 2.0, 4.0])
    nll = -F.log_softmax(logits, dim=1)[torch.arange(6), y]
    expected = (w[y] * nll).sum() / w[y].sum()  # weighted mean over the batch
    assert torch.allclose(make_loss(w, 0.0)(logits, y), expected)


def test_label_smoothing_matches_the_formula() -> None:
    torch.manual_seed(1)
    logits, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 3, 0])
    eps = 0.2
    logp = F.log_softmax(logits, dim=1)
    target = torch.full((5, 4), eps / 4) + (1 - eps) * F.one_hot(y, 4)
    expected = -(target * logp).sum(dim=1).mean()
    got = make_loss(None, eps)(logits, y)
    assert torch.allclose(got, expected)
    assert not torch.allclose(got, make_loss(None, 0.0)(logits, y))


def test_early_stopping_rules() -> None:
    stop = EarlyStopping(patience=2, min_delta=0.01)
    assert stop.update(0.30) and stop.best == 0.30
    assert not stop.update(0.305)  # not better by more than min_delta
    assert not stop.should_stop
    assert not stop.update(math.nan)  # undefined is never an improvement
    assert stop.should_stop
    never = EarlyStopping(patience=0, min_delta=0.0)
    for _ in range(10):
        never.update(0.1)
    assert not never.should_stop


def test_learning_rate_factors_warm_up_decay_and_rewarm_the_encoder() -> None:
    cfg = FinetuneScheduleConfig(warmup_epochs=2, min_lr_ratio=0.01, unfreeze_epoch=4)
    steps, warm, total = 5, 10, 50
    head = [lr_factors(s, steps, warm, total, cfg)[0] for s in range(total + 10)]
    assert head[0] == pytest.approx(0.1) and head[10] == pytest.approx(1.0)
    assert all(a <= b for a, b in itertools.pairwise(head[:11]))  # warmup rises
    assert all(a >= b for a, b in itertools.pairwise(head[10:50]))  # cosine falls
    assert head[50:] == [pytest.approx(0.01)] * 10  # clamped: no restart past the end
    enc = [lr_factors(s, steps, warm, total, cfg)[1] for s in range(total)]
    assert enc[20] == pytest.approx(head[20] * 0.1)  # the encoder thaws at step 20 and warms up
    assert enc[29] == pytest.approx(head[29]) and enc[40] == pytest.approx(head[40])


def test_layer_wise_decay_groups() -> None:
    encoder = encoder_from_config(ModelConfig(preset="tiny", input_shape=(8, 32, 32)))
    model = build_classifier(encoder, HeadConfig(), 48, 4)
    cfg = FinetuneOptimConfig(head_lr=1e-2, encoder_lr=1e-3, layer_decay=0.5, weight_decay=0.1)
    groups = encoder_groups(model, cfg, depth=2)
    lr_by_layer = {g["layer"]: g["base_lr"] for g in groups}
    assert lr_by_layer == pytest.approx({0: 1e-3 / 8, 1: 1e-3 / 4, 2: 1e-3 / 2, 3: 1e-3})
    n_params = sum(len(g["params"]) for g in groups)
    assert n_params == len(list(model.encoder.parameters()))
    for g in groups:  # 1-D tensors (biases, norms) are never decayed
        assert all((p.ndim >= 2) == (g["weight_decay"] > 0) for p in g["params"])
    frozen = finetune_optimizer(model, cfg, depth=2, with_encoder=False)
    assert {g["part"] for g in frozen.param_groups} == {"head"}


def test_epoch_sampler_balanced_and_deterministic() -> None:
    labels = [0] * 30 + [1] * 6 + [2] * 2 + [3] * 2
    p = balanced_probabilities(labels, 4)
    sampler = EpochSampler(len(labels), 0, 1, seed=3, per_epoch=2000, probabilities=p)
    indices = [i for i, _ in sampler.epoch_items(0)]
    drawn = np.bincount(np.asarray(labels)[indices], minlength=4)
    assert drawn.min() > 400 and drawn.max() < 600  # ~500 each instead of 75% class 0
    again = EpochSampler(len(labels), 0, 1, seed=3, per_epoch=2000, probabilities=p)
    assert again.epoch_items(0) == sampler.epoch_items(0)
    plain = [EpochSampler(40, r, 2, seed=1, per_epoch=20) for r in (0, 1)]
    a, b = ({i for i, _ in s.epoch_items(5)} for s in plain)
    assert len(a) == len(b) == 20 and not a & b  # disjoint halves of a permutation
    with pytest.raises(DataError, match="cannot give"):
        EpochSampler(10, 0, 2, seed=0, per_epoch=6)


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match="not a multiple"):
        FinetuneConfig(optim=FinetuneOptimConfig(effective_batch_size=12))
    assert FinetuneConfig(optim=FinetuneOptimConfig(effective_batch_size=32)).accum_steps == 4
    with pytest.raises(ValueError, match="warmup_epochs"):
        load_config(FinetuneConfig, FINETUNE_TINY, ["train.epochs=2", "schedule.warmup_epochs=3"])
    with pytest.raises(ConfigError, match=r"train\.epochs must be set"):
        load_config(FinetuneConfig, FINETUNE_TINY, ["train.epochs=null"])
    with pytest.raises(ConfigError, match="early_stopping: metric must be one of"):
        load_config(FinetuneConfig, FINETUNE_TINY, ["early_stopping.metric=loss"])
    with pytest.raises(ConfigError, match=r"unknown config key 'head\.pool'"):
        load_config(FinetuneConfig, FINETUNE_TINY, ["head.pool=mean"])
    shipped = sorted((REPO / "configs" / "finetune").glob("*.yaml"))
    assert {p.stem for p in shipped} >= {"tiny", "demo", "vit29m", "vit90m"}
    for path in shipped:  # every shipped config loads and validates
        load_config(FinetuneConfig, path, [])


# --- manifests with a twist (same cache) ---------------------------------------------------------


def test_participant_in_two_splits_and_bad_labels_are_errors(
    tiny_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    manifest = mf.load(tiny_cache[0])
    train0 = manifest.split("train")[0]

    def leak(vols: list[mf.Volume]) -> list[mf.Volume]:
        val = next(i for i, v in enumerate(vols) if v.split == "val")
        vols[val] = dataclasses.replace(vols[val], participant_id=train0.participant_id)
        return vols

    leaking = mf.load(manifest_variant(tiny_cache[0], tmp_path, leak))
    with pytest.raises(DataError, match=rf"{train0.participant_id} in \['train', 'val'\]"):
        check_splits(leaking, ["train", "val"])
    relabel = [dataclasses.replace(manifest.volumes[0], label=3), *manifest.volumes[1:]]
    with pytest.raises(DataError, match="not the index of their study group"):
        check_splits(dataclasses.replace(manifest, volumes=tuple(relabel)), ["train"])
    with pytest.raises(DataError, match=r"\['holdout'\] have no volumes"):
        check_splits(manifest, ["train", "holdout"])


def test_finetunes_flash_length_check_refuses_a_length_flash_cannot_take() -> None:
    from octtrain.config.sections import ModelConfig
    from octtrain.errors import ConfigError
    from octtrain.train.finetune import check_kernel_lengths

    odd = ModelConfig(input_shape=(10, 64, 72), patch=(2, 8, 8))  # 5 * 8 * 9 = 360 tokens
    with pytest.raises(ConfigError, match="the encoder sees 360 tokens"):
        check_kernel_lengths("flash", odd)
    check_kernel_lengths("sdpa", odd)  # only flash has blocks
    check_kernel_lengths("flash", ModelConfig(input_shape=(8, 64, 64), patch=(2, 8, 8)))  # 256
