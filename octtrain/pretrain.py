"""``octtrain pretrain``: V-JEPA pretraining of the 3D ViT on a manifest-fed cache.

One step: next batch (timed: data wait); fixed-K multi-block masks drawn from (seed, step, rank);
the student predicts the masked patches' layer-normed target features; AdamW with the scheduled
lr and weight decay (grad norm measured before clipping); then the EMA target update. The loop
reads tensors on the host only inside step closures, and the watchdog reports stalls. A
non-finite loss or gradient norm stops the run with ``NonFiniteLossError``; checkpoints saved
before it stay.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from octstage.manifest import Manifest
from octtrain import checkpoint as ckpt
from octtrain.collapse import effective_rank, feature_std
from octtrain.config import PretrainConfig, to_dict, to_yaml
from octtrain.data import (
    ManifestDataset,
    Prefetcher,
    Transform,
    eval_loader,
    pad_batch,
    read_manifest,
    train_loader,
    volume_shape,
)
from octtrain.device import Backend, cpu_threads, make_backend
from octtrain.errors import CheckpointError, ConfigError, DataError, NonFiniteLossError
from octtrain.jepa import (
    build_optimizer,
    build_student,
    ema_update,
    jepa_loss,
    make_target,
    set_hyperparameters,
    target_features,
)
from octtrain.masks import mask_overlay, sample_masks, step_rng
from octtrain.rundir import code_version, new_run_dir, write_run_info
from octtrain.schedules import ema_momentum, warmup_cosine, weight_decay
from octtrain.tracking import Tracker
from octtrain.watchdog import StallWatchdog

log = logging.getLogger("octtrain")

VAL_MASK_SEED = 12345  # validation masks are the same at every validation, so losses compare


@dataclass(frozen=True)
class PretrainResult:
    run_dir: Path | None
    steps: int
    last_loss: float | None
    checkpoint: str | None  # URL of the last checkpoint written (None if none, or not main)


def resolve(cfg: PretrainConfig, manifest: Manifest) -> PretrainConfig:
    """Fill ``model.input_shape`` from the cache and check the splits can feed this config."""
    train = manifest.split(cfg.data.train_split)
    if not train:
        raise DataError(f"the manifest has no volumes in split {cfg.data.train_split!r}")
    val = manifest.split(cfg.data.val_split)
    if cfg.train.val_every and not val:
        raise DataError(
            f"train.val_every={cfg.train.val_every} but split {cfg.data.val_split!r} is empty; "
            "set train.val_every=0 or data.val_split"
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


def run_pretrain(cfg: PretrainConfig) -> PretrainResult:
    """Pretrain as configured; returns where the run went. Raises OcttrainError subclasses."""
    manifest = read_manifest(cfg.data.manifest)
    cfg = resolve(cfg, manifest)
    backend = make_backend(cfg.train.device, cfg.train.precision)
    if backend.kind == "cpu":
        torch.set_num_threads(cpu_threads(cfg.train.cpu_threads, cfg.data.num_workers))
    try:
        return Pretrainer(cfg, manifest, backend).run()
    finally:
        backend.close()


class Pretrainer:
    """State of one pretraining run; ``run()`` trains and returns the result."""

    def __init__(self, cfg: PretrainConfig, manifest: Manifest, backend: Backend) -> None:
        assert cfg.model.input_shape is not None and cfg.data.manifest is not None
        self.cfg, self.backend = cfg, backend
        self.total_steps = cfg.schedule.total_steps or cfg.train.max_steps
        if cfg.data.batch_size % backend.process_count:
            raise ConfigError(
                f"data.batch_size {cfg.data.batch_size} is not divisible by the "
                f"{backend.process_count} processes"
            )
        self.local_batch = cfg.data.batch_size // backend.process_count
        if self.local_batch % max(1, backend.world_size // backend.process_count):
            raise ConfigError(f"data.batch_size {cfg.data.batch_size} does not split over devices")

        self.run_dir = None
        if backend.is_main:
            self.run_dir = new_run_dir(cfg.train.output_dir, cfg.train.name, cfg.train.run_dir)
        self.code_version = code_version()
        if self.run_dir is not None:
            write_run_info(self.run_dir, to_yaml(cfg), self.code_version)
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every replica
        student = build_student(cfg.model)
        self.student = backend.wrap_model(student)
        self.raw = student  # wrap_model moves modules in place; this stays the unwrapped student
        self.encoder = student.encoder
        self.grid = student.encoder.grid
        self.target = make_target(self.encoder)
        self.optimizer = build_optimizer(self.raw, cfg.optim)
        self.params = [p for p in self.raw.parameters() if p.requires_grad]

        # Other processes know the run folder only when it is explicit (train.run_dir).
        known_dir = self.run_dir or (Path(cfg.train.run_dir) if cfg.train.run_dir else None)
        self.ckpt_dir = ckpt.checkpoint_dir(cfg.checkpoint, known_dir)
        self.ckpt = None
        if backend.is_main and self.ckpt_dir is not None:
            self.ckpt = ckpt.CheckpointManager(
                self.ckpt_dir, cfg.checkpoint.keep_last, cfg.checkpoint.keep_best
            )
        self.start_step = 0
        self.last_checkpoint: str | None = None
        url = ckpt.resume_url(cfg.checkpoint, self.ckpt_dir)
        if url is not None:
            self._resume(url)

        cache_root = Path(cfg.data.cache) if cfg.data.cache else Path(cfg.data.manifest).parent
        shape = cfg.model.input_shape
        self.train_set = ManifestDataset(
            manifest,
            cache_root,
            cfg.data.train_split,
            Transform(shape, cfg.data.augment),
            cfg.data.max_samples,
        )
        self.val_set = ManifestDataset(
            manifest, cache_root, cfg.data.val_split, Transform(shape, None), cfg.data.max_samples
        )
        self.tracker = Tracker(
            cfg.logging,
            self.run_dir,
            enabled=backend.is_main,
            config={**to_dict(cfg), "code_version": self.code_version},
            job_type="pretrain",
            run_name=self.run_dir.name if self.run_dir else None,
        )
        self.val_loader: DataLoader[dict[str, Any]] | None = None
        self.last_loss: float | None = None
        self.last_val: float | None = None
        self.val_step = -1

    # --- checkpoints ---------------------------------------------------------------------------

    def _state(self, step: int) -> dict[str, Any]:
        state: dict[str, Any] = ckpt.to_cpu(
            {
                "format": 1,
                "step": step,
                "encoder": self.raw.encoder.state_dict(),
                "predictor": self.raw.predictor.state_dict(),
                "target_encoder": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "schedule": {"step": step},  # schedules are pure functions of the step
                "rng": ckpt.rng_state(),
                "config": to_dict(self.cfg),
                "code_version": self.code_version,
                "metrics": {"train/loss": self.last_loss, "val/loss": self.last_val},
            }
        )
        return state

    def _save(self, step: int) -> None:
        if self.ckpt is not None:
            # Best = lowest val/loss, from a validation of this very step (else no metric).
            metric = self.last_val if self.val_step == step else None
            self.last_checkpoint = self.ckpt.save(self._state(step), step, metric)
            log.info("checkpoint %s", self.last_checkpoint)
        self.backend.barrier()

    def _resume(self, url: str) -> None:
        state = ckpt.load_checkpoint(url)
        saved = state["config"]["model"]
        current = to_dict(self.cfg)["model"]
        if saved != current:
            diff = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
            raise CheckpointError(f"{url}: model config differs from this run's: {diff}")
        self.raw.encoder.load_state_dict(state["encoder"])
        self.raw.predictor.load_state_dict(state["predictor"])
        self.target.load_state_dict(state["target_encoder"])
        self.optimizer.load_state_dict(state["optimizer"])
        ckpt.set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        self.last_checkpoint = url
        log.info("resumed from %s at step %d", url, self.start_step)

    # --- the loop ------------------------------------------------------------------------------

    def make_train_loader(self) -> DataLoader[dict[str, Any]]:
        """This process's endless training batches, continuing after ``start_step``."""
        return train_loader(
            self.train_set,
            self.cfg.data,
            self.local_batch,
            self.backend.process_index,
            self.backend.process_count,
            self.cfg.train.seed,
            start_step=self.start_step,
        )

    def run(self) -> PretrainResult:
        cfg, backend = self.cfg, self.backend
        prefetcher = Prefetcher(self.make_train_loader())
        batches = iter(backend.wrap_loader(prefetcher))
        watchdog = StallWatchdog(cfg.train.stall_timeout_s, self._report_stall).start()
        exit_code = 1
        try:
            self._loop(batches, watchdog)
            exit_code = 0
        except NonFiniteLossError as exc:
            self.tracker.alert("non-finite loss", str(exc))
            raise
        finally:
            watchdog.stop()
            prefetcher.close()
            del batches
            self.tracker.close(exit_code)
        return PretrainResult(
            self.run_dir, cfg.train.max_steps, self.last_loss, self.last_checkpoint
        )

    def _loop(self, batches: Any, watchdog: StallWatchdog) -> None:
        cfg = self.cfg
        window = {"wait": 0.0, "time": 0.0, "n": 0}
        last_end = time.perf_counter()
        for step in range(self.start_step, cfg.train.max_steps):
            done = step + 1
            # Flush last step's XLA closures so the data wait excludes them (no-op off XLA).
            self.backend.sync()
            watchdog.set_phase("data")
            t0 = time.perf_counter()
            batch = next(batches)
            wait = time.perf_counter() - t0
            watchdog.set_phase("compute")
            loss, grad_norm, tokens, target_idx, hyper = self._train_step(batch["image"], step)
            now = time.perf_counter()
            window["wait"] += wait
            window["time"] += now - last_end
            window["n"] += 1
            last_end = now
            log_now = done % cfg.logging.log_every == 0 or step == self.start_step
            log_now = log_now or done == cfg.train.max_steps
            if log_now:
                host = {
                    "train/data_wait_s": window["wait"] / window["n"],
                    "train/data_wait_frac": window["wait"] / max(window["time"], 1e-9),
                    "train/step_time_s": window["time"] / window["n"],
                    "train/samples_per_s": cfg.data.batch_size * window["n"] / window["time"],
                    "train/samples": done * cfg.data.batch_size,
                    **hyper,
                }
                compiles = self.backend.compile_count()
                if compiles is not None:
                    host["train/compile_count"] = compiles
                window = {"wait": 0.0, "time": 0.0, "n": 0}
                self.backend.add_step_closure(self._log_train, done, loss, grad_norm, tokens, host)
            else:
                self.backend.add_step_closure(self._check_finite, done, loss, grad_norm)
            image_every = cfg.logging.image_every
            if image_every and (done % image_every == 0 or step == self.start_step):
                self.backend.add_step_closure(
                    self._log_images, done, batch["image"][0].detach(), target_idx[0]
                )
            watchdog.step_done(done)
            paused = time.perf_counter()
            if cfg.train.val_every and (
                done % cfg.train.val_every == 0 or done == cfg.train.max_steps
            ):
                self._validate(done)
            if done % cfg.checkpoint.every == 0 or done == cfg.train.max_steps:
                self._save(done)
            last_end += time.perf_counter() - paused  # step times exclude validation, checkpoints

    def _train_step(
        self, x: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
        cfg, device = self.cfg, self.backend.device
        stream = self.backend.process_index  # each process draws its own samples' masks
        context_idx, target_idx = sample_masks(
            x.shape[0], self.grid, cfg.mask, step_rng(cfg.train.seed, step, stream)
        )
        context_idx, target_idx = context_idx.to(device), target_idx.to(device)
        lr = warmup_cosine(
            step,
            peak=cfg.optim.lr,
            warmup_steps=cfg.schedule.warmup_steps,
            total_steps=self.total_steps,
            start=cfg.schedule.start_lr,
            final=cfg.schedule.final_lr,
        )
        wd = weight_decay(
            step,
            total_steps=self.total_steps,
            start=cfg.optim.weight_decay,
            end=cfg.optim.weight_decay_end,
        )
        momentum = ema_momentum(
            step,
            total_steps=self.total_steps,
            start=cfg.schedule.ema_start,
            end=cfg.schedule.ema_end,
        )
        set_hyperparameters(self.optimizer, lr, wd)
        self.student.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.backend.autocast():
            prediction = self.student(x, context_idx, target_idx)
            target, tokens = target_features(self.target, x, target_idx)
        loss = jepa_loss(prediction, target, cfg.optim.loss).mean()
        loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad for p in self.params if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)  # before clipping, before zeroing
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, cfg.optim.grad_clip, grad_norm)
        self.optimizer.step()
        ema_update(self.target, self.raw.encoder, momentum)
        self.backend.sync()
        hyper = {"train/lr": lr, "train/weight_decay": wd, "train/ema_momentum": momentum}
        return loss.detach(), grad_norm.detach(), tokens.detach(), target_idx, hyper

    # --- host-side closures (run after the step's tensors exist) --------------------------------

    def _check_finite(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self._finite_values(step, loss, grad_norm)

    def _finite_values(
        self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor
    ) -> tuple[float, float]:
        value, norm = float(loss), float(grad_norm)
        if not (np.isfinite(value) and np.isfinite(norm)):
            where = self.last_checkpoint or "none written yet"
            raise NonFiniteLossError(
                f"step {step}: loss {value}, grad norm {norm}; stopping. Last good checkpoint: "
                f"{where}. Lower optim.lr, raise schedule.warmup_steps or check the inputs."
            )
        self.last_loss = value
        return value, norm

    def _log_train(
        self,
        step: int,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        tokens: torch.Tensor,
        host: dict[str, float],
    ) -> None:
        value, norm = self._finite_values(step, loss, grad_norm)
        features = tokens.float().cpu().reshape(-1, tokens.shape[-1])[:1024]
        metrics = {
            "train/loss": value,
            "train/grad_norm": norm,
            **host,
            "train/feat_std": feature_std(features),
            "train/feat_erank": effective_rank(features),
        }
        self.tracker.log(metrics, step)

    def _log_images(self, step: int, image: torch.Tensor, target_idx: torch.Tensor) -> None:
        volume = image.float().cpu().numpy()[0]
        strip = mask_overlay(volume, target_idx.cpu().numpy(), self.grid, self.cfg.model.patch)
        self.tracker.log_images({"train/input_mask": strip}, step)

    def _report_stall(self, phase: str, idle: float, step: int) -> None:
        waiting = {
            "data": "data (blocked on the DataLoader: workers, disk or cache reads)",
            "compute": "compute (forward/backward/optimizer, or a graph compile on XLA)",
        }.get(phase, phase)
        self.tracker.alert(
            "training stalled",
            f"no step finished for {idle:.0f} s after step {step}; the loop waits for {waiting}",
        )

    # --- validation ----------------------------------------------------------------------------

    @torch.no_grad()
    def _validate(self, step: int) -> None:
        cfg, backend = self.cfg, self.backend
        if self.val_loader is None:  # built once: its persistent workers serve every validation
            self.val_loader = eval_loader(
                self.val_set,
                cfg.data,
                self.local_batch,
                backend.process_index,
                backend.process_count,
            )
        self.student.eval()
        totals = torch.zeros(2, device=backend.device)
        features = []
        for i, batch in enumerate(self.val_loader):
            if cfg.train.val_batches is not None and i >= cfg.train.val_batches:
                break
            padded = pad_batch(batch, self.local_batch)
            x = padded["image"].to(backend.device)
            valid = padded["valid"].to(backend.device)
            context_idx, target_idx = sample_masks(
                x.shape[0], self.grid, cfg.mask, step_rng(VAL_MASK_SEED, i)
            )
            context_idx, target_idx = context_idx.to(backend.device), target_idx.to(backend.device)
            with backend.autocast():
                prediction = self.raw(x, context_idx, target_idx)
                target, tokens = target_features(self.target, x, target_idx)
            per_sample = jepa_loss(prediction, target, cfg.optim.loss)
            totals += torch.stack([(per_sample * valid).sum(), valid.sum()])
            backend.sync()
            if i == 0:
                features.append(tokens.float().cpu().reshape(-1, tokens.shape[-1])[:1024])
        loss_sum, count = backend.all_reduce_sum(totals).tolist()
        self.last_val, self.val_step = loss_sum / max(count, 1.0), step
        metrics = {"val/loss": self.last_val, "val/samples": count}
        if features:
            metrics["val/feat_std"] = feature_std(features[0])
            metrics["val/feat_erank"] = effective_rank(features[0])
        self.tracker.log(metrics, step)
