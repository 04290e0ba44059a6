"""The one training skeleton: pretraining and finetuning are ``Job``s (``train/job.py``)
plugged into ``Trainer``.

A job owns what differs: its model and optimizer, the batches, one training step, what an epoch's
end adds (finetuning's epoch metrics) and validation. The trainer owns everything else, once:

* the run folder, the tracker (W&B + metrics.jsonl + console) and the stall watchdog, which
  names the phase it waited in (data or compute) and stays on until the backend is closed (the
  trainer closes it: a close that waits on the device or a loader thread is watched too);
* a pod's Ctrl-C: within the run a first Ctrl-C on any host is carried by the hosts' agreements
  (``runtime/hosts.py``), so every host stops at the same point and exits 130;
* resume: decided on process 0, read there and broadcast (``runtime/hosts.py``), and applied
  before the job wraps its model for data parallelism;
* the prefetch thread and the data-wait timing;
* the non-finite guard and train logging, one step behind: the host reads step ``t``'s loss and
  grad norm after step ``t + 1`` was launched, so it never waits for the device that is still
  running. Before any validation or checkpoint the pending checks are flushed, so a NaN at a
  step that saves stops the run before the save, and the last checkpoint stays the last good
  one. The first step and the last are always logged;
* the collapse monitor: feature spread and effective rank of the step's features (rows drawn
  from every sample, not one), and the alarms (console banner + tracker alert) that the job's
  validation or epoch metrics raise;
* the alarm for targets that carry no image: the step's monitors (DINO's teacher entropies,
  V-JEPA's target spread across samples), read on logged steps and on the step before each
  validation; while it holds, no validation is picked as the best checkpoint;
* validation and checkpoint timing, in the run's unit (steps or epochs), the best checkpoint by
  the validation score (higher is better), early stopping, and counting failed validations.
"""

from __future__ import annotations

import collections
import logging
import os
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from octtrain.data.loaders import Prefetcher
from octtrain.errors import CheckpointError, DataError, NonFiniteLossError, OcttrainError
from octtrain.eval.common.collapse import (
    blind_targets_alarm,
    effective_rank,
    feature_std,
    representation_alarm,
)
from octtrain.eval.common.selection import EarlyStopping
from octtrain.eval.common.validation import ValidationError, local_failure
from octtrain.eval.oct.report import print_collapse
from octtrain.runtime import checkpoint as ckpt
from octtrain.runtime import hosts
from octtrain.runtime.backend import Backend
from octtrain.runtime.interrupt import agreed_ctrl_c, caused_by_ctrl_c, check_interrupted
from octtrain.runtime.rundir import code_version, new_run_dir, write_run_info
from octtrain.runtime.tracking import Tracker
from octtrain.runtime.watchdog import STALL_EXIT_CODE, StallWatchdog
from octtrain.train.job import Job, RunResult, Settings, StepResult

log = logging.getLogger("octtrain")
console = Console(stderr=True)
NO_IMAGE = "targets carry no image"  # the alert title of that alarm (eval/common/collapse.py)


@dataclass
class _Pending:
    step: int
    result: StepResult
    host: dict[str, float]
    log: bool
    judge: bool = False  # read the monitors even when not logged (the step before a validation)


class Trainer:
    """Runs a ``Job`` as configured by ``Settings`` on ``backend``.

    ``clock`` times steps and stalls (tests pass one they advance, instead of sleeping).
    """

    def __init__(
        self,
        job: Job,
        settings: Settings,
        backend: Backend,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.job, self.s, self.backend, self.clock = job, settings, backend, clock
        t = settings.train
        self.watchdog = StallWatchdog(
            t.stall_timeout_s,
            self._report_stall,
            t.first_step_allowance_s,
            t.stall_exit_s,
            self._stall_exit,
            clock,
        )
        self.run_dir: Path | None = None
        refused: OcttrainError | None = None
        if backend.is_main:
            name = settings.train.name or job.kind
            t, resume = settings.train, settings.checkpoint.resume is not None
            try:
                ckpt.refuse_foreign_checkpoints(settings.checkpoint, resume)  # before any folder
                self.run_dir = new_run_dir(
                    t.output_dir, name, t.run_dir, resume, t.overwrite, settings.checkpoint.dir
                )
            except OcttrainError as exc:
                refused = exc
            except Exception as exc:  # a storage client's HttpError: every host must learn it
                if backend.process_count == 1:
                    raise
                log.error("setting up the run folder failed:\n%s", traceback.format_exc())
                refused = OcttrainError(f"setting up the run folder: {type(exc).__name__}: {exc}")
        # A refusal here is process 0's alone: the others would wait for it in their first
        # collective until the stall exit; agreeing now stops every host with its message.
        hosts.agree(backend, refused, "setting up the run folder")
        # Other processes know the run folder only when it is explicit (train.run_dir).
        known = self.run_dir or (Path(settings.train.run_dir) if settings.train.run_dir else None)
        self.ckpt_dir = ckpt.checkpoint_dir(settings.checkpoint, known)
        self.ckpt: ckpt.CheckpointManager | None = None
        if backend.is_main and self.ckpt_dir is not None:
            c = settings.checkpoint
            self.ckpt = ckpt.CheckpointManager(self.ckpt_dir, c.keep_last, c.keep_best)
        self.tracker = Tracker(
            settings.logging,
            self.run_dir,
            enabled=backend.is_main,
            config={**settings.config, "code_version": code_version()},
            job_type=job.kind,
            run_name=self.run_dir.name if self.run_dir else None,
            host=backend.process_index if backend.process_count > 1 else None,
        )
        self.stopper = EarlyStopping(settings.patience, settings.min_delta)
        self.result = RunResult(self.run_dir, 0, None, None, None, None, None, False, 0, [])
        self.start_step = 0
        self._pending: collections.deque[_Pending] = collections.deque()
        self._blind: str | None = None  # the last judged step's no-image alarm, if any
        self._window = {"wait": 0.0, "time": 0.0, "n": 0.0}  # since the last logged step
        self._unit = {"wait": 0.0, "time": 0.0}  # since the last unit's end
        self._read_compiles = 0  # programs compiled to copy monitor rows to the host (XLA)

    # --- resume and checkpoints ----------------------------------------------------------------

    def resume(self) -> None:
        """Resume as ``checkpoint.resume`` says, identically on every process."""
        url = hosts.decide_resume(self.s.checkpoint, self.ckpt_dir, self.backend)
        if url is None:
            if self.s.checkpoint.resume == "auto":
                log.info(
                    "checkpoint.resume=auto: no checkpoint in %s; starting fresh", self.ckpt_dir
                )
            return
        state = hosts.load_once(url, self.backend)
        try:
            self.job.load_state(state)
        except CheckpointError as exc:
            raise CheckpointError(f"{url}: {exc}") from exc
        loop = state.get("loop", {})
        self.start_step = int(state["step"])
        self.stopper.best = float(loop.get("best", self.stopper.best))
        self.stopper.bad = int(loop.get("bad", 0))
        self.result.best_unit = loop.get("best_unit")
        self.result.best_score = loop.get("best_score")
        self.result.last_checkpoint = url
        log.info("resumed from %s at step %d", url, self.start_step)

    def _save(self, step: int, score: float | None, is_best: bool) -> None:
        failure: OcttrainError | None = None
        try:
            self._write(step, score, is_best)
        except OcttrainError as exc:
            failure = exc
        except Exception as exc:  # noqa: BLE001 - a storage HTTP 401/5xx, an auth error, a copy
            log.error("the checkpoint of step %d failed:\n%s", step, traceback.format_exc())
            failure = CheckpointError(f"checkpoint of step {step}: {type(exc).__name__}: {exc}")
        # Only process 0 writes: the others must learn of its failure, not wait in the barrier.
        hosts.agree(self.backend, failure, f"writing the checkpoint of step {step}")
        self.backend.barrier()

    def _write(self, step: int, score: float | None, is_best: bool) -> None:
        # Every process makes the CPU copy, process 0 alone writes it: copying a tensor that is
        # sharded over the pod's chips runs a program on every host, which one host alone
        # would wait in forever (today's state is replicated; this stays right if it is not).
        state = ckpt.to_cpu(self.job.state(step))
        if self.ckpt is not None:
            state["step"] = step
            state["code_version"] = code_version()
            state["loop"] = {
                "best": self.stopper.best,
                "bad": self.stopper.bad,
                "best_unit": self.result.best_unit,
                "best_score": self.result.best_score,
            }
            self.result.last_checkpoint = self.ckpt.save(state, step, score, is_best)
            log.info("checkpoint %s", self.result.last_checkpoint)

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Resume if asked, train to the end (or early stop), return where things went."""
        with agreed_ctrl_c(self.backend.process_count):  # a pod's hosts stop together
            self._run()
        if self.ckpt is not None:
            self.result.best_checkpoint = self.ckpt.best()
        return self.result

    def _run(self) -> None:
        exit_code = 1
        watchdog = self.watchdog
        prefetcher: Prefetcher | None = None
        try:
            self.resume()
            # After the resume: a checkpoint of another job's run refused there leaves that
            # run's config.yaml as it was.
            if self.run_dir is not None:
                write_run_info(self.run_dir, self.s.config_yaml, code_version())
            prefetcher = Prefetcher(self.job.start(self.start_step))
            batches = iter(self.backend.wrap_loader(prefetcher))
            watchdog.start()
            self._loop(batches, watchdog)
            exit_code = 0
        except NonFiniteLossError as exc:
            self.tracker.alert("non-finite loss", str(exc))
            raise
        finally:
            if prefetcher is not None:
                prefetcher.close()
            self.tracker.summary(
                {
                    "best_unit": self.result.best_unit,
                    "best_score": self.result.best_score,
                    "validation_failures": self.result.validation_failures,
                }
            )
            self.tracker.close(exit_code)
            # The backend is closed here, with the watchdog still on: its close waits for the
            # device and the loader threads, and a host whose peers are gone must still end.
            # (The job's runner closes it again, a no-op, for failures before the trainer.)
            watchdog.set_phase("closing the backend")
            try:
                self.backend.close()
            finally:
                watchdog.stop()

    def _loop(self, batches: Iterator[dict[str, Any]], watchdog: StallWatchdog) -> None:
        job, s = self.job, self.s
        last_end = self.clock()
        for step in range(self.start_step, job.total_steps):
            check_interrupted()  # a Ctrl-C that Python dropped (a __del__, a fork hook) ends here
            done = step + 1
            job.before_step(step)
            watchdog.set_phase("data")
            t0 = self.clock()
            batch, failure = None, None
            try:
                batch = next(batches)
            except OcttrainError as exc:
                failure = exc
            except StopIteration:
                failure = DataError(f"the training loader ended before step {done}")
            except Exception as exc:  # noqa: BLE001 - any loader failure is agreed, with its cause
                log.error("loading the batch of step %d failed:\n%s", done, traceback.format_exc())
                failure = DataError(f"the training loader failed: {type(exc).__name__}: {exc}")
            # One host's bad volume must not leave the others in the step's collectives.
            hosts.agree(self.backend, failure, f"loading the batch of step {done}")
            assert batch is not None
            wait = self.clock() - t0
            watchdog.set_phase("compute")
            result = job.train_step(batch, step)
            self.backend.sync()  # launch the step; the host goes on without waiting for it
            self._check_pending(before=done)  # the previous step's values: ready or nearly
            now = self.clock()
            for acc in (self._window, self._unit):
                acc["wait"] += wait
                acc["time"] += now - last_end
            self._window["n"] += 1
            last_end = now
            log_now = done % s.logging.log_every == 0 or step == self.start_step
            log_now = log_now or done == job.total_steps
            host = self._timing(done) if log_now else {}
            self._pending.append(_Pending(done, result, host, log_now))
            every = s.logging.image_every
            if every and (done % every == 0 or step == self.start_step):
                self._check_pending()
                self.tracker.log_images(job.images(batch, result), done)
            watchdog.step_done(done)
            paused = self.clock()
            stop = self._unit_end(done, watchdog)
            last_end += self.clock() - paused  # step times exclude validation, saves
            if stop:
                break
        self._check_pending()

    def _unit_end(self, done: int, watchdog: StallWatchdog) -> bool:
        """Epoch/step-unit bookkeeping after step ``done``: True to stop early."""
        job, s = self.job, self.s
        if done % job.steps_per_unit and done != job.total_steps:
            return False
        unit = -(-done // job.steps_per_unit)
        last = done == job.total_steps
        every = s.validation.every
        validate = bool(every and unit % every == 0) or (
            last and (bool(every) or job.validates_last)
        )
        save = unit % s.checkpoint.every == 0 or last or validate
        if validate and self._pending:
            self._pending[-1].judge = True  # the alarm judges the weights this validation sees
        self._check_pending()  # a non-finite step stops here, before anything is saved
        # The unit's training time (steps only: no validation, no saves), for benchmarks.
        u = self._unit
        record: dict[str, float] = {
            "unit": float(unit),
            "unit_time_s": u["time"],
            "unit_data_wait_frac": u["wait"] / max(u["time"], 1e-9),
        }
        self._unit = {"wait": 0.0, "time": 0.0}
        watchdog.set_phase("end of epoch")
        metrics, alarm = job.end_of_unit(unit)
        if metrics:
            record |= metrics
            self.tracker.log(metrics, unit)  # train metrics before validation starts
        if alarm:
            self._alarm(alarm)
        score, improved = None, False
        failure: Exception | None = None
        if validate:
            watchdog.set_phase("validation")
            try:
                score, improved, val = self._validate(unit)
                record |= val
            except Exception as exc:  # a CUDA OOM, a bug: raised once the unit is saved
                if caused_by_ctrl_c(exc):  # a Ctrl-C inside an import: the interrupt itself
                    raise KeyboardInterrupt from exc
                log.error("validation of step %d failed", done)
                failure = exc
        watchdog.set_phase("checkpoint")
        if save:  # the unit's training is not lost to a validation that failed
            self._save(done, score, improved)
        if failure is not None:
            raise failure
        self.result.history.append(record)
        self.result.steps = done
        watchdog.step_done(done)  # validation and saving are not a stall of training
        if self.stopper.should_stop:
            self.result.stopped_early = True
            log.info(
                "early stopping after %s %d: the validation score did not improve for %d "
                "validations",
                "epoch" if job.steps_per_unit > 1 else "step",
                unit,
                s.patience,
            )
            return True
        return False

    def _job_validate(self, unit: int) -> Any:
        """The job's validation, its outcome agreed once more by every process: a failure of one
        process after the pass's last agreement (in its metrics, say) makes every process raise
        the same ValidationError, so none trains on while another stops, and none decides on a
        best checkpoint the others do not."""
        b = self.backend
        if b.process_count == 1:
            return self.job.validate(unit)
        ev, failure = None, None
        try:
            ev = self.job.validate(unit)
        except Exception as exc:
            if caused_by_ctrl_c(exc):
                raise
            failure = local_failure(b, exc)
        hosts.agree(b, failure, f"validating unit {unit}", kind=ValidationError)
        return ev

    def _validate(self, unit: int) -> tuple[float | None, bool, dict[str, float]]:
        """The score, whether it is the new best (early stopping's rule, which also picks the
        best checkpoint: one rule, one step) and the metrics."""
        start = self.clock()
        try:
            ev = self._job_validate(unit)
        except ValidationError as exc:
            self.result.validation_failures += 1
            self.tracker.log({"val/failures": self.result.validation_failures}, unit)
            self.tracker.alert("validation failed", f"unit {unit}: {exc}")
            if not self.s.validation.continue_on_failure:
                raise
            return None, False, {"val_failed": 1.0}
        metrics = {**ev.metrics, "val/time_s": self.clock() - start}
        v = self.s.validation
        blind = blind_targets_alarm(ev.metrics, v.blind_entropy_margin, v.blind_min_spread)
        # Its score may be fine (a probe can read positions or a device's look); its targets
        # still carry no image, so it never becomes the best checkpoint.
        refusal = (f"val, unit {unit}: {blind}" if blind else None) or self._blind
        if refusal and ev.score is not None:
            metrics["val/best_refused"] = 1.0
        self.tracker.log(metrics, unit)
        if ev.images:
            self.tracker.log_images(ev.images, unit)
        if ev.alarm:
            self._alarm(ev.alarm)
        if blind:
            self._alarm(f"val, unit {unit}: {blind}", NO_IMAGE)
        if refusal and ev.score is not None:
            self.stopper.refuse()
            self._alarm(f"unit {unit} is not picked as the best checkpoint: {refusal}", NO_IMAGE)
            return ev.score, False, metrics
        improved = ev.score is not None and self.stopper.update(ev.score)
        if improved:
            self.result.best_unit, self.result.best_score = unit, ev.score
        return ev.score, improved, metrics

    # --- host-side reads, one step behind --------------------------------------------------------

    def _check_pending(self, before: int | None = None) -> None:
        while self._pending and (before is None or self._pending[0].step < before):
            self._host_check(self._pending.popleft())

    def _host_check(self, p: _Pending) -> None:
        value, norm = float(p.result.loss), float(p.result.grad_norm)
        if not (np.isfinite(value) and np.isfinite(norm)):
            where = self.result.last_checkpoint or "none written yet"
            raise NonFiniteLossError(
                f"step {p.step}: loss {value}, grad norm {norm}; stopping. Last good checkpoint: "
                f"{where}. Lower the learning rate, raise the warmup or check the inputs."
            )
        self.result.last_loss = value
        if not (p.log or p.judge):
            return
        monitors = self._monitors(p.result.monitors)
        if monitors:
            v = self.s.validation
            blind = blind_targets_alarm(monitors, v.blind_entropy_margin, v.blind_min_spread)
            self._blind = f"train, step {p.step}: {blind}" if blind else None
            if self._blind:
                self._alarm(self._blind, NO_IMAGE)
        if not p.log:
            return
        # Logged: the mean over replicas (under DDP each process holds its own shard's loss).
        loss = hosts.mean_over_replicas(self.backend, p.result.loss)
        metrics = {"train/loss": loss, "train/grad_norm": norm, **p.result.host, **p.host}
        metrics |= monitors
        if p.result.features is not None:
            # A transfer (selecting here would be a graph). Under SPMD the rows are sharded over
            # the batch and their copy compiles a replication program of its own: counted
            # apart, so train/compile_count counts the step's programs only.
            before = self.backend.compile_count()
            rows = p.result.features.cpu().float()
            after = self.backend.compile_count()
            if before is not None and after is not None:
                self._read_compiles += after - before
            metrics["train/feat_std"] = feature_std(rows)
            metrics["train/feat_erank"] = effective_rank(rows)
            alarm = representation_alarm(
                metrics["train/feat_erank"], self.s.validation.collapse_min_rank
            )
            if alarm:
                self._alarm(f"train, step {p.step}: {alarm}")
        self.tracker.log(metrics, p.step)

    def _monitors(self, values: dict[str, torch.Tensor]) -> dict[str, float]:
        """The step's monitors averaged over replicas in one reduction, so every process reaches
        the same verdict (it decides the best checkpoint and early stopping on each)."""
        if not values:
            return {}
        if self.backend.step_is_global:
            # Each scalar is already a value of the step's program (replicated): copy it as it
            # is. Stacking or casting on the device would be a program of its own, one more
            # XLA compile and an execution at every read.
            return {k: float(t.detach().cpu().float().reshape(())) for k, t in values.items()}
        stacked = torch.stack([t.detach().float().reshape(()) for t in values.values()])
        if not self.backend.step_is_global:
            stacked = self.backend.reduce_step_sum(stacked) / self.backend.world_size
        return dict(zip(values, stacked.cpu().tolist(), strict=True))

    def _timing(self, done: int) -> dict[str, float]:
        w, batch = self._window, self.job.global_batch
        host = {
            "train/data_wait_s": w["wait"] / w["n"],
            "train/data_wait_frac": w["wait"] / max(w["time"], 1e-9),
            "train/step_time_s": w["time"] / w["n"],
            "train/samples_per_s": batch * w["n"] / max(w["time"], 1e-9),
            "train/samples": float(done * batch),
        }
        compiles = self.backend.compile_count()
        if compiles is not None:
            host["train/compile_count"] = float(compiles - self._read_compiles)
            host["train/read_compile_count"] = float(self._read_compiles)
        peak = self.backend.peak_memory_gib()
        if peak is not None:
            host["train/peak_memory_gib"] = peak
        self._window = {"wait": 0.0, "time": 0.0, "n": 0.0}
        return host

    # --- alarms --------------------------------------------------------------------------------

    def _alarm(self, message: str, title: str = "collapse") -> None:
        if self.backend.is_main:  # every process computed the same verdict; one speaks
            if self.s.logging.console:
                print_collapse(console, message)
            self.tracker.alert(title, message)

    def _stall_exit(self, phase: str, idle: float, step: int) -> None:
        """The watchdog's backstop (its thread): the main thread is stuck, most likely in a
        collective whose peer is gone; say so and end the process."""
        message = (
            f"no step finished for {idle:.0f} s after step {step} (waiting in {phase}); "
            f"train.stall_exit_s={self.s.train.stall_exit_s:g} reached: exiting with code "
            f"{STALL_EXIT_CODE}. If another host failed, its log says why."
        )
        log.error("%s", message)
        try:
            self.tracker.alert("training stopped: stalled", message)
            self.tracker.close(STALL_EXIT_CODE)
        finally:
            logging.shutdown()
            os._exit(STALL_EXIT_CODE)

    def _report_stall(self, phase: str, idle: float, step: int) -> None:
        waiting = {
            "data": "data (blocked on the DataLoader: workers, disk or cache reads)",
            "compute": "compute (forward/backward/optimizer, or a graph compile on XLA)",
            "validation": "validation (its loader or its forward passes)",
            "checkpoint": "a checkpoint write",
            "end of epoch": "the end-of-epoch metrics reduction",
            "closing the backend": "the backend's close (the device's pending work, loaders)",
        }.get(phase, phase)
        self.tracker.alert(
            "training stalled",
            f"no step finished for {idle:.0f} s after step {step}; the loop waits for {waiting}",
        )
