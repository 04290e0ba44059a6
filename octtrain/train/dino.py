"""``octtrain pretrain`` with ``job: dino``: DINOv2 (DINO + iBOT + KoLeo) on Cell Painting
fields, as a job of the one training skeleton (``train/loop.py``).

What is DINO's own: the student (2D ViT + DINO head + iBOT head) and its EMA teacher (eval
mode, no drop path, momentum on DINOv2's cosine); the centres of the teacher's logits (EMA over
replicas) and the teacher temperature warm-up; the step (multi-crop views built on the device
from uint8, the iBOT tokens gathered through the batch's fixed-size index list, the three
losses, AdamW with the scheduled lr (its peak scaled to the global batch by
``optim.scaling_rule``) times DINOv2's per-layer scales and weight decay, the prototypes at lr 0
for a share of the run, grad norm before clipping, each module clipped on its own norm, then the
EMA and centre updates; no host read between logged steps: ``docs/dinov2-recipe.md``); and the
pictures: the last block's attention and the patch features, read through the student's wrapper
(DDP or FSDP) at the first image step.
Everything else (run folder, resume, checkpoints, watchdog, data wait, non-finite and collapse
guards) is the skeleton's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from octstage.manifest import Manifest
from octtrain.config.dino import DinoConfig, checkpoint_config, layerscale_hint
from octtrain.config.loader import to_dict
from octtrain.data.cellpainting import (
    CellPaintingDataset,
    FieldRecord,
    field_channels,
    field_records,
    field_shapes,
    fields_loader,
    to_views,
)
from octtrain.data.dataset import read_manifest
from octtrain.data.intensity import pooled
from octtrain.data.splits import check_batch_fits
from octtrain.errors import CheckpointError, ConfigError, DataError
from octtrain.eval.cellpainting.cell_pictures import attention_heads, channel_strip, features_pca
from octtrain.eval.cellpainting.profile_run import field_embeddings, profiled
from octtrain.eval.cellpainting.retrieval import require_copairs
from octtrain.eval.cellpainting.scores import ProfiledField, profile_metrics
from octtrain.eval.common.collapse import target_entropies
from octtrain.models.attention_maps import AttentionCapture
from octtrain.models.dino import build_student, make_teacher, teacher_outputs
from octtrain.models.dino_loss import (
    Objective,
    Targets,
    centred_targets,
    objective,
    sinkhorn_knopp,
    update_center,
)
from octtrain.models.inputs import legacy_hint
from octtrain.models.jepa import ema_update
from octtrain.runtime import checkpoint as ckpt
from octtrain.runtime import hosts
from octtrain.runtime.backend import Backend, cpu_threads, make_backend
from octtrain.runtime.interrupt import agreed_ctrl_c
from octtrain.train import schedules
from octtrain.train.job import Evaluation, RunResult, Settings, StepResult, monitor_rows
from octtrain.train.loop import Trainer
from octtrain.train.optim import dino_optimizer, set_hyperparameters

log = logging.getLogger("octtrain")
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on the CPU
FULL_IN = StateDictOptions(full_state_dict=True)


def manifest_fields(manifest: Manifest, split: str) -> Sequence[FieldRecord]:
    """The Cell Painting fields of ``split`` (of the columnar manifest: a view of its table);
    DataError for a manifest of another kind."""
    if manifest.kind != "cellpainting" or not manifest.fields:
        raise DataError(
            f"the manifest (kind {manifest.kind!r}) lists no Cell Painting fields; job 'dino' "
            "needs a cache built with `octstage build-cache` from a Cell Painting load-data table"
        )
    return field_records(manifest.split_fields(split))


def collapse_entropies(probs: torch.Tensor) -> dict[str, float]:
    """DINO's two collapses, in nats (``log K`` is uniform): one prototype for every crop makes
    the batch-mean distribution's entropy fall to 0; uniform targets make each crop's entropy
    rise to ``log K``. Healthy training keeps the first high and the second well below it (the
    step hands the same values to the skeleton as device scalars: ``target_entropies``)."""
    return {k: float(v) for k, v in target_entropies(probs).items()}


def teacher_temperature(step: int, cfg: DinoConfig) -> float:
    """The configured teacher temperature warm-up (``schedules.teacher_temperature``), its
    length a share of the schedule's steps or a number of steps."""
    d = cfg.dino
    return schedules.teacher_temperature(
        step,
        warmup_steps=d.teacher_temp_warmup(cfg.schedule.total_steps or cfg.max_steps),
        start=d.warmup_teacher_temp,
        end=d.teacher_temp,
    )


def refuse_multihost_xla(backend: Backend) -> None:
    """ConfigError for DINO on XLA with more than one process: its step is not correct there
    yet (docs/tpu-runbook.md, "DINO on XLA"), so it is refused before anything is built."""
    if backend.kind == "xla" and backend.process_count > 1:
        raise ConfigError(
            f"job 'dino' on XLA with {backend.process_count} processes: not supported (the "
            "iBOT mask positions, the centres and the position-embedding resize are per host "
            "under multi-host SPMD; docs/tpu-runbook.md, DINO on XLA). Run DINO on torch CPU "
            "or CUDA (one process, or several under torchrun with parallel=ddp or fsdp), or "
            "on XLA with one process (one host's devices)"
        )


class DinoJob:
    """The DINOv2 student, its EMA teacher, the centres, the optimizer and one process's data."""

    kind = "pretrain"
    steps_per_unit = 1
    validates_last = False

    def __init__(
        self,
        cfg: DinoConfig,
        train: Sequence[FieldRecord],
        root: Path,
        backend: Backend,
        val: Sequence[ProfiledField] = (),
    ) -> None:
        refuse_multihost_xla(backend)
        self.cfg, self.backend = cfg, backend
        self.total_steps = cfg.max_steps
        self.global_batch = cfg.data.batch_size
        self.schedule_steps = cfg.schedule.total_steps or cfg.max_steps
        self.local_batch = hosts.local_batch(cfg.data.batch_size, backend)
        # The peak lr at the global batch (DINOv2's scaling rule), said once.
        self.optim = dataclasses.replace(cfg.optim, lr=cfg.optim.peak_lr(self.global_batch))
        if backend.is_main:
            log.info(
                "peak lr %.4g: optim.lr %.4g, optim.scaling_rule %s, global batch %d (%d "
                "process(es))",
                self.optim.lr,
                cfg.optim.lr,
                cfg.optim.scaling_rule,
                self.global_batch,
                backend.process_count,
            )
        # The prototypes stay fixed for this many steps (a share of the run, or steps).
        self.frozen_steps = cfg.dino.frozen_last_layer(self.schedule_steps)
        with backend.autocast():
            mixed = torch.is_autocast_enabled(backend.device.type)
        if backend.device.type == "cuda" and mixed:
            # The heads' prototypes run in float32 (models/dino.py: cosines divided by 0.04):
            # as TF32 on tensor cores (fp16's 10 input bits, float32 sums and output), not at
            # plain float32's fraction of the speed (~2.6 TFLOP a ViT-S/8 step). Under bf16
            # autocast the other float32 products are validation's and KoLeo's.
            torch.set_float32_matmul_precision("high")
        if not train:
            raise DataError(f"the manifest has no fields in split {cfg.data.train_split!r}")
        channels = {int(c) for c in np.unique(field_shapes(train)[:, 0])}
        if len(channels) != 1:
            raise DataError(f"fields with different channel counts: {sorted(channels)}")
        in_chans = cfg.model.in_chans or channels.pop()
        if cfg.model.in_chans is not None and cfg.model.in_chans not in channels:
            raise ConfigError(f"model.in_chans {cfg.model.in_chans} but fields have {channels}")
        # The stains' names, in the manifest's order, so ``embed`` can refuse fields of others.
        named = field_channels(train)
        self.channels = list(named) if named else None
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every replica
        self.raw = build_student(cfg, in_chans).to(backend.device)
        # The train split's channel statistics (manifest), before the teacher copies them.
        stats = pooled(train, in_chans).to_input()
        self.raw.backbone.input_norm.set_stats(*stats)
        # The views' jitter is in these units too (to_views), whatever the model's input_norm.
        # On the device once: the step reads them with no host-to-device copy.
        dev = backend.device
        self.channel_stats = (
            torch.tensor(stats[0], device=dev),
            torch.tensor(stats[1], device=dev),
        )
        self.student: nn.Module = self.raw
        self.teacher = make_teacher(self.raw)
        self.teacher_forward: nn.Module = self.teacher  # compiled in start() with ``compile``
        self.depth = len(self.raw.backbone.blocks)
        self.optimizer = dino_optimizer(self.raw, self.optim, self.depth)
        self._trainable()
        # FSDP only across processes (one process has nothing to shard over).
        self.fsdp = cfg.parallel == "fsdp" and backend.process_count > 1
        self._optimizer_state: dict[str, Any] | None = None
        self._gathered: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None = None
        self.center = torch.zeros(cfg.dino.dino_prototypes, device=dev)
        self.ibot_center = torch.zeros(cfg.dino.ibot_prototypes, device=dev)
        # The teacher temperature on the device, refilled each step (a fill, no host copy).
        self.temp = torch.zeros((), device=dev)
        d = cfg.dino
        sinkhorn = d.centering == "sinkhorn_knopp"
        self.targets: Targets = self._sinkhorn_targets if sinkhorn else centred_targets
        self.objective = objective  # compiled in start() with ``compile`` (centring only)
        self.train_set = CellPaintingDataset(
            train,
            root,
            cfg.crops,
            self.raw.backbone.patch,
            d.mask_probability,
            d.mask_ratio,
            cfg.data.max_samples,
        )
        self.val_fields = profiled(val)
        controls = {f.is_control for f in self.val_fields}
        if cfg.validation.every and controls != {True, False}:
            # The score is activity mAP: treated wells ranked against control wells.
            missing = (
                "treated wells"
                if controls == {True}
                else "control wells"
                if controls == {False}
                else "fields with perturbation metadata"
            )
            raise DataError(
                f"validation.every={cfg.validation.every} but split {cfg.data.val_split!r} has "
                f"no {missing} to profile (build the cache with --metadata and keep control and "
                "treated wells on the validation plates, or set validation.every=0)"
            )
        if cfg.validation.every:
            require_copairs(f"validation.every={cfg.validation.every}")
        self.val_set = CellPaintingDataset(
            self.val_fields, root, cfg.crops, self.raw.backbone.patch
        )

    # --- state ---------------------------------------------------------------------------------

    def state(self, step: int) -> dict[str, Any]:
        if self._gathered is not None:  # FSDP: gathered on every process at the unit's end
            model, teacher, optim = self._gathered
            self._gathered = None
        else:
            model, teacher = self.raw.state_dict(), self.teacher.state_dict()
            optim = get_optimizer_state_dict(self.raw, self.optimizer, options=FULL)
        return {
            "format": 1,
            "kind": "dino",
            "student": model,
            "teacher": teacher,
            "center": self.center,
            "ibot_center": self.ibot_center,
            "optimizer": optim,  # keyed by parameter name: DDP and FSDP runs resume each other
            "schedule": {"step": step},
            "rng": ckpt.rng_state(),
            "config": to_dict(self.cfg),
            "channels": self.channels,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        ckpt.require_kind(state, "resume", ("dino",), ckpt.ANOTHER_JOB)
        # Filled and resolved as this version builds it: a checkpoint from before an option
        # compares as what it was trained with (no LayerScale, no share of the run).
        try:
            saved, current = to_dict(checkpoint_config(state["config"])), to_dict(self.cfg)
        except ConfigError as exc:
            raise CheckpointError(f"the checkpoint's config does not build here: {exc}") from None
        for section in ("model", "dino"):
            if saved.get(section) != current[section]:
                old, new = saved.get(section) or {}, current[section]
                diff = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
                raise CheckpointError(
                    f"the checkpoint's {section} config differs from this run's (checkpoint, "
                    f"run): {diff}" + legacy_hint(diff) + layerscale_hint(diff)
                )
        self.raw.load_state_dict(state["student"])
        self.teacher.load_state_dict(state["teacher"])
        self.center.copy_(state["center"])
        self.ibot_center.copy_(state["ibot_center"])
        self._optimizer_state = state["optimizer"]  # applied in start(), after any sharding
        ckpt.set_rng_state(state["rng"])

    def _shard(self) -> None:
        """FSDP2: every transformer block and the whole model, student and teacher alike (the
        EMA then runs shard by shard); the optimizer is rebuilt on the sharded parameters."""
        from torch.distributed.fsdp import fully_shard

        for model in (self.raw, self.teacher):
            for block in model.backbone.blocks:
                fully_shard(block)
            fully_shard(model, reshard_after_forward=True)  # the root too: the EMA needs shards
        self.optimizer = dino_optimizer(self.raw, self.optim, self.depth)
        self._trainable()

    def _trainable(self) -> None:
        self.params = [p for p in self.raw.parameters() if p.requires_grad]
        # What is clipped on its own norm: each of the student's modules, or all at once.
        if self.cfg.optim.grad_clip_scope == "global":
            self.clip_groups = [self.params]
        else:
            modules = (self.raw.backbone, self.raw.dino_head, self.raw.ibot_head)
            self.clip_groups = [
                [p for p in m.parameters() if p.requires_grad] for m in modules if m is not None
            ]

    def _will_save(self, unit: int) -> bool:
        """Whether the skeleton saves after ``unit`` (its rule in ``loop._unit_end``)."""
        s, last = self.cfg, unit == self.total_steps
        every = s.validation.every
        validate = bool(every and unit % every == 0) or (last and bool(every))
        return unit % s.checkpoint.every == 0 or last or validate

    # --- training ------------------------------------------------------------------------------

    def start(self, start_step: int) -> Any:
        if self.fsdp:
            self._shard()
            self.student = self.raw
        else:
            self.student = self.backend.wrap_model(self.raw)
        if self.cfg.compile != "none":
            # The wrapper's forward compiled (DDP's hooks stay outside the graph); the step's
            # shapes never change (fixed crops, fixed iBOT index list): one graph each.
            backend = self.cfg.compile
            self.student = torch.compile(self.student, backend=backend)  # type: ignore[assignment]
            self.teacher_forward = torch.compile(self.teacher, backend=backend)  # type: ignore[assignment]
            if self.cfg.dino.centering == "center":
                # Sinkhorn-Knopp's sums cross replicas (collectives): that objective stays eager.
                self.objective = torch.compile(objective, backend=backend)
        if self._optimizer_state is not None:
            set_optimizer_state_dict(
                self.raw, self.optimizer, self._optimizer_state, options=FULL_IN
            )
            self._optimizer_state = None
        b = self.backend
        return fields_loader(
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
        """lr and weight decay as pretraining's; DINOv2's cosine teacher momentum and teacher
        temperature warm-up."""
        cfg, total = self.cfg, self.schedule_steps
        s = cfg.schedule
        return {
            **schedules.ema_pretraining(step, self.optim, s, total),
            "train/ema_momentum": schedules.ema_cosine(
                step, total_steps=total, start=s.ema_start, end=s.ema_end
            ),
            "train/teacher_temp": teacher_temperature(step, cfg),
        }

    def train_step(self, batch: dict[str, Any], step: int) -> StepResult:
        d = self.cfg.dino
        hyper = self.hyperparameters(step)
        frozen = step < self.frozen_steps  # the prototypes: DINOv2's first epoch of 100
        set_hyperparameters(self.optimizer, hyper["train/lr"], hyper["train/weight_decay"], frozen)
        global_views, local_views, masks = to_views(batch, self.channel_stats)
        mask_index, mask_weight = batch["mask_index"], batch["mask_weight"]
        self.student.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.backend.autocast():
            out = self.student(global_views, local_views, masks, mask_index=mask_index)
            t_logits, t_masked, _ = teacher_outputs(
                self.teacher_forward,  # type: ignore[arg-type]
                global_views,
                masks,
                mask_index,
            )
        self.temp.fill_(hyper["train/teacher_temp"])
        obj: Objective = self.objective(
            (out.global_logits, out.local_logits, out.global_cls, out.masked_logits),
            (t_logits, t_masked),
            (self.center, self.ibot_center),
            self.temp,
            mask_weight,
            masks.shape[0],
            d.student_temp,
            (d.dino_weight, d.ibot_weight, d.koleo_weight),
            self.targets,
        )
        loss, parts = obj.loss, obj.parts
        loss.backward()  # type: ignore[no-untyped-call]
        grad_norm = self._clip()
        self.optimizer.step()
        ema_update(self.teacher, self.raw, hyper["train/ema_momentum"])
        self._update_centers(obj.dino_mean, obj.ibot_total)
        host = dict(hyper)
        done = step + 1
        if done % self.cfg.logging.log_every == 0 or done == self.total_steps or step == 0:
            # The users' breakdown (dino / ibot / koleo); read only on logged steps.
            host |= {f"train/{k}_loss": float(v.detach()) for k, v in parts.items()}
        rows = monitor_rows(out.global_cls.detach()[:, None, :])
        # Read by the skeleton one step later: the alarm for targets that carry no image.
        monitors = target_entropies(obj.probs)
        return StepResult(loss.detach(), grad_norm.detach(), rows, host, monitors)

    def _clip(self) -> torch.Tensor:
        """Clip to ``optim.grad_clip`` each module's gradients (DINOv2: the backbone, the DINO
        head and the iBOT head, each on its own norm) or the student's at once
        (``optim.grad_clip_scope``); the whole student's norm before clipping, for the log."""
        norms: list[torch.Tensor] = []
        for params in self.clip_groups:
            grads = [p.grad for p in params if p.grad is not None]
            if not grads:
                continue
            norm = torch.nn.utils.get_total_norm(grads)  # before clipping, before zeroing
            if isinstance(norm, DTensor):  # FSDP: the norm over every shard
                norm = norm.full_tensor()
            if self.cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grads_with_norm_(params, self.cfg.optim.grad_clip, norm)
            norms.append(norm)
        total: torch.Tensor = torch.linalg.vector_norm(torch.stack(norms))
        return total

    def _sinkhorn_targets(
        self,
        logits: torch.Tensor,
        center: torch.Tensor,
        temp: torch.Tensor,
        valid: torch.Tensor | None,
    ) -> torch.Tensor:
        """Sinkhorn-Knopp over every replica's batch (``dino.centering``; no centre);
        ``valid`` leaves the iBOT index list's padding out."""
        return sinkhorn_knopp(logits, temp, reduce_sum=self.backend.reduce_step_sum, valid=valid)

    def _update_centers(self, dino_mean: torch.Tensor, ibot_total: torch.Tensor) -> None:
        """Centres <- EMA of the teacher's mean logits over every replica's batch (the iBOT
        centre over the masked tokens alone, not the padding): this process's sums
        (``Objective``) reduced."""
        m, world = self.cfg.dino.center_momentum, self.backend.process_count
        dino_mean = self.backend.reduce_step_sum(dino_mean) / world
        self.center = update_center(self.center, dino_mean, m)
        total = self.backend.reduce_step_sum(ibot_total)
        ibot_mean = total[:-1] / total[-1].clamp(min=1.0)
        self.ibot_center = torch.where(
            total[-1] > 0, update_center(self.ibot_center, ibot_mean, m), self.ibot_center
        )

    def end_of_unit(self, unit: int) -> tuple[dict[str, float], str | None]:
        if self.fsdp and self._will_save(unit):
            # Gathering is a collective: every process joins here, process 0 keeps the result.
            self._gathered = (
                get_model_state_dict(self.raw, options=FULL),
                get_model_state_dict(self.teacher, options=FULL),
                get_optimizer_state_dict(self.raw, self.optimizer, options=FULL),
            )
        return {}, None

    def images(self, batch: dict[str, Any], result: StepResult) -> dict[str, np.ndarray]:
        """The first field's first global crop: its channels, the student's last-block CLS
        attention per head (through the wrapper, as the step runs it) and its patch PCA."""
        global_views, _, _ = to_views(batch, self.channel_stats)
        x = global_views[:1]
        with torch.no_grad(), AttentionCapture(self.student) as cap:
            out = cap(x, None, None)
        assert cap.weights is not None
        patch = self.raw.backbone.patch
        grid = self.raw.backbone.grid(x.shape[-2], x.shape[-1])
        crop = x[0].float().cpu().numpy()
        weights = cap.weights[0].reshape(-1, *grid).numpy()
        tokens = out.patches[0].float().cpu().numpy()
        return {
            "train/input_channels": channel_strip(crop),
            "train/attention": attention_heads(crop[0], weights, patch),
            "train/features_pca": features_pca(tokens, grid, patch),
        }

    def validate(self, unit: int) -> Evaluation:
        """The EMA teacher judged as ``octtrain profile`` judges it, on the validation plates:
        its field embeddings, control-normalised well profiles, and their activity mAP (the
        score: higher is better), distinctiveness mAP and k-NN probes. Every process computes the
        same figures (the split is small; under FSDP the teacher's forward is a collective),
        each batch of fields agreed (``agreed_batches``): a field one host cannot read stops
        every host's validation at that batch with its message."""
        if not self.val_fields:
            return Evaluation({}, score=None)
        backbone = self.teacher.backbone
        mode = backbone.training  # the step's mode comes back after validation, whatever it was
        backbone.eval()
        try:
            b = self.backend
            x = field_embeddings(backbone, self.val_set, self.cfg.crops.global_size, b.device, b)
        finally:
            backbone.train(mode)
        metrics = profile_metrics(x, self.val_fields)
        score = metrics["activity_map"]
        return Evaluation({f"val/{k}": v for k, v in metrics.items()}, score=score)


def run_dino(cfg: DinoConfig) -> RunResult:
    """DINOv2 pretraining as configured; raises OcttrainError subclasses."""
    backend = make_backend(cfg.train.device, cfg.train.precision)
    if backend.kind == "cpu":
        torch.set_num_threads(cpu_threads(cfg.train.cpu_threads, cfg.data.num_workers))

    def build() -> DinoJob:
        manifest = read_manifest(cfg.data.manifest, "pretrain", "cellpainting")
        assert cfg.data.manifest is not None
        root = Path(cfg.data.cache) if cfg.data.cache else Path(cfg.data.manifest).parent
        train = manifest_fields(manifest, cfg.data.train_split)
        d = cfg.data
        check_batch_fits(len(train[: d.max_samples]), d.batch_size, d.train_split, "fields")
        val = manifest.split_fields(cfg.data.val_split) if cfg.validation.every else ()
        return DinoJob(cfg, train, root, backend, val)

    try:
        # A Ctrl-C on one host while the job is set up is agreed too (runtime/interrupt.py).
        with agreed_ctrl_c(backend.process_count):
            # A manifest or cache one host cannot read stops every host here, with its message.
            job = hosts.agreed(backend, "setting up the job", build)
            return Trainer(job, Settings.of(cfg), backend).run()  # type: ignore[arg-type]
    finally:
        backend.close()
