"""``octtrain pretrain``: V-JEPA pretraining of the 3D ViT, as a job of the training skeleton.

What is pretraining's own: the student (context encoder + predictor) and its EMA target; the
step (masks come with the batch, sampled in the loader workers; the student predicts the masked
patches' layer-normed target features; AdamW with the scheduled lr and weight decay; grad norm
before clipping; then the EMA update); and validation (per-sample loss with fixed masks and the
pooled target features of every validation volume, counted once across processes, judged for
collapse by their effective rank).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from octstage.manifest import Manifest
from octtrain.config.loader import to_dict
from octtrain.config.pretrain import PretrainConfig
from octtrain.data.acquisition import TwoLookDataset, make_transform
from octtrain.data.dataset import (
    ManifestDataset,
    Transform,
    read_manifest,
    to_model_input,
    volume_shape,
)
from octtrain.data.intensity import pooled
from octtrain.data.loaders import padded_loader, train_loader
from octtrain.data.masks import SampleMasker, mask_overlay, num_masked
from octtrain.data.select import select
from octtrain.data.splits import check_batch_fits
from octtrain.errors import CheckpointError, ConfigError, DataError
from octtrain.eval.common.collapse import (
    effective_rank,
    feature_std,
    representation_alarm,
    sample_spread,
)
from octtrain.eval.common.knn import knn_balanced_accuracy
from octtrain.eval.common.pictures import attention_overlay, pca_rgb
from octtrain.eval.common.validation import collect
from octtrain.models import flash_blocks
from octtrain.models.attention import choose
from octtrain.models.inputs import legacy_hint, legacy_model
from octtrain.models.jepa import build_student, ema_update, jepa_loss, make_target, target_features
from octtrain.models.vit3d import Block
from octtrain.runtime import checkpoint as ckpt
from octtrain.runtime import hosts
from octtrain.runtime.backend import Backend, cpu_threads, make_backend
from octtrain.runtime.interrupt import agreed_ctrl_c
from octtrain.train.job import Evaluation, RunResult, Settings, StepResult, monitor_rows
from octtrain.train.loop import Trainer
from octtrain.train.optim import pretrain_optimizer, set_hyperparameters
from octtrain.train.schedules import ema_pretraining

log = logging.getLogger("octtrain")


def resolve(cfg: PretrainConfig, manifest: Manifest) -> PretrainConfig:
    """Fill ``model.input_shape`` from the cache and check the splits can feed this config."""
    train = manifest.split(cfg.data.train_split)
    if not train:
        raise DataError(f"the manifest has no volumes in split {cfg.data.train_split!r}")
    val = manifest.split(cfg.data.val_split)
    if cfg.validation.every and not val:
        raise DataError(
            f"validation.every={cfg.validation.every} but split {cfg.data.val_split!r} is empty; "
            "set validation.every=0 or data.val_split"
        )
    shape = volume_shape(train + val)
    wanted = cfg.model.input_shape or shape
    if any(w > s for w, s in zip(wanted, shape, strict=True)):
        raise DataError(f"model.input_shape {list(wanted)} exceeds the cached shape {list(shape)}")
    try:
        model = dataclasses.replace(cfg.model, input_shape=wanted)
    except ConfigError as exc:
        raise ConfigError(f"model: {exc} (cached volumes are {list(shape)})") from None
    return dataclasses.replace(cfg, model=model)


def attention_lengths(cfg: PretrainConfig) -> dict[str, int]:
    """The token count each attention of a step sees (a resolved config): the context encoder
    sees the ``N - K`` unmasked patches, the target encoder all ``N``, the predictor the context
    plus one slot per masked patch (``N`` again)."""
    assert cfg.model.input_shape is not None
    n = math.prod(s // p for s, p in zip(cfg.model.input_shape, cfg.model.patch, strict=True))
    return {
        "context encoder": n - num_masked(n, cfg.mask.ratio),
        "target encoder": n,
        "predictor": n,
    }


def check_kernel(cfg: PretrainConfig, device: torch.device) -> tuple[str, str]:
    """(the attention kernel this run uses on ``device``, why); ``ConfigError`` before any
    compile when it is flash and a length does not fit its blocks."""
    kernel, why = choose(cfg.model.attention, device)
    if kernel == "flash":
        flash_blocks.check_lengths(attention_lengths(cfg))
    return kernel, why


def settings(cfg: PretrainConfig) -> Settings:
    """The skeleton's view of a pretraining config (no early stopping)."""
    return Settings.of(cfg)


class PretrainJob:
    """The V-JEPA student, its EMA target and optimizer, and the data of one process."""

    kind = "pretrain"
    steps_per_unit = 1
    validates_last = False

    def __init__(self, cfg: PretrainConfig, manifest: Manifest, backend: Backend) -> None:
        assert cfg.model.input_shape is not None and cfg.data.manifest is not None
        self.cfg, self.backend = cfg, backend
        self.total_steps = cfg.max_steps
        self.global_batch = cfg.data.batch_size
        self.schedule_steps = cfg.schedule.total_steps or cfg.max_steps
        self.local_batch = hosts.local_batch(cfg.data.batch_size, backend)
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every replica
        self.raw = build_student(cfg.model).to(backend.device)
        stats = pooled(manifest.split(cfg.data.train_split), 1)
        self.raw.encoder.input_norm.set_stats(*stats.to_input())  # before the target copies it
        self.student: torch.nn.Module = self.raw
        self.grid = self.raw.encoder.grid
        self.target = make_target(self.raw.encoder)
        self.optimizer = pretrain_optimizer(self.raw, cfg.optim)
        self.params = [p for p in self.raw.parameters() if p.requires_grad]

        root = Path(cfg.data.cache) if cfg.data.cache else Path(cfg.data.manifest).parent
        shape, masker = cfg.model.input_shape, SampleMasker(self.grid, cfg.mask)
        two = TwoLookDataset if cfg.acquisition.two_looks else ManifestDataset
        self.train_set = two(
            manifest,
            root,
            cfg.data.train_split,
            make_transform(shape, cfg.data.augment, cfg.acquisition),
            cfg.data.max_samples,
            masker=masker,
        )
        self.val_set = ManifestDataset(
            manifest, root, cfg.data.val_split, Transform(shape, None), cfg.data.max_samples, masker
        )
        self.val_loader: DataLoader[dict[str, Any]] | None = None

    # --- state ---------------------------------------------------------------------------------

    def state(self, step: int) -> dict[str, Any]:
        return {
            "format": 1,
            "kind": "pretrain",
            "encoder": self.raw.encoder.state_dict(),
            "predictor": self.raw.predictor.state_dict(),
            "target_encoder": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": {"step": step},  # schedules are pure functions of the step
            "rng": ckpt.rng_state(),
            "config": to_dict(self.cfg),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        ckpt.require_kind(state, "resume", ("pretrain",), ckpt.ANOTHER_JOB)
        saved = legacy_model(state["config"]["model"])
        current = to_dict(self.cfg)["model"]
        if saved != current:
            diff = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
            raise CheckpointError(
                f"the checkpoint's model config differs from this run's (checkpoint, run): {diff}"
                + legacy_hint(diff)
            )
        self.raw.encoder.load_state_dict(state["encoder"])
        self.raw.predictor.load_state_dict(state["predictor"])
        self.target.load_state_dict(state["target_encoder"])
        self.optimizer.load_state_dict(state["optimizer"])
        ckpt.set_rng_state(state["rng"])

    # --- training ------------------------------------------------------------------------------

    def start(self, start_step: int) -> DataLoader[dict[str, Any]]:
        self.student = self.backend.wrap_model(self.raw)
        b = self.backend
        return train_loader(
            self.train_set,
            self.cfg.data,
            self.local_batch,
            b.process_index,
            b.process_count,
            self.cfg.train.seed,
            start_step=start_step,
        )

    def before_step(self, step: int) -> None:
        pass

    def hyperparameters(self, step: int) -> dict[str, float]:
        cfg, total = self.cfg, self.schedule_steps
        return ema_pretraining(step, cfg.optim, cfg.schedule, total)

    def train_step(self, batch: dict[str, Any], step: int) -> StepResult:
        hyper = self.hyperparameters(step)
        set_hyperparameters(self.optimizer, hyper["train/lr"], hyper["train/weight_decay"])
        x = to_model_input(batch)  # uint8 -> [-1, 1] with the intensity jitter, on the device
        # acquisition.two_looks: the target encoder sees another intensity look of the same
        # voxels; otherwise the context's own view.
        seen = batch.get("target_image")
        xt = x if seen is None else to_model_input({**batch, "image": seen})
        context_idx, target_idx = batch["context_idx"].long(), batch["target_idx"].long()
        self.student.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.backend.autocast():
            prediction = self.student(x, context_idx, target_idx)
            target, tokens = target_features(self.target, xt, target_idx)
        loss = jepa_loss(prediction, target, self.cfg.optim.loss).mean()
        loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad for p in self.params if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)  # before clipping, before zeroing
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.cfg.optim.grad_clip, grad_norm)
        self.optimizer.step()
        ema_update(self.target, self.raw.encoder, hyper["train/ema_momentum"])
        # Read by the skeleton one step later: the alarm for targets that carry no image.
        monitors = {"train/target_spread": sample_spread(tokens)}
        return StepResult(loss.detach(), grad_norm.detach(), monitor_rows(tokens), hyper, monitors)

    def end_of_unit(self, unit: int) -> tuple[dict[str, float], str | None]:
        return {}, None

    def images(self, batch: dict[str, Any], result: StepResult) -> dict[str, np.ndarray]:
        volume = batch["image"][0, 0].float().cpu().numpy() / 127.5 - 1.0
        target_idx = batch["target_idx"][0].cpu().numpy()
        strip = mask_overlay(volume, target_idx, self.grid, self.cfg.model.patch)
        # The EMA encoder's view of the same volume: its patch features, and where the centre
        # patch of the middle B-scan layer looks in its last block.
        block = self.target.blocks[-1]
        assert isinstance(block, Block)
        last = block.attn
        seen: list[torch.Tensor] = []
        hook = last.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
        try:
            with torch.no_grad():
                one = {k: batch[k][:1] for k in ("image", "gain", "shift")}
                tokens = self.target(to_model_input(one))[0].float().cpu().numpy()
                x = seen[-1][0].float()  # [N, D]: the last block's normed input
                heads, (gd, gh, gw) = last.num_heads, self.grid
                q, k, _ = last.qkv(x).reshape(x.shape[0], 3, heads, -1).unbind(1)  # [N, H, Dh]
                layer, query = gd // 2, (gh // 2, gw // 2)
                centre = (layer * gh + query[0]) * gw + query[1]
                scores = torch.einsum("hd,nhd->hn", q[centre], k) / q.shape[-1] ** 0.5
                weights = scores.softmax(dim=-1).mean(dim=0).reshape(gd, gh, gw)[layer]
        finally:
            hook.remove()
        patch = self.cfg.model.patch
        bscan = volume[layer * patch[0] + patch[0] // 2]
        return {
            "train/input_mask": strip,
            "train/target_features_pca": pca_rgb(tokens, self.grid, patch),
            "train/target_attention": attention_overlay(bscan, weights.cpu().numpy(), patch, query),
        }

    # --- validation ----------------------------------------------------------------------------

    def validation_size(self) -> int:
        """Validation volumes used: the split, or the first ``validation.batches`` batches'
        worth of every process (the same samples at every validation)."""
        n, cap = len(self.val_set), self.cfg.validation.batches
        batch = self.cfg.validation.batch_size or self.local_batch
        return n if cap is None else min(n, cap * batch * self.backend.process_count)

    def validate(self, unit: int) -> Evaluation:
        b, n = self.backend, self.validation_size()
        if self.val_loader is None:  # built once: its persistent workers serve every validation
            batch = self.cfg.validation.batch_size or self.local_batch
            self.val_loader = padded_loader(
                self.val_set, n, b.process_index, b.process_count, batch, self.cfg.data
            )
        dim = self.raw.encoder.embed_dim

        def rows(batch: dict[str, Any]) -> torch.Tensor:
            x = to_model_input(batch)
            ctx, tgt = batch["context_idx"].long(), batch["target_idx"].long()
            prediction = self.raw(x, ctx, tgt)
            target, tokens = target_features(self.target, x, tgt)
            loss = jepa_loss(prediction, target, self.cfg.optim.loss)
            pooled = tokens.float().mean(dim=1)
            return torch.cat([loss[:, None], pooled, batch["label"].float()[:, None]], dim=1)

        table = collect(rows, b.wrap_loader(self.val_loader), b, n, dim + 2, models=[self.raw])
        loss = float(table[:, 0].mean()) if n else math.nan
        features = torch.from_numpy(table[:, 1 : 1 + dim])
        erank = effective_rank(features)
        metrics = {
            "val/loss": loss,
            "val/samples": float(n),
            "val/feat_std": feature_std(features),
            "val/feat_erank": erank,
            # Pooled target features across the validation volumes: ~0 when they ignore the input.
            "val/target_spread": float(sample_spread(features)),
        }
        # Selection by a k-NN probe of the pooled target features on the labels: a collapsed
        # encoder can win on loss, never on the probe. No labels to probe: no selection.
        knn = knn_balanced_accuracy(table[:, 1 : 1 + dim], np.rint(table[:, 1 + dim]))
        metrics["val/knn_balanced_accuracy"] = knn
        alarm = representation_alarm(erank, self.cfg.validation.collapse_min_rank)
        score = None if math.isnan(knn) else knn
        return Evaluation(metrics, score=score, alarm=None if alarm is None else f"val: {alarm}")


def run_pretrain(cfg: PretrainConfig) -> RunResult:
    """Pretrain as configured; returns where the run went. Raises OcttrainError subclasses."""
    if cfg.data.label.concept is not None:
        raise ConfigError(
            "data.label.concept: pretraining learns without labels (its kNN monitor uses the "
            "study group); set data.label in the finetuning config"
        )
    backend = make_backend(cfg.train.device, cfg.train.precision, cfg.train.xla_cache_dir)
    if backend.kind == "cpu":
        torch.set_num_threads(cpu_threads(cfg.train.cpu_threads, cfg.data.num_workers))

    def build() -> PretrainJob:
        # data.select applies to pretraining too: e.g. pretrain on the macula scans only.
        manifest = select(read_manifest(cfg.data.manifest, "pretrain"), cfg.data.select)
        d = cfg.data
        check_batch_fits(
            len(manifest.split(d.train_split)[: d.max_samples]),
            d.batch_size,
            d.train_split,
            "volumes",
        )
        resolved = resolve(cfg, manifest)
        kernel, why = check_kernel(resolved, backend.device)
        log.info("attention: %s (%s)", kernel, why)
        return PretrainJob(resolved, manifest, backend)

    try:
        # A Ctrl-C on one host while the job is set up is agreed too (runtime/interrupt.py).
        with agreed_ctrl_c(backend.process_count):
            # A manifest or cache one host cannot read stops every host here, with its message.
            job = hosts.agreed(backend, "setting up the job", build)
            return Trainer(job, settings(job.cfg), backend).run()
    finally:
        backend.close()
