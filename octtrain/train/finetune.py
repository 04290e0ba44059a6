"""``octtrain finetune``: a pretrained encoder + a head, a job of the training skeleton.

What is finetuning's own: the classifier (the EMA encoder of a pretraining checkpoint by default,
or a random one for the supervised reference) and its layer-wise-decayed optimizer; epochs of
``steps`` optimizer steps, each of ``accum`` micro-batches (strided slices of the step's batch,
so every device keeps working under SPMD); the encoder thawing at ``schedule.unfreeze_epoch``
(also on resume); the epoch's train metrics from every prediction of the epoch, kept on the
device in a buffer sized by the rows the step sees (the global batch under SPMD) and read once
at the epoch's end; and validation with classification metrics, the confusion matrix, the
prediction-collapse alarm and the early-stopping score.

``data.select`` and ``data.label`` (data/select.py) choose the volumes and what they are trained
to predict, from the manifest alone, before anything is built. A regression on a clinical
concept (``data.label.task: regression``) uses the same skeleton with a one-output head, an MSE
loss on the standardized target, and MAE / RMSE / R^2 where a classification has its metrics
(eval/oct/regression.py); its early-stopping score is ``-MAE``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from torch.utils.data import DataLoader

from octstage.manifest import Manifest
from octtrain.config.finetune import FinetuneConfig
from octtrain.config.loader import to_dict
from octtrain.config.sections import ModelConfig
from octtrain.data.acquisition import make_transform
from octtrain.data.dataset import (
    ManifestDataset,
    Transform,
    read_manifest,
    to_model_input,
    volume_shape,
)
from octtrain.data.intensity import pooled
from octtrain.data.loaders import padded_loader, train_loader
from octtrain.data.samplers import balanced_probabilities
from octtrain.data.select import Selection, prepare
from octtrain.data.splits import check_batch_fits, check_splits, class_weights
from octtrain.errors import CheckpointError, ConfigError, DataError
from octtrain.eval.common import metrics as mt
from octtrain.eval.common.validation import predict
from octtrain.eval.oct import regression as rg
from octtrain.eval.oct.report import class_table, confusion_rgb, print_metrics, short
from octtrain.models import flash_blocks
from octtrain.models.attention import choose
from octtrain.models.classifier import build_classifier, encoder_from_state, make_loss
from octtrain.models.vit3d import ViT3D, encoder_from_config
from octtrain.runtime import checkpoint as ckpt
from octtrain.runtime import hosts
from octtrain.runtime.backend import Backend, cpu_threads, make_backend
from octtrain.runtime.interrupt import agreed_ctrl_c
from octtrain.train.job import Evaluation, RunResult, Settings, StepResult
from octtrain.train.loop import Trainer
from octtrain.train.optim import finetune_optimizer, lr_factors, set_learning_rates, unfreeze

log = logging.getLogger("octtrain")
console = Console(stderr=True)


def frozen_at(cfg: FinetuneConfig, epoch: int) -> bool:
    """Is the encoder frozen during ``epoch`` (0-based)?"""
    unfreeze_epoch = cfg.schedule.unfreeze_epoch
    return unfreeze_epoch is None or epoch < unfreeze_epoch


def settings(cfg: FinetuneConfig) -> Settings:
    """The skeleton's view of a finetuning config: early stopping on the validation score."""
    return Settings.of(cfg, cfg.early_stopping.patience, cfg.early_stopping.min_delta)


# What --init takes (said when it names something else).
INIT_WANTS = (
    "--init wants the V-JEPA pretraining checkpoint the encoder starts from: a step_*.pt "
    "file of `octtrain pretrain`, or its run's checkpoints/ folder (its latest); "
    "init_encoder=random needs none"
)


def initial_encoder(
    cfg: FinetuneConfig, manifest: Manifest, init: str | None, backend: Backend
) -> tuple[ViT3D, FinetuneConfig, dict[str, Any]]:
    """The encoder to start from: a checkpoint's (read once, broadcast) or a random one."""
    if cfg.init_encoder == "random":
        shape = cfg.model.input_shape or volume_shape(
            manifest.split(cfg.data.train_split) + manifest.split(cfg.data.val_split)
        )
        model = dataclasses.replace(cfg.model, input_shape=shape)
        cfg = dataclasses.replace(cfg, model=model)
        encoder = encoder_from_config(model)
        # A pretrained encoder brings the statistics it was trained with; a random one the
        # train split's, as pretraining would have.
        train = manifest.split(cfg.data.train_split)
        encoder.input_norm.set_stats(*pooled(train, 1).to_input())
        return encoder, cfg, {"url": None, "encoder": "random", "step": 0}
    if init is None:
        raise ConfigError(f"init_encoder={cfg.init_encoder!r} needs --init CHECKPOINT")
    try:
        state = hosts.load_once(init, backend)
    except CheckpointError as exc:
        raise CheckpointError(f"--init: {exc} ({INIT_WANTS})") from None
    ckpt.require_kind(state, f"--init {init}", ("pretrain",), INIT_WANTS)
    encoder, model_cfg, info = encoder_from_state(state, init, cfg.model, cfg.init_encoder)
    return encoder, dataclasses.replace(cfg, model=model_cfg), info


class FinetuneJob:
    """Classifier, optimizer, loss and the data of one process."""

    kind = "finetune"
    validates_last = True

    def __init__(
        self,
        cfg: FinetuneConfig,
        manifest: Manifest,
        init: str | None,
        backend: Backend,
        selection: Selection | None = None,
    ) -> None:
        self.backend = backend
        self.selection = selection
        self.regression = cfg.data.label.regression
        d = cfg.data
        self.summary = check_splits(manifest, [d.train_split, d.val_split])
        self.classes = self.summary.classes
        self.num_classes = len(self.classes)
        torch.manual_seed(cfg.train.seed)  # identical heads on every replica
        encoder, cfg, self.init_info = initial_encoder(cfg, manifest, init, backend)
        self.cfg = cfg
        self.depth = cfg.model.sizes().depth
        self.accum = cfg.accum_steps
        self.local_batch = hosts.local_batch(d.batch_size, backend)
        self.global_batch = d.batch_size * self.accum
        self._build_data(manifest)
        self.total_steps = cfg.epochs * self.steps_per_unit
        self.warmup_steps = round(cfg.schedule.warmup_epochs * self.steps_per_unit)
        self.weights = class_weights(cfg.loss, self.train_counts)
        w = None if self.weights is None else torch.tensor(self.weights, dtype=torch.float32)
        self.loss_fn: torch.nn.Module = make_loss(w, cfg.loss.label_smoothing).to(backend.device)
        if self.regression:
            self.loss_fn = torch.nn.MSELoss().to(backend.device)

        model = build_classifier(encoder, cfg.head, encoder.embed_dim, self.num_classes)
        model.freeze_encoder(frozen_at(cfg, 0))
        self.raw = model.to(backend.device)
        self.model: torch.nn.Module = self.raw
        self.optimizer = finetune_optimizer(
            model, cfg.optim, self.depth, with_encoder=not frozen_at(cfg, 0)
        )
        # Every prediction of an epoch, on the device: one slot per micro-batch, as many rows as
        # the step sees (this process's micro-batch under DDP, the global one under SPMD).
        rows = hosts.step_batch(d.batch_size, backend)
        c = self.num_classes
        self.preds = torch.zeros(
            self.steps_per_unit * self.accum, rows, c + 1, device=backend.device
        )
        self.loss_sum = torch.zeros((), device=backend.device)
        self.results: dict[int, dict[str, mt.ClassificationMetrics]] = {}
        self.regression_results: dict[int, dict[str, rg.RegressionMetrics]] = {}

    def _build_data(self, manifest: Manifest) -> None:
        cfg, d = self.cfg, self.cfg.data
        shape = cfg.model.input_shape
        assert shape is not None and d.manifest is not None
        cached = volume_shape(manifest.split(d.train_split) + manifest.split(d.val_split))
        self.cache_shape = list(cached)  # in the checkpoint: evaluate compares its cache's
        if any(w > s for w, s in zip(shape, cached, strict=True)):
            raise DataError(f"model input {list(shape)} exceeds the cached volumes {list(cached)}")
        root = Path(d.cache) if d.cache else Path(d.manifest).parent
        aug = make_transform(shape, d.augment, cfg.acquisition)
        concept = d.label.concept if self.regression else None
        self.train_set = ManifestDataset(
            manifest, root, d.train_split, aug, d.max_samples, target_concept=concept
        )
        self.val_set = ManifestDataset(
            manifest, root, d.val_split, Transform(shape, None), d.max_samples,
            target_concept=concept,
        )  # fmt: skip
        self.scale = rg.Standardizer.fit(
            [v.clinical.get(str(concept), 0.0) for v in self.train_set.volumes]
        )
        check_batch_fits(len(self.train_set), d.batch_size, d.train_split, "volumes", self.accum)
        self.steps_per_unit = len(self.train_set) // (d.batch_size * self.accum)
        labels = [v.label for v in self.train_set.volumes]
        self.train_counts = np.bincount(labels, minlength=self.num_classes).tolist()
        self.probabilities = (
            balanced_probabilities(labels, self.num_classes) if d.balanced_sampling else None
        )
        b = self.backend
        val_batch = cfg.validation.batch_size or self.local_batch
        self.val_loader = padded_loader(
            self.val_set, len(self.val_set), b.process_index, b.process_count, val_batch, d
        )

    # --- state ---------------------------------------------------------------------------------

    def state(self, step: int) -> dict[str, Any]:
        epoch = step // self.steps_per_unit
        return {
            "format": 1,
            "kind": "finetune",
            "epoch": epoch,
            "model": self.raw.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "config": to_dict(self.cfg),
            "classes": list(self.classes),
            "metrics": self._metrics_of(epoch),
            "regression": self.scale.as_dict() if self.regression else None,
            "cache_shape": self.cache_shape,
            "init": self.init_info,
            "rng": ckpt.rng_state(),
        }

    def _metrics_of(self, epoch: int) -> dict[str, Any]:
        if self.regression:
            found = self.regression_results.get(epoch)
            return {} if found is None else {k: m.as_dict() for k, m in found.items()}
        results = self.results.get(epoch)
        return {} if results is None else mt.to_jsonable(results["volume"], self.classes)

    def load_state(self, state: dict[str, Any]) -> None:
        ckpt.require_kind(state, "resume", ("finetune",), ckpt.ANOTHER_JOB)
        # The saved optimizer has the groups of the last epoch trained (0-based epoch - 1):
        # thaw first only if that epoch was unfrozen; before_step thaws at the next epoch start.
        if not frozen_at(self.cfg, int(state["epoch"]) - 1):
            unfreeze(self.raw, self.optimizer, self.cfg.optim, self.depth)
        self.raw.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        ckpt.set_rng_state(state["rng"])

    # --- training ------------------------------------------------------------------------------

    def start(self, start_step: int) -> DataLoader[dict[str, Any]]:
        b, per_step = self.backend, self.local_batch * self.accum
        self.model = b.wrap_model(self.raw)
        return train_loader(
            self.train_set,
            self.cfg.data,
            per_step,
            b.process_index,
            b.process_count,
            self.cfg.train.seed,
            start_step=start_step,
            per_epoch=self.steps_per_unit * per_step,
            probabilities=self.probabilities,
        )

    def before_step(self, step: int) -> None:
        if step % self.steps_per_unit:
            return
        epoch = step // self.steps_per_unit
        if not frozen_at(self.cfg, epoch) and self.raw.encoder_frozen:
            before = len(self.optimizer.param_groups)
            unfreeze(self.raw, self.optimizer, self.cfg.optim, self.depth)
            # DDP registers only trainable parameters when it is built: wrap again so the
            # encoder's gradients are averaged across processes too.
            self.model = self.backend.wrap_model(self.raw)
            log.info(
                "epoch %d: encoder unfrozen, optimizer groups %d -> %d",
                epoch + 1,
                before,
                len(self.optimizer.param_groups),
            )
        self.preds.zero_()
        self.loss_sum.zero_()

    def train_step(self, batch: dict[str, Any], step: int) -> StepResult:
        cfg, spu = self.cfg, self.steps_per_unit
        lrs = set_learning_rates(
            self.optimizer,
            *lr_factors(step, spu, self.warmup_steps, self.total_steps, cfg.schedule),
        )
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.backend.device)
        for j in range(self.accum):
            micro = {k: v[j :: self.accum] for k, v in batch.items() if isinstance(v, torch.Tensor)}
            last = j == self.accum - 1
            no_sync = getattr(self.model, "no_sync", None)
            ctx = contextlib.nullcontext() if last or no_sync is None else no_sync()
            with ctx:
                with self.backend.autocast():
                    logits = self.model(to_model_input(micro))
                if self.regression:
                    target = micro["target"].float()
                    loss = self.loss_fn(logits.float()[:, 0], self.scale.forward(target))
                else:
                    loss = self.loss_fn(logits.float(), micro["label"])
                (loss / self.accum).backward()
            if self.regression:
                value = self.scale.inverse(logits.detach().float()[:, :1])
                row = torch.cat([value, micro["target"].float()[:, None]], dim=1)[None]
            else:
                probs = torch.softmax(logits.detach().float(), dim=-1)
                row = torch.cat([probs, micro["label"].float()[:, None]], dim=1)[None]
            slot = torch.tensor([(step % spu) * self.accum + j], device=self.backend.device)
            self.preds.index_copy_(0, slot, row)
            total = total + loss.detach()
        params = [p for p in self.raw.parameters() if p.requires_grad]
        grads = [p.grad for p in params if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)  # before clipping, before zeroing
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, cfg.optim.grad_clip, grad_norm)
        self.optimizer.step()
        mean = total / self.accum
        self.loss_sum += mean
        return StepResult(mean, grad_norm.detach(), None, {f"train/{k}": v for k, v in lrs.items()})

    def end_of_unit(self, unit: int) -> tuple[dict[str, float], str | None]:
        c = self.num_classes
        rows = hosts.gather_step_rows(self.backend, self.preds.reshape(-1, c + 1))
        loss = hosts.mean_over_replicas(self.backend, self.loss_sum / self.steps_per_unit)
        if self.regression:
            rm = rg.regression_metrics(rows[:, 0], rows[:, 1])
            out = rg.flat("train_epoch", rm) | {"train_epoch/loss": loss}
            out["train_epoch/samples"] = float(rm.num_samples)
            out["train_epoch/encoder_frozen"] = float(self.raw.encoder_frozen)
            return out, None
        labels = np.rint(rows[:, c]).astype(np.int64)
        m = mt.classification_metrics(labels, rows[:, :c], c)
        metrics = {f"train_epoch/{k}": v for k, v in mt.flat_scalars(m, self.classes).items()}
        metrics |= {
            "train_epoch/loss": loss,
            "train_epoch/samples": float(m.num_samples),
            "train_epoch/encoder_frozen": float(self.raw.encoder_frozen),
        }
        compiles = self.backend.compile_count()  # XLA: must stop growing once every kind ran
        if compiles is not None:
            metrics["train_epoch/compile_count"] = float(compiles)
        return metrics, self._collapse("train", m, unit)

    def _collapse(self, split: str, m: mt.ClassificationMetrics, epoch: int) -> str | None:
        alarm = mt.check_collapse(m.histogram, self.cfg.validation.collapse_max_share)
        if alarm is None:
            return None
        return f"{split}, epoch {epoch}: {alarm.message([short(n) for n in self.classes])}"

    def images(self, batch: dict[str, Any], result: StepResult) -> dict[str, np.ndarray]:
        return {}

    # --- validation ----------------------------------------------------------------------------

    def validate(self, unit: int) -> Evaluation:
        c, names, b = self.num_classes, self.classes, self.backend
        batches = b.wrap_loader(self.val_loader)
        if self.regression:
            return self._validate_regression(unit, batches)
        preds = predict(self.raw, batches, b, len(self.val_set), c, to_model_input)
        m = mt.classification_metrics(preds.labels, preds.probs, c)
        metrics = {f"val/{k}": v for k, v in mt.flat_scalars(m, names).items()}
        metrics |= {"val/loss": preds.nll, "val/samples": float(m.num_samples)}
        results = {"volume": m}
        if self.cfg.validation.participant_level:
            pids = [v.participant_id for v in self.val_set.volumes]
            _, plabels, pprobs = mt.participant_level(pids, preds.labels, preds.probs)
            pm = mt.classification_metrics(plabels, pprobs, c)
            metrics |= {f"val_participant/{k}": v for k, v in mt.flat_scalars(pm, names).items()}
            metrics["val_participant/samples"] = float(pm.num_samples)
            results["participant"] = pm
        self.results[unit] = results
        images = {}
        if b.is_main:
            title = f"validation, epoch {unit}"
            images["val/confusion_matrix"] = confusion_rgb(m.confusion, names, title)
        score = m.scalar(self.cfg.early_stopping.metric)
        return Evaluation(metrics, score, self._collapse("val", m, unit), images)

    def _validate_regression(self, unit: int, batches: Any) -> Evaluation:
        n = len(self.val_set)
        pred, target = rg.predict_values(
            self.raw, batches, self.backend, n, self.scale, to_model_input
        )
        vm = rg.regression_metrics(pred, target)
        pids = [v.participant_id for v in self.val_set.volumes]
        pm = rg.regression_metrics(*rg.participant_means(pids, pred, target))
        self.regression_results[unit] = {"volume": vm, "participant": pm}
        metrics = rg.flat("val", vm) | rg.flat("val_participant", pm)
        metrics["val/samples"] = float(vm.num_samples)
        return Evaluation(metrics, -vm.mae, None, {})


def check_kernel_lengths(kernel: str, model: ModelConfig) -> None:
    """ConfigError before any compile when ``kernel`` is flash and the encoder's token count
    (it sees every patch) does not fit flash's blocks."""
    shape = model.input_shape
    if kernel == "flash" and shape is not None:
        n = math.prod(d // p for d, p in zip(shape, model.patch, strict=True))
        flash_blocks.check_lengths({"encoder": n})


def run_finetune(cfg: FinetuneConfig, init: str | None) -> RunResult:
    """Finetune from the pretraining checkpoint ``init`` (None with ``init_encoder: random``)."""
    d = cfg.data
    backend = make_backend(cfg.train.device, cfg.train.precision, cfg.train.xla_cache_dir)
    if backend.kind == "cpu":
        torch.set_num_threads(cpu_threads(cfg.train.cpu_threads, cfg.data.num_workers))

    def prepared() -> tuple[Manifest, Selection | None]:
        manifest, selection = prepare(
            read_manifest(d.manifest, "finetune"),
            d.select,
            d.label,
            [d.train_split, d.val_split],
            d.train_split,
        )
        # The job's own split check runs before its first collective (the checkpoint's
        # broadcast): run it here too, so a host whose copy fails it cannot pair its agreement
        # with the others' broadcast.
        check_splits(manifest, [d.train_split, d.val_split])
        train = len(manifest.split(d.train_split)[: d.max_samples])
        check_batch_fits(train, d.batch_size, d.train_split, "volumes", cfg.accum_steps)
        return manifest, selection

    try:
        # A Ctrl-C on one host while the job is set up is agreed too (runtime/interrupt.py).
        with agreed_ctrl_c(backend.process_count):
            # A manifest one host cannot read or accept stops every host here, with its message;
            # then a failure while the job is built (after the broadcast) is agreed the same way.
            manifest, selection = hosts.agreed(backend, "reading the manifest", prepared)
            kernel, why = choose(cfg.model.attention, backend.device)
            log.info("attention: %s (%s)", kernel, why)
            job = hosts.agreed(
                backend,
                "setting up the job",
                lambda: FinetuneJob(cfg, manifest, init, backend, selection),
            )
            check_kernel_lengths(kernel, job.cfg.model)
            trainer = Trainer(job, settings(job.cfg), backend)
            if backend.is_main:
                _print_start(job, trainer)
            result = trainer.run()
            best = job.results.get(result.best_unit or -1)
            done = job.regression_results.get(result.best_unit or -1)
            if done and backend.is_main and job.cfg.logging.console:
                for level, m in done.items():
                    console.print(
                        f"validation ({job.val_set.split}, {level}) at the best epoch "
                        f"{result.best_unit}: MAE {m.mae:.4g}, RMSE {m.rmse:.4g}, R^2 {m.r2:.3f} "
                        f"({m.num_samples} samples)"
                    )
            if best and backend.is_main and job.cfg.logging.console:
                title = f"validation ({job.val_set.split}) at the best epoch, {result.best_unit}"
                print_metrics(console, title, best, job.classes)
            return result
    finally:
        backend.close()


def _print_start(job: FinetuneJob, trainer: Trainer) -> None:
    d, volumes = job.cfg.data, job.summary.volumes
    console.print(
        class_table(job.classes, volumes, d.train_split, d.val_split, job.weights, job.cfg.loss)
    )
    info = job.init_info
    if job.selection is not None:
        sel = job.selection
        log.info(
            "finetune: target %s (%s); %d volumes kept, %d left out by data.select, "
            "%d without a value",
            sel.target,
            "regression" if sel.regression else "classification",
            sel.kept,
            sel.dropped_by_select,
            sel.dropped_no_value,
        )
    log.info(
        "finetune: %d train / %d val volumes, %d steps/epoch (batch %d x accum %d), "
        "encoder %s from %s (step %s), head %s/%s",
        len(job.train_set),
        len(job.val_set),
        job.steps_per_unit,
        d.batch_size,
        job.accum,
        info["encoder"],
        info["url"],
        info["step"],
        job.cfg.head.kind,
        job.cfg.head.pooling,
    )
    for split in (d.train_split, d.val_split):
        missing = [short(c) for c, n in zip(job.classes, volumes[split], strict=True) if not n]
        if missing:
            trainer.tracker.alert("class missing", f"split {split!r} has no {missing} volumes")
