"""The DINOv2 losses, centring and EMA on known inputs (no I/O, no process group)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from octtrain.data.ibot_masks import mask_index
from octtrain.models.dino import DinoHead
from octtrain.models.dino_loss import (
    dino_loss,
    ibot_loss,
    koleo_loss,
    sinkhorn_knopp,
    teacher_probs,
    update_center,
)
from octtrain.models.jepa import ema_update


def _ce(t: torch.Tensor, s: torch.Tensor, temp: float) -> float:
    return float(-(t * F.log_softmax(s / temp, dim=-1)).sum(-1).mean())


def test_dino_loss_is_log_k_for_uniform_teacher_and_flat_student() -> None:
    k = 16
    teacher = [torch.full((4, k), 1.0 / k)] * 2
    students = [torch.zeros(4, k)] * 4
    assert float(dino_loss(students, teacher, 0.1)) == pytest.approx(math.log(k), rel=1e-6)


def test_dino_loss_averages_cross_view_pairs_and_skips_a_crop_with_itself() -> None:
    g = torch.Generator().manual_seed(0)
    t = [torch.randn(3, 8, generator=g).softmax(-1) for _ in range(2)]
    s = [torch.randn(3, 8, generator=g) for _ in range(3)]  # 2 global + 1 local
    pairs = [(0, 1), (1, 0), (2, 0), (2, 1)]  # never (0, 0) or (1, 1)
    expected = sum(_ce(t[ti], s[si], 0.1) for si, ti in pairs) / len(pairs)
    assert float(dino_loss(s, t, 0.1)) == pytest.approx(expected, rel=1e-5)


def test_ibot_loss_weights_each_image_by_its_masked_count_and_counts_unmasked_images() -> None:
    k = 4
    masks = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    m = int(masks.sum())
    teacher = torch.zeros(m, k)
    teacher[:, 0] = 1.0  # one-hot on prototype 0
    student = torch.zeros(m, k)
    student[1:, 0] = 10.0  # image 1's three tokens are right; image 0's one token is flat
    temp = 1.0
    flat = math.log(k)
    right = -float(F.log_softmax(torch.tensor([10.0, 0, 0, 0]), 0)[0])
    expected = (flat / 1 + 3 * right / 3) / 3  # per image: sum / n_masked; over 3 images
    index, weight = mask_index(masks.numpy(), budget=m + 2)  # two padding rows at weight 0
    wrong = torch.tensor([[0.0, 0, 0, 50.0]] * 2)  # padding rows: far off, and weighing nothing
    padded = torch.cat([student, wrong])
    targets = torch.cat([teacher, teacher[:2]])
    got = ibot_loss(padded, targets, torch.from_numpy(weight), masks.shape[0], temp)
    assert float(got) == pytest.approx(expected, rel=1e-5)
    assert index.tolist() == [0, 4, 5, 6, 0, 0]
    assert weight.tolist() == pytest.approx([1, 1 / 3, 1 / 3, 1 / 3, 0, 0])


def test_sinkhorn_knopp_leaves_padding_rows_out_of_the_shares() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 4)
    valid = torch.tensor([True, True, True, True, False, False])
    q = sinkhorn_knopp(torch.cat([logits[:4], torch.full((2, 4), 0.9)]), 0.1, valid=valid)
    assert torch.allclose(q[:4], sinkhorn_knopp(logits[:4], 0.1), atol=1e-6)
    assert torch.all(q[4:] == 0)


def test_koleo_of_a_square_on_the_circle_is_minus_log_sqrt2() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]) * 3.0  # scale ignored
    assert float(koleo_loss(x)) == pytest.approx(-math.log(math.sqrt(2.0)), abs=1e-5)
    close = torch.tensor([[1.0, 0.0], [1.0, 0.01], [-1.0, 0.0], [-1.0, 0.01]])
    assert float(koleo_loss(close)) > float(koleo_loss(x))  # crowded points cost more


def test_centering_removes_a_shared_offset_and_sharpening_concentrates() -> None:
    logits = torch.tensor([[5.0, 1.0, 1.0, 1.0]])
    center = torch.tensor([4.0, 0.0, 0.0, 0.0])
    flat = teacher_probs(logits, center, 0.1)
    assert torch.allclose(flat, torch.full((1, 4), 0.25))  # the offset was all there was
    mild = teacher_probs(logits, torch.zeros(4), 1.0)
    sharp = teacher_probs(logits, torch.zeros(4), 0.1)
    assert float(sharp[0, 0]) > float(mild[0, 0]) > 0.25


def test_center_update_is_an_ema_of_the_batch_mean() -> None:
    center = torch.tensor([1.0, 0.0])
    new = update_center(center, torch.tensor([3.0, 2.0]), momentum=0.9)
    assert torch.allclose(new, torch.tensor([1.2, 0.2]))


def test_teacher_ema_moves_by_one_minus_momentum() -> None:
    student, teacher = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = teacher.weight.detach().clone()
    ema_update(teacher, student, 0.75)
    assert torch.allclose(teacher.weight, 0.75 * before + 0.25 * student.weight.detach())


def test_dino_head_keeps_prototype_norms_fixed_and_learns_directions() -> None:
    head = DinoHead(8, 32, hidden=16, bottleneck=4)
    g = head.last_layer.parametrizations.weight.original0
    assert not g.requires_grad
    out = head(torch.randn(5, 8))
    assert out.shape == (5, 32)
    out.sum().backward()
    assert head.last_layer.parametrizations.weight.original1.grad is not None


@pytest.mark.parametrize("dims", [(48, 64, 32), (384, 2048, 256)], ids=["tiny", "dinov2"])
def test_dino_head_mlp_output_does_not_vanish_at_init(dims: tuple[int, int, int]) -> None:
    # At std 0.02 a narrow head (48 -> 64 -> 64 -> 32) put out ~1e-3: Adam's first bias steps
    # (~lr) swamped it, every crop got the same bottleneck direction and the centred teacher
    # went uniform. Init by fan-in keeps the output O(1) at any width.
    in_dim, hidden, bottleneck = dims
    torch.manual_seed(0)
    head = DinoHead(in_dim, 64, hidden=hidden, bottleneck=bottleneck)
    x = F.layer_norm(torch.randn(32, in_dim), (in_dim,))  # a backbone's normed CLS tokens
    out = head.mlp(x)
    assert out.std() > 0.1
    z = F.normalize(out, dim=-1)
    assert (z @ z.T).fill_diagonal_(0).abs().max() < 0.9  # different inputs, different directions


def test_sinkhorn_knopp_gives_each_prototype_an_equal_share_of_the_batch() -> None:
    torch.manual_seed(0)
    # Every row prefers prototype 0: centring by a lagging EMA would let the batch sit there.
    logits = torch.randn(32, 8) * 0.1
    logits[:, 0] += 0.9
    q = sinkhorn_knopp(logits, temp=0.05)
    assert torch.allclose(q.sum(dim=1), torch.ones(32), atol=1e-5)  # each row a distribution
    # Equal shares, as near as three iterations get (DINOv2 runs three).
    assert torch.allclose(q.mean(dim=0), torch.full((8,), 1 / 8), atol=0.03)
    assert q.mean(dim=0)[0] < 0.2 < float(teacher_probs(logits, torch.zeros(8), 0.05)[:, 0].mean())


def test_sinkhorn_knopp_keeps_each_rows_preference_and_sums_over_replicas() -> None:
    logits = torch.eye(8) * 0.5 + torch.randn(8, 8) * 0.01  # row i prefers prototype i
    q = sinkhorn_knopp(logits, temp=0.1)
    assert torch.equal(q.argmax(dim=1), torch.arange(8))
    # Two identical replicas (the reducer doubles every sum) give each the one-process answer.
    doubled = sinkhorn_knopp(logits, temp=0.1, reduce_sum=lambda t: 2 * t)
    assert torch.allclose(doubled, q, atol=1e-6)
