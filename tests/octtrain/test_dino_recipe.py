"""DINOv2's recipe where it matters, each piece pinned by what it does to a real step: the
teacher (eval, no drop path, unmasked crops, EMA towards the student on a cosine), the frozen
prototypes, the per-layer learning rates, local crops inside global ones at the profiles' scale,
and a step that torch.compile traces whole and that never waits for the device."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from octtrain.config.dino import DinoConfig
from octtrain.config.loader import load_config
from octtrain.data.cellpainting import CellPaintingDataset, to_views
from octtrain.embed.encoders import dino_teacher
from octtrain.errors import CheckpointError, ConfigError
from octtrain.models.dino import (
    DinoHead,
    DinoStudent,
    build_student,
    make_teacher,
    teacher_outputs,
)
from octtrain.models.dino_loss import dino_loss, ibot_loss, koleo_loss, sinkhorn_knopp
from octtrain.models.vit3d import DropPath
from octtrain.runtime.backend import make_backend
from octtrain.train.dino import DinoJob
from octtrain.train.optim import set_hyperparameters
from tests.octtrain.cell_cache import CellField, write_cell_cache

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "pretrain"
DINO_TINY = CONFIGS / "dino-tiny.yaml"


@pytest.fixture(scope="module")
def cell_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[CellField]]:
    root = tmp_path_factory.mktemp("cells")
    return root, write_cell_cache(root)


def _job(
    cache: tuple[Path, list[CellField]],
    tmp_path: Path,
    overrides: list[str] = (),  # type: ignore[assignment]
) -> tuple[DinoJob, dict[str, Any]]:
    """A tiny DINO job on the test cache and its first training batch."""
    root, fields = cache
    torch.set_num_threads(1)
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={tmp_path}", *overrides])
    job = DinoJob(cfg, [f for f in fields if f.split == "train"], root, make_backend("cpu"))
    batch = next(iter(job.start(0)))
    return job, batch


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --- the teacher ---------------------------------------------------------------------------------


def test_the_teacher_runs_in_eval_mode_without_drop_path(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    job, batch = _job(cell_cache, tmp_path, ["model.drop_path=0.5"])
    assert any(m.p > 0 for m in job.raw.modules() if isinstance(m, DropPath))  # the student's
    job.train_step(batch, 0)
    assert not any(m.training for m in job.teacher.modules())
    assert all(m.p == 0.0 for m in job.teacher.modules() if isinstance(m, DropPath))
    g, _, masks = to_views(batch)
    first = teacher_outputs(job.teacher, g, masks, batch["mask_index"])[0]
    job.teacher.train()  # even a caller that flips it back cannot bring drop path in
    second = teacher_outputs(job.teacher, g, masks, batch["mask_index"])[0]
    assert torch.equal(first, second)


def test_the_teacher_sees_the_global_crops_unmasked(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    """The step's teacher logits (read back from the centre's EMA) are those of the teacher on
    the whole global crops, not on the crops with the student's mask tokens in."""
    job, batch = _job(cell_cache, tmp_path)
    assert bool(batch["masks"].any())
    g, _, masks = to_views(batch, job.channel_stats)
    before_teacher, before_center = copy.deepcopy(job.teacher), job.center.clone()
    with torch.no_grad():
        whole = before_teacher(g).global_logits
    job.train_step(batch, 0)
    m = job.cfg.dino.center_momentum
    used = (job.center - m * before_center) / (1 - m)  # the mean of the step's teacher logits
    assert torch.allclose(used, whole.mean(dim=0), atol=1e-5)
    with torch.no_grad():
        masked_in = before_teacher.backbone(g, masks)[0]
        unmasked = before_teacher.backbone(g)[0]
    assert not torch.allclose(masked_in, unmasked, atol=1e-3)  # the masks do change a forward


def test_the_teacher_moves_towards_the_student_by_the_cosine_momentum(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    job, batch = _job(cell_cache, tmp_path)
    step = 3
    before = _params(job.teacher)
    job.train_step(batch, step)
    total, s = job.schedule_steps, job.cfg.schedule
    momentum = s.ema_end - (s.ema_end - s.ema_start) * 0.5 * (1 + math.cos(math.pi * step / total))
    assert job.hyperparameters(step)["train/ema_momentum"] == pytest.approx(momentum)
    student = _params(job.raw)
    for name, p in job.teacher.named_parameters():
        expected = momentum * before[name] + (1 - momentum) * student[name]
        torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(before[n], p) for n, p in job.teacher.named_parameters())


def test_the_ema_momentum_is_a_cosine_not_a_ramp(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    job, _ = _job(
        cell_cache,
        tmp_path,
        ["train.max_steps=100", "schedule.ema_start=0.9", "schedule.ema_end=0.99"],
    )
    quarter = job.hyperparameters(25)["train/ema_momentum"]
    # 0.9 -> 0.99 on a cosine: 14.6% of the way at a quarter of the run (a ramp: 25%).
    assert quarter == pytest.approx(0.9 + 0.09 * (1 - math.cos(math.pi / 4)) / 2, abs=1e-9)
    assert job.hyperparameters(0)["train/ema_momentum"] == pytest.approx(0.9)
    assert job.hyperparameters(100)["train/ema_momentum"] == pytest.approx(0.99)


def test_the_teacher_temperature_warms_up_from_0_04_to_0_07_over_30_percent_of_the_run(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    # DINOv2: 0.04 -> 0.07 over 30 of 100 epochs; here 30% of a 200-step run, 60 steps.
    warm = ["dino.teacher_temp=0.07", "dino.warmup_teacher_temp_steps=null"]
    share = ["dino.warmup_teacher_temp_share=0.3"]
    job, _ = _job(cell_cache, tmp_path, ["train.max_steps=200", *warm, *share])
    temps = [job.hyperparameters(s)["train/teacher_temp"] for s in (0, 30, 60, 199)]
    assert temps == pytest.approx([0.04, 0.055, 0.07, 0.07])
    # The schedule's length when it is not the run's (schedule.total_steps): 30% of 100.
    job, _ = _job(cell_cache, tmp_path, ["schedule.total_steps=100", *warm, *share])
    assert job.hyperparameters(15)["train/teacher_temp"] == pytest.approx(0.055)


def test_a_share_and_a_step_count_of_the_same_schedule_are_refused_together() -> None:
    for name in ("warmup_teacher_temp", "freeze_last_layer"):
        both = [f"dino.{name}_share=0.1", f"dino.{name}_steps=5"]
        with pytest.raises(ConfigError, match=f"{name}_share 0.1 and {name}_steps 5"):
            load_config(DinoConfig, DINO_TINY, both)
    # Neither: DINOv2's shares.
    d = DinoConfig().dino
    assert (d.warmup_teacher_temp_share, d.freeze_last_layer_share) == (0.3, 0.01)
    assert (d.teacher_temp_warmup(12000), d.frozen_last_layer(12000)) == (3600, 120)


# --- the prototypes and the learning rates -------------------------------------------------------


def test_the_last_layers_stay_fixed_for_the_first_percent_of_the_run_then_learn(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    # dino-tiny.yaml's share, 0.01 (DINOv2: 1 of 100 epochs): 2 steps of a 200-step run.
    overrides = ["train.max_steps=200", "schedule.warmup_steps=0"]
    job, batch = _job(cell_cache, tmp_path, overrides)
    assert job.cfg.dino.freeze_last_layer_share == 0.01
    params = job.raw.named_parameters()
    last = [n for n, p in params if ".last_layer." in n and p.requires_grad]
    assert len(last) == 2  # the DINO and iBOT heads' prototypes (their directions)
    for step in (0, 1):
        before = _params(job.raw)
        job.train_step(batch, step)
        after = _params(job.raw)
        assert all(torch.equal(before[n], after[n]) for n in last)
        assert not torch.equal(before["dino_head.mlp.0.weight"], after["dino_head.mlp.0.weight"])
    before = _params(job.raw)
    job.train_step(batch, 2)
    after = _params(job.raw)
    assert all(not torch.equal(before[n], after[n]) for n in last)


def test_learning_rates_decay_by_layer_and_the_patch_embedding_gets_a_fifth(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    job, _ = _job(cell_cache, tmp_path, ["optim.layer_decay=0.5"])
    set_hyperparameters(job.optimizer, 1.0, 0.04)
    lr = {id(p): g["lr"] for g in job.optimizer.param_groups for p in g["params"]}
    named = dict(job.raw.named_parameters())
    depth = len(job.raw.backbone.blocks)
    assert depth == 2

    def at(name: str) -> float:
        return float(lr[id(named[name])])

    assert at("backbone.patch_embed.weight") == pytest.approx(0.5**3 * 0.2)
    assert at("backbone.cls_token") == pytest.approx(0.5**3)
    assert at("backbone.blocks.0.attn.qkv.weight") == pytest.approx(0.5**2)
    assert at("backbone.blocks.1.mlp.0.bias") == pytest.approx(0.5)
    assert at("backbone.norm.weight") == pytest.approx(1.0)
    assert at("dino_head.mlp.0.weight") == pytest.approx(1.0)
    # One fused AdamW launch for every tensor where torch has the kernel (CPU and CUDA).
    assert job.optimizer.defaults["fused"] is True


def test_the_job_s_batches_carry_block_masks_on_half_the_global_crops(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    _, batch = _job(cell_cache, tmp_path, ["data.batch_size=8"])
    masks = batch["masks"].reshape(16, 8, 8).numpy()  # 8 fields x 2 global crops, 8 x 8 patches
    counts = masks.sum(axis=(1, 2))
    assert (counts > 0).sum() == 8  # exactly half, DINOv2's mask_probability 0.5
    padded = np.pad(masks, ((0, 0), (1, 1), (1, 1)))
    near = padded[:, :-2, 1:-1] | padded[:, 2:, 1:-1] | padded[:, 1:-1, :-2] | padded[:, 1:-1, 2:]
    assert (masks & near).sum() / masks.sum() > 0.9  # blocks, not scattered patches
    assert batch["mask_index"].shape == batch["mask_weight"].shape


def _first_moments(job: DinoJob) -> float:
    """The norm of AdamW's first moments over every trained parameter: after one step from a
    fresh optimizer, ``(1 - beta1)`` times the norm of the gradients it stepped with."""
    moments = [job.optimizer.state[p]["exp_avg"] for p in job.params]
    return float(torch.linalg.vector_norm(torch.stack([m.norm() for m in moments])))


def test_the_optimizer_steps_with_gradients_clipped_to_optim_grad_clip(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    scope = "optim.grad_clip_scope=global"  # the whole student on one norm
    clipped, batch = _job(cell_cache, tmp_path, ["optim.grad_clip=0.001", scope])
    beta1 = clipped.cfg.optim.betas[0]
    result = clipped.train_step(batch, 0)
    assert float(result.grad_norm) > 0.01  # logged before clipping: the raw norm
    assert _first_moments(clipped) == pytest.approx((1 - beta1) * 0.001, rel=1e-3)
    free, batch = _job(cell_cache, tmp_path / "free", ["optim.grad_clip=0", scope])
    result = free.train_step(batch, 0)
    assert _first_moments(free) == pytest.approx((1 - beta1) * float(result.grad_norm), rel=1e-3)


def _module_norms(job: DinoJob) -> list[float]:
    """The gradient norms of the backbone, the DINO head and the iBOT head, as they are now."""
    modules = (job.raw.backbone, job.raw.dino_head, job.raw.ibot_head)
    return [
        float(
            torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in m.parameters() if p.grad is not None])
            )
        )
        for m in modules
        if m is not None
    ]


def test_each_module_s_gradients_are_clipped_on_their_own_norm(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    # DINOv2's train.py: ``for v in model.student.values(): v.clip_grad_norm_(clip_grad)``.
    job, batch = _job(cell_cache, tmp_path, ["optim.grad_clip=1e-6"])
    assert job.cfg.optim.grad_clip_scope == "module"  # the default
    result = job.train_step(batch, 0)
    assert _module_norms(job) == pytest.approx([1e-6] * 3, rel=1e-3)  # each at the clip
    assert float(result.grad_norm) > 1e-3  # logged: the whole student's norm before clipping
    job, batch = _job(
        cell_cache, tmp_path / "g", ["optim.grad_clip=1e-6", "optim.grad_clip_scope=global"]
    )
    job.train_step(batch, 0)
    norms = _module_norms(job)
    assert math.hypot(*norms) == pytest.approx(1e-6, rel=1e-3)  # one norm for the three
    assert min(norms) < 0.5e-6  # the largest module's norm leaves the heads a sliver


def test_the_peak_lr_follows_the_global_batch_by_the_square_root_rule(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # DINOv2's utils/config.py: lr = base_lr * sqrt(batch_size_per_gpu * global_size / 1024).
    peak = ["optim.lr=1e-3", "data.batch_size=16", "schedule.warmup_steps=2"]
    expected = {"sqrt_wrt_1024": 1e-3 * (16 / 1024) ** 0.5, "linear_wrt_256": 1e-3 * 16 / 256}
    expected["none"] = 1e-3
    for rule, lr in expected.items():
        caplog.clear()
        with caplog.at_level("INFO", logger="octtrain"):
            job, _ = _job(cell_cache, tmp_path / rule, [*peak, f"optim.scaling_rule={rule}"])
        assert job.hyperparameters(1)["train/lr"] == pytest.approx(lr)  # the warm-up's end
        said = [r.getMessage() for r in caplog.records if "scaling_rule" in r.getMessage()]
        assert len(said) == 1 and f"scaling_rule {rule}, global batch 16" in said[0]


def test_the_ibot_centre_moves_to_the_masked_tokens_mean_not_the_padding_s(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    job, batch = _job(cell_cache, tmp_path, ["data.batch_size=8"])
    valid = batch["mask_weight"] > 0
    assert valid.any() and not valid.all()  # the index list is padded
    global_views, _, masks = to_views(batch, job.channel_stats)
    _, t_masked, _ = teacher_outputs(job.teacher, global_views, masks, batch["mask_index"])
    m = job.cfg.dino.center_momentum
    job.train_step(batch, 0)
    expected = (1 - m) * t_masked.float()[valid].mean(dim=0)  # from a centre of zeros
    torch.testing.assert_close(job.ibot_center, expected, rtol=1e-4, atol=1e-5)


# --- LayerScale and the heads' precision ---------------------------------------------------------


def test_the_vit_s_blocks_start_near_the_identity_through_layerscale_at_1e_5() -> None:
    # DINOv2: ssl_default_config's student.layerscale 1.0e-05, layers/layer_scale.py's gamma.
    cfg = load_config(DinoConfig, CONFIGS / "dino-vits8.yaml", ["model.depth=1"])
    assert cfg.model.layerscale == 1e-5
    torch.manual_seed(0)
    block = build_student(cfg, 5).backbone.blocks[0]
    for gamma in (block.ls1.gamma, block.ls2.gamma):
        assert torch.equal(gamma.detach(), torch.full((384,), 1e-5))
    x = torch.randn(2, 17, 384)
    with torch.no_grad():
        assert float((block(x) - x).norm() / x.norm()) < 1e-4  # each branch at 1e-5 of its output
    small = load_config(DinoConfig, DINO_TINY, ["model.preset=small"]).model.layerscale
    assert (small, load_config(DinoConfig, DINO_TINY, []).model.layerscale) == (1e-5, 0.0)


def _old_checkpoint(job: DinoJob) -> dict[str, Any]:
    """``job``'s state as a checkpoint from before LayerScale: no gamma, no ``layerscale`` key."""
    state = job.state(0)
    del state["config"]["model"]["layerscale"]
    for key in ("student", "teacher"):
        state[key] = {k: v for k, v in state[key].items() if ".ls" not in k}
    return state


def test_a_checkpoint_from_before_layerscale_still_embeds_and_resumes_only_without_it(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    small = ["model.preset=small"]  # LayerScale by default
    job, _ = _job(cell_cache, tmp_path, [*small, "model.layerscale=0"])
    state = _old_checkpoint(job)
    cfg, backbone = dino_teacher(state, "old.pt")  # octtrain embed / profile: as before
    assert cfg.model.layerscale == 0 and not any(".ls" in k for k in backbone.state_dict())
    job, _ = _job(cell_cache, tmp_path / "new", small)
    assert "backbone.blocks.0.ls1.gamma" in job.raw.state_dict()
    with pytest.raises(CheckpointError, match=r"layerscale.*model.layerscale=0 to resume"):
        job.load_state(state)
    job, _ = _job(cell_cache, tmp_path / "again", [*small, "model.layerscale=0"])
    job.load_state(state)


def test_the_heads_logits_are_float32_under_bf16_autocast() -> None:
    """At a teacher temperature of 0.04 a bf16 cosine near 0.9 (steps of 2^-8) moves the
    target's logit by up to 0.05; the normalised bottleneck and the prototypes run in float32."""
    torch.manual_seed(0)
    head = DinoHead(48, 64, hidden=64, bottleneck=32)
    x = torch.randn(8, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head(x)
        bottleneck = head.mlp(x)
    assert logits.dtype == torch.float32
    expected = head.last_layer(torch.nn.functional.normalize(bottleneck.float(), dim=-1))
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)


# --- crops ---------------------------------------------------------------------------------------


def _regions(config: Path, field: int, seeds: int = 50) -> tuple[DinoConfig, list[list[Any]]]:
    cfg = load_config(DinoConfig, config, [])
    ds = CellPaintingDataset([], "unused", cfg.crops, cfg.model.patch_size)
    return cfg, [ds.regions(np.random.default_rng(s), field, field) for s in range(seeds)]


@pytest.mark.parametrize("name", ["dino-tiny.yaml", "dino-vits8.yaml"])
def test_training_crops_are_read_at_the_scale_profiles_embed(name: str) -> None:
    """``octtrain profile`` embeds native tiles of ``global_size``; training crops must show the
    same pixel size (a zoom near 1), whatever the field's size (JUMP's are 1,080 px)."""
    for field in (256, 1080):
        cfg, drawn = _regions(CONFIGS / name, field)
        c = cfg.crops
        for regions in drawn:
            for i, (_, _, h, w) in enumerate(regions):
                size = c.global_size if i < 2 else c.local_size
                assert 0.85 <= math.sqrt(h * w) / size <= 1.3, (name, field, i, h, w)


@pytest.mark.parametrize("name", ["dino-tiny.yaml", "dino-vits8.yaml"])
def test_each_local_crop_lies_inside_a_global_crop(name: str) -> None:
    _, drawn = _regions(CONFIGS / name, 1080)
    for regions in drawn:
        globals_ = regions[:2]
        for i, (y, x, h, w) in enumerate(regions[2:]):
            gy, gx, gh, gw = globals_[i % 2]
            assert gy <= y and y + h <= gy + gh and gx <= x and x + w <= gx + gw


# --- a step for torch.compile and the GPU --------------------------------------------------------


def _student(drop_path: float = 0.1) -> DinoStudent:
    cfg = load_config(DinoConfig, DINO_TINY, [f"model.drop_path={drop_path}"])
    torch.manual_seed(0)
    return build_student(cfg, 5)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g, loc = torch.randn(4, 5, 32, 32), torch.randn(4, 5, 16, 16)
    masks = torch.zeros(4, 64, dtype=torch.bool)
    masks[0, :10] = True
    masks[3, 20:30] = True
    return g, loc, masks, masks.flatten().nonzero().flatten()


def test_the_student_and_teacher_forwards_and_losses_trace_without_graph_breaks() -> None:
    torch.set_num_threads(1)
    student = _student()
    teacher = make_teacher(student)
    g, loc, masks, index = _inputs()
    for model, args, kwargs in (
        (student, (g, loc, masks), {"mask_index": index}),
        (teacher, (g, None, masks), {"mask_input": False, "mask_index": index}),
    ):
        explained = torch._dynamo.explain(model)(*args, **kwargs)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1

    def losses(s: torch.Tensor, t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        targets = sinkhorn_knopp(t, 0.05, valid=w > 0)
        dino = dino_loss(list(s.chunk(2)), list(targets.chunk(2)), 0.1)
        return dino + ibot_loss(s, targets, w, 8, 0.1) + koleo_loss(s)

    logits = torch.randn(12, 16)
    explained = torch._dynamo.explain(losses)(logits, logits.flip(0), torch.rand(12))
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()


class _Ops(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Every aten op run under it, by name (what a kernel-level profile would list)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.names: list[str] = []
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::")[-1]
        self.names.append(name)
        # What makes the host wait for the device: a value read back (``.item()``, ``float()``,
        # ``bool()``, ``==`` on tensors) or an output whose size depends on the data.
        bool_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())
        )
        waits = ("_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal")
        if name in waits or name.startswith("unique") or bool_index:
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


def test_attention_in_the_2d_vit_runs_the_fused_kernel() -> None:
    student = _student()
    g, *_ = _inputs()
    with torch.no_grad(), _Ops() as ops:
        student.backbone(g)
    fused = [n for n in ops.names if n.startswith("_scaled_dot_product")]
    assert len(fused) == len(student.backbone.blocks)
    assert not any("softmax" in n for n in ops.names)  # no materialised attention matrix


def test_a_training_step_never_makes_the_host_wait_for_the_device(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    """Between logged steps nothing in the step reads a device value back or sizes a tensor by
    its data (on a GPU each would stall the launch queue; under compile, break the graph)."""
    job, batch = _job(cell_cache, tmp_path, ["logging.log_every=100"])
    job.train_step(batch, 0)  # the first step is logged (and builds the optimizer's state)
    with _Ops() as ops:
        result = job.train_step(batch, 1)
    assert ops.names and not ops.syncs, sorted(set(ops.syncs))
    assert isinstance(result.loss, torch.Tensor) and isinstance(result.grad_norm, torch.Tensor)


def test_a_compiled_step_computes_what_the_eager_step_does_in_one_graph_per_forward(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    losses = []
    for compile_ in ("none", "aot_eager"):
        warming = ["dino.warmup_teacher_temp=0.02", "dino.warmup_teacher_temp_steps=10"]
        job, batch = _job(cell_cache, tmp_path / compile_, [f"compile={compile_}", *warming])
        losses.append([float(job.train_step(batch, s).loss) for s in (1, 2)])
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    # Two steps (the teacher temperature changing between them), the student's and teacher's
    # forwards and the objective: compiled once each, never again.
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()
