"""Metrics out: W&B (online, offline or off), a local JSON-lines log and a one-line console summary.

Every call writes the same numbers to all three, so turning W&B off loses nothing locally. Only
the main process tracks (``enabled=False`` makes every method a no-op but the console line):
on a pod every host still logs its step lines to its own log, tagged ``host N | ``, so an
operator can see that every host is stepping and where each one stopped. Each metric prefix gets its
own x-axis: ``train/*`` are plotted against ``train/step``, ``val/*`` against ``val/step``, and
W&B's internal step is never passed, so a validation logged "in the past" is never dropped and
train metrics are committed as they come.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import numpy as np

from octtrain.config.sections import LoggingConfig

log = logging.getLogger("octtrain")

# The console line shows these first (when present), then nothing else: the log has the rest.
CONSOLE_KEYS = (
    "loss",
    "lr",
    "grad_norm",
    "ema_momentum",
    "data_wait_frac",
    "step_time_s",
    "samples_per_s",
    "compile_count",
    "peak_memory_gib",
    "balanced_accuracy",
    "knn_balanced_accuracy",
    "feat_erank",
    "mae",  # a regression's (data.label.task: regression)
    "r2",
)


def format_console(step: int, metrics: Mapping[str, float | int]) -> str:
    """``train step 20 | loss 0.4123 | lr 0.0001 | ...``: a few well-known keys, on one line."""
    prefixes = sorted({k.split("/", 1)[0] for k in metrics if "/" in k})
    parts = [f"{'/'.join(prefixes)} step {step}".strip()]
    for key, value in metrics.items():
        short = key.split("/", 1)[-1]
        if short in CONSOLE_KEYS:
            parts.append(f"{short} {value:.4g}" if isinstance(value, float) else f"{short} {value}")
    return " | ".join(parts)


class Tracker:
    """W&B or nothing, plus ``metrics.jsonl`` in the run folder and the console."""

    def __init__(
        self,
        cfg: LoggingConfig,
        run_dir: Path | None,
        *,
        enabled: bool,
        config: Mapping[str, Any],
        job_type: str,
        run_name: str | None = None,
        host: int | None = None,
    ) -> None:
        """``host``: this process's index, which tags its console lines (None: one process)."""
        self.cfg = cfg
        self.host = host
        self.enabled = enabled and run_dir is not None
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._defined: set[str] = set()
        self._jsonl: TextIO | None = None
        self._wandb: Any = None
        self.mode = "disabled"
        if not self.enabled or run_dir is None:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.mode = cfg.resolved_wandb_mode()
        if self.mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb_project,
                entity=cfg.wandb_entity,
                group=cfg.wandb_group,
                name=run_name,
                job_type=job_type,
                dir=str(run_dir),
                mode=self.mode,  # type: ignore[arg-type]
                config=dict(config),
                settings=wandb.Settings(quiet=True, save_code=False),
            )

    def _write(self, record: Mapping[str, Any]) -> None:
        if self._jsonl is None:  # closed: the watchdog still alerts while the backend closes
            return
        self._jsonl.write(json.dumps(record, default=_jsonable) + "\n")
        self._jsonl.flush()

    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        """Record ``metrics`` at ``step`` of their prefix's axis (``train/``, ``val/``, ...);
        the console line on every host (module docstring)."""
        if self.cfg.console:
            line = format_console(step, metrics)
            log.info("%s", line if self.host is None else f"host {self.host} | {line}")
        if not self.enabled:
            return
        with self._lock:
            self._write({"step": step, "time": round(time.time(), 3), **metrics})
            if self._wandb is not None:
                payload: dict[str, Any] = dict(metrics)
                for prefix in {k.split("/", 1)[0] for k in metrics if "/" in k}:
                    self._define(prefix)
                    payload[f"{prefix}/step"] = step
                self._wandb.log(payload)

    def _define(self, prefix: str) -> None:
        if prefix in self._defined:
            return
        self._wandb.define_metric(f"{prefix}/step", hidden=True)
        self._wandb.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")
        self._defined.add(prefix)

    def log_images(self, images: Mapping[str, np.ndarray], step: int) -> None:
        """Save RGB/grey uint8 images as PNGs under ``images/`` and send them to W&B."""
        if not self.enabled or self.run_dir is None:
            return
        import cv2

        folder = self.run_dir / "images"
        folder.mkdir(exist_ok=True)
        files = {}
        for key, image in images.items():
            path = folder / f"{key.replace('/', '_')}_{step:08d}.png"
            bgr = image[..., ::-1] if image.ndim == 3 else image
            cv2.imwrite(str(path), np.ascontiguousarray(bgr))
            files[key] = str(path.relative_to(self.run_dir))
        with self._lock:
            self._write({"step": step, "time": round(time.time(), 3), "images": files})
            if self._wandb is not None:
                import wandb

                payload: dict[str, Any] = {k: wandb.Image(v) for k, v in images.items()}
                for prefix in {k.split("/", 1)[0] for k in images if "/" in k}:
                    self._define(prefix)
                    payload[f"{prefix}/step"] = step
                self._wandb.log(payload)

    def alert(self, title: str, text: str) -> None:
        """A warning that must be seen: console, the JSON log, and a W&B alert when online."""
        if not self.enabled:
            log.warning("%s: %s", title, text)
            return
        with self._lock:
            log.warning("%s: %s", title, text)
            self._write(
                {"event": "alert", "time": round(time.time(), 3), "title": title, "text": text}
            )
            if self._wandb is not None and self.mode == "online":
                self._wandb.alert(title=title, text=text)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Final values of the run (W&B summary, and a summary record in the JSON log)."""
        if not self.enabled:
            return
        with self._lock:
            self._write({"event": "summary", **values})
            if self._wandb is not None:
                self._wandb.summary.update(dict(values))

    def close(self, exit_code: int = 0) -> None:
        """Finish the W&B run (flushing an offline run to disk) and close the JSON log."""
        if not self.enabled:
            return
        with self._lock:
            if self._wandb is not None:
                self._wandb.finish(exit_code=exit_code)
                self._wandb = None
            if self._jsonl is not None:
                self._jsonl.close()
                self._jsonl = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(exit_code=0 if kind is None else 1)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
