"""``octtrain finetune``: a pretrained encoder + a head, trained on the manifest's study groups.

An epoch: ``steps`` optimizer steps of ``accum`` micro-batches each (the effective batch),
learning rates from a clamped warmup + cosine per optimizer step, gradients clipped. Every
prediction of the epoch stays on the device until the epoch ends; then the train metrics are
computed and **logged before validation starts**, so a validation that fails or hangs can never
take the train numbers with it. Validation (octtrain/validation.py) counts every sample exactly
once on any number of processes; its metrics feed early stopping and the best checkpoint.
A collapse alarm (one class taking more than ``validation.collapse_max_share`` of predictions)
prints a red banner and raises a tracker alert - the failure the users once found by hand.

The step has static shapes and reads nothing back (no ``.item()``): host reads happen in step
closures, so the same loop runs on XLA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from octstage.manifest import Manifest
from octtrain import checkpoint as ckpt
from octtrain import metrics as mt
from octtrain.config import to_dict, to_yaml
from octtrain.data import read_manifest
from octtrain.device import Backend, cpu_threads, make_backend
from octtrain.errors import NonFiniteLossError
from octtrain.finetune_config import FinetuneConfig
from octtrain.finetune_data import build_data, check_splits, class_weights
from octtrain.finetune_model import (
    build_classifier,
    build_optimizer,
    checkpoint_state,
    load_pretrained_encoder,
    lr_factors,
    make_loss,
    set_learning_rates,
    unfreeze,
)
from octtrain.models.vit3d import preset_for
from octtrain.report import class_table, confusion_rgb, print_collapse, print_metrics, short
from octtrain.rundir import code_version, new_run_dir, write_run_info
from octtrain.selection import EarlyStopping
from octtrain.tracking import Tracker
from octtrain.validation import (
    Predictions,
    ValidationError,
    gather_rows,
    predict,
)

log = logging.getLogger("octtrain")
console = Console(stderr=True)


def frozen_at(cfg: FinetuneConfig, epoch: int) -> bool:
    """Is the encoder frozen during ``epoch``?"""
    unfreeze_epoch = cfg.train.unfreeze_epoch
    return unfreeze_epoch is None or epoch < unfreeze_epoch


@dataclass
class FinetuneResult:
    run_dir: Path | None
    epochs_run: int
    best_epoch: int | None
    best_value: float | None
    best_checkpoint: str | None
    stopped_early: bool
    validation_failures: int
    history: list[dict[str, float]] = field(default_factory=list)  # one record per epoch


def run_finetune(cfg: FinetuneConfig, init: str) -> FinetuneResult:
    """Finetune from the pretraining checkpoint ``init``; raises OcttrainError subclasses."""
    manifest = read_manifest(cfg.data.manifest)
    backend = make_backend(cfg.train.device, cfg.train.precision)
    if backend.kind == "cpu":
        torch.set_num_threads(cpu_threads(cfg.train.cpu_threads, cfg.data.num_workers))
    try:
        return Finetuner(cfg, manifest, init, backend).run()
    finally:
        backend.close()


class Finetuner:
    """State of one finetuning run; ``run()`` trains and returns the result."""

    def __init__(self, cfg: FinetuneConfig, manifest: Manifest, init: str, backend: Backend):
        self.backend = backend
        d = cfg.data
        summary = check_splits(manifest, [d.train_split, d.val_split])
        self.classes = summary.classes
        self.num_classes = len(self.classes)
        torch.manual_seed(cfg.train.seed)  # identical heads on every replica
        encoder, model_cfg, self.init_info = load_pretrained_encoder(
            init, cfg.model, cfg.train.init_encoder
        )
        cfg = dataclasses.replace(cfg, model=model_cfg)
        self.cfg = cfg
        self.depth = preset_for(model_cfg).depth
        self.data = build_data(cfg, manifest, backend.process_index, backend.process_count)
        self.train_set, self.val_set = self.data.train_set, self.data.val_set
        self.steps, self.accum, self.local_batch = self.data.steps, cfg.accum_steps, self.data.batch
        self.total_steps = cfg.train.epochs * self.steps
        self.warmup_steps = round(cfg.train.warmup_epochs * self.steps)
        self.weights = class_weights(cfg.loss, self.data.train_counts)
        w = None if self.weights is None else torch.tensor(self.weights, dtype=torch.float32)
        self.loss_fn = make_loss(w, cfg.loss.label_smoothing).to(backend.device)

        model = build_classifier(encoder, cfg.head, encoder.embed_dim, self.num_classes)
        model.freeze_encoder(frozen_at(cfg, 0))
        self.raw = model
        self.model = backend.wrap_model(model)
        self.optimizer = build_optimizer(
            model, cfg.optim, self.depth, with_encoder=not frozen_at(cfg, 0)
        )

        self.run_dir: Path | None = None
        self.code_version = code_version()
        self.ckpt: ckpt.CheckpointManager | None = None
        if backend.is_main:
            self.run_dir = new_run_dir(cfg.train.output_dir, cfg.train.name, cfg.train.run_dir)
            write_run_info(self.run_dir, to_yaml(cfg))
            self.ckpt = ckpt.CheckpointManager(
                str(self.run_dir / "checkpoints"), keep_last=1, keep_best=True
            )
        self.tracker = Tracker(
            cfg.logging,
            self.run_dir,
            enabled=backend.is_main,
            config={**to_dict(cfg), "init": self.init_info, "code_version": self.code_version},
            job_type="finetune",
            run_name=self.run_dir.name if self.run_dir else None,
        )
        self.stopper = EarlyStopping(cfg.early_stopping.patience, cfg.early_stopping.min_delta)
        self.best_results: dict[str, mt.ClassificationMetrics] = {}
        if backend.is_main:
            self._print_start(summary.volumes, d.train_split, d.val_split)

    # --- start ---------------------------------------------------------------------------------

    def _print_start(self, volumes: dict[str, list[int]], train: str, val: str) -> None:
        console.print(class_table(self.classes, volumes, train, val, self.weights, self.cfg.loss))
        info = self.init_info
        log.info(
            "finetune: %d train / %d val volumes, %d steps/epoch (batch %d x accum %d), "
            "encoder %s from %s (step %s), head %s/%s",
            len(self.train_set),
            len(self.val_set),
            self.steps,
            self.cfg.data.batch_size,
            self.accum,
            info["encoder"],
            info["url"],
            info["step"],
            self.cfg.head.kind,
            self.cfg.head.pooling,
        )
        for split in (train, val):
            missing = [short(c) for c, n in zip(self.classes, volumes[split], strict=True) if not n]
            if missing:
                self.tracker.alert("class missing", f"split {split!r} has no {missing} volumes")

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> FinetuneResult:
        cfg = self.cfg
        batches = iter(self.backend.wrap_loader(self.data.train_loader))
        result = FinetuneResult(self.run_dir, 0, None, None, None, False, 0)
        exit_code = 1
        try:
            for epoch in range(cfg.train.epochs):
                if epoch > 0 and cfg.train.unfreeze_epoch == epoch:
                    self._unfreeze(epoch)
                record = self._train_epoch(epoch, batches)  # logged before validation starts
                last = epoch == cfg.train.epochs - 1
                if (epoch + 1) % cfg.validation.every == 0 or last:
                    record |= self._validate_and_select(epoch, result)
                result.history.append(record)
                result.epochs_run = epoch + 1
                if self.stopper.should_stop:
                    result.stopped_early = True
                    log.info(
                        "early stopping after epoch %d: %s did not improve for %d validations",
                        epoch + 1,
                        cfg.early_stopping.metric,
                        cfg.early_stopping.patience,
                    )
                    break
            exit_code = 0
        except NonFiniteLossError as exc:
            self.tracker.alert("non-finite loss", str(exc))
            raise
        finally:
            del batches
            self.tracker.summary(
                {"best_epoch": result.best_epoch, "best_value": result.best_value}
                | {"validation_failures": result.validation_failures}
            )
            self.tracker.close(exit_code)
        if self.ckpt is not None:
            result.best_checkpoint = self.ckpt.best()
        if self.best_results and self.backend.is_main and self.cfg.logging.console:
            title = f"validation ({self.val_set.split}) at the best epoch, {result.best_epoch}"
            print_metrics(console, title, self.best_results, self.classes)
        return result

    def _unfreeze(self, epoch: int) -> None:
        before = len(self.optimizer.param_groups)
        unfreeze(self.raw, self.optimizer, self.cfg.optim, self.depth)
        # DDP registers only trainable parameters when it is built: wrap again so the encoder's
        # gradients are averaged across processes too.
        del self.model
        self.model = self.backend.wrap_model(self.raw)
        log.info(
            "epoch %d: encoder unfrozen, optimizer groups %d -> %d",
            epoch + 1,
            before,
            len(self.optimizer.param_groups),
        )

    def _train_epoch(self, epoch: int, batches: Any) -> dict[str, float]:
        cfg, backend, c = self.cfg, self.backend, self.num_classes
        device = backend.device
        self.model.train()
        micro = self.steps * self.accum
        preds = torch.zeros(micro, self.local_batch, c + 1, device=device)
        loss_sum = torch.zeros(1, device=device)
        params = [p for p in self.raw.parameters() if p.requires_grad]
        start, wait = time.perf_counter(), 0.0
        for i in range(self.steps):
            step = epoch * self.steps + i
            lrs = set_learning_rates(
                self.optimizer,
                *lr_factors(step, self.steps, self.warmup_steps, self.total_steps, cfg.train),
            )
            self.optimizer.zero_grad(set_to_none=True)
            # Flush the previous step's XLA closures so data wait excludes them (no-op off XLA).
            backend.sync()
            for j in range(self.accum):
                t0 = time.perf_counter()
                batch = next(batches)
                wait += time.perf_counter() - t0
                x, y = batch["image"], batch["label"]
                last = j == self.accum - 1
                sync_ctx = getattr(self.model, "no_sync", None)
                ctx = contextlib.nullcontext() if last or sync_ctx is None else sync_ctx()
                with ctx:
                    with backend.autocast():
                        logits = self.model(x)
                    loss = self.loss_fn(logits.float(), y)
                    (loss / self.accum).backward()
                probs = torch.softmax(logits.detach().float(), dim=-1)
                row = torch.cat([probs, y.float()[:, None]], dim=1)[None]
                slot = torch.tensor([i * self.accum + j], device=device)
                preds.index_copy_(0, slot, row)
                loss_sum += loss.detach()
            grads = [p.grad for p in params if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads)
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grads_with_norm_(params, cfg.optim.grad_clip, grad_norm)
            self.optimizer.step()
            backend.sync()
            log_now = (step + 1) % cfg.logging.log_every == 0 or i == self.steps - 1
            backend.add_step_closure(
                self._after_step, step + 1, loss.detach(), grad_norm.detach(), lrs, log_now
            )
        elapsed = time.perf_counter() - start
        return self._log_train_epoch(epoch, preds, loss_sum / micro, elapsed, wait)

    def _after_step(
        self,
        step: int,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        lrs: dict[str, float],
        log_now: bool,
    ) -> None:
        value, norm = float(loss), float(grad_norm)
        if not (math.isfinite(value) and math.isfinite(norm)):
            raise NonFiniteLossError(
                f"step {step}: loss {value}, grad norm {norm}; lower optim.head_lr/encoder_lr "
                "or check the inputs"
            )
        if log_now:
            metrics = {"train/loss": value, "train/grad_norm": norm}
            self.tracker.log(metrics | {f"train/{k}": v for k, v in lrs.items()}, step)

    def _log_train_epoch(
        self, epoch: int, preds: torch.Tensor, loss: torch.Tensor, elapsed: float, wait: float
    ) -> dict[str, float]:
        backend, c = self.backend, self.num_classes
        rows, extra = gather_rows(backend, preds.reshape(-1, c + 1), loss)
        mean_loss = float(extra[0]) / backend.process_count
        labels = np.rint(rows[:, c]).astype(np.int64)
        m = mt.classification_metrics(labels, rows[:, :c], c)
        record = {
            "epoch": float(epoch + 1),
            "train_loss": mean_loss,
            "epoch_time_s": elapsed,
            "data_wait_frac": wait / max(elapsed, 1e-9),
            "encoder_frozen": float(self.raw.encoder_frozen),
            "train_samples": float(m.num_samples),
        }
        record |= {f"train_{k}": v for k, v in mt.flat_scalars(m, self.classes).items()}
        scalars = {f"train_epoch/{k}": v for k, v in mt.flat_scalars(m, self.classes).items()}
        scalars |= {
            "train_epoch/loss": mean_loss,
            "train_epoch/epoch_time_s": elapsed,
            "train_epoch/data_wait_frac": record["data_wait_frac"],
            "train_epoch/encoder_frozen": record["encoder_frozen"],
            "train_epoch/samples": m.num_samples,
        }
        compiles = backend.compile_count()  # XLA: must stop growing once every epoch kind ran
        if compiles is not None:
            scalars["train_epoch/compile_count"] = compiles
        self.tracker.log(scalars, epoch + 1)
        self._alarm("train", m, epoch)
        return record

    # --- validation ----------------------------------------------------------------------------

    def _validate_and_select(self, epoch: int, result: FinetuneResult) -> dict[str, float]:
        cfg, start = self.cfg, time.perf_counter()
        try:
            preds = predict(
                self.raw,
                self.backend.wrap_loader(self.data.val_loader),
                self.backend,
                len(self.val_set),
                self.num_classes,
            )
        except ValidationError as exc:
            result.validation_failures += 1
            self.tracker.log({"val/failures": result.validation_failures}, epoch + 1)
            if self.backend.is_main:
                self.tracker.alert("validation failed", f"epoch {epoch + 1}: {exc}")
            if not cfg.validation.continue_on_failure:
                raise
            return {"val_failed": 1.0}
        elapsed = time.perf_counter() - start
        results = self._log_validation(epoch, preds, elapsed)
        m = results["volume"]
        value = m.scalar(cfg.early_stopping.metric)
        improved = self.stopper.update(value)
        if improved:
            result.best_epoch, result.best_value = epoch + 1, value
            self.best_results = results
        self._save(epoch, m, value if improved else None)
        out = {f"val_{k}": v for k, v in mt.flat_scalars(m, self.classes).items()}
        return out | {"val_loss": preds.nll, "val_time_s": elapsed}

    def _log_validation(
        self, epoch: int, preds: Predictions, elapsed: float
    ) -> dict[str, mt.ClassificationMetrics]:
        c, names = self.num_classes, self.classes
        m = mt.classification_metrics(preds.labels, preds.probs, c)
        scalars = {f"val/{k}": v for k, v in mt.flat_scalars(m, names).items()}
        scalars |= {"val/loss": preds.nll, "val/samples": m.num_samples, "val/time_s": elapsed}
        self.tracker.log(scalars, epoch + 1)
        results = {"volume": m}
        if self.cfg.validation.participant_level:
            pids = [v.participant_id for v in self.val_set.volumes]
            _, plabels, pprobs = mt.participant_level(pids, preds.labels, preds.probs)
            pm = mt.classification_metrics(plabels, pprobs, c)
            pscalars = {f"val_participant/{k}": v for k, v in mt.flat_scalars(pm, names).items()}
            self.tracker.log(pscalars | {"val_participant/samples": pm.num_samples}, epoch + 1)
            results["participant"] = pm
        if self.backend.is_main:
            title = f"validation, epoch {epoch + 1}"
            image = confusion_rgb(m.confusion, names, title)
            self.tracker.log_images({"val/confusion_matrix": image}, epoch + 1)
        self._alarm("val", m, epoch)
        return results

    def _alarm(self, split: str, m: mt.ClassificationMetrics, epoch: int) -> None:
        alarm = mt.check_collapse(m.histogram, self.cfg.validation.collapse_max_share)
        if alarm is None:
            return
        message = f"{split}, epoch {epoch + 1}: {alarm.message([short(n) for n in self.classes])}"
        if self.backend.is_main:  # every process computed the same verdict; one speaks
            print_collapse(console, message)
            self.tracker.alert(f"{split} prediction collapse", message)

    def _save(self, epoch: int, m: mt.ClassificationMetrics, best_value: float | None) -> None:
        if self.ckpt is not None:
            extra = {"init": self.init_info, "code_version": self.code_version}
            metrics = mt.to_jsonable(m, self.classes)
            state = checkpoint_state(self.raw, self.cfg, self.classes, epoch + 1, metrics, extra)
            # The manager keeps the lowest metric; we select the highest.
            metric = None if best_value is None else -best_value
            url = self.ckpt.save(state, epoch + 1, metric)
            log.info("checkpoint %s%s", url, " (best so far)" if best_value is not None else "")
        self.backend.barrier()
