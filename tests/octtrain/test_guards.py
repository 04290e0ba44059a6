"""Every guard of the one training skeleton, proven in one place.

A scripted ``Job`` (the skeleton's plug-in interface, not a mock of a dependency) drives the real
``Trainer``: it says what each step returns, where it stalls and what validation finds, so each
test pins one decision the skeleton owns for pretraining and finetuning alike. Each test was
checked to fail with its guard removed (see the note on issue 9).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from octtrain.config.sections import (
    CheckpointConfig,
    LoggingConfig,
    TrainConfig,
    ValidationConfig,
)
from octtrain.errors import NonFiniteLossError
from octtrain.eval.common.collapse import target_entropies
from octtrain.runtime.backend import make_backend
from octtrain.train.job import Evaluation, Settings, StepResult, monitor_rows
from octtrain.train.loop import Trainer


class Clock:
    """The trainer's clock: time passes only when a test says so (no sleeping, no load)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.poll: Callable[[], None] = lambda: None  # the trainer's watchdog, once built

    def __call__(self) -> float:
        return self.now

    def stall(self, seconds: float) -> None:
        self.now += seconds
        self.poll()


@dataclass
class ScriptedJob:
    """A job whose steps and validations follow a script (1-based step numbers).

    ``stall_in`` says where the stall of ``stall_s`` clock seconds happens: in the step
    ("compute"), while the loop waits for batch ``stall_at`` ("data"), in ``validate``
    ("validation") or in ``end_of_unit`` ("end of epoch"), after step ``stall_at - 1``.
    """

    total_steps: int
    kind: str = "pretrain"
    steps_per_unit: int = 1
    global_batch: int = 2
    validates_last: bool = False
    nan_at: int | None = None
    inf_norm_at: int | None = None
    stall_at: int | None = None
    stall_s: float = 0.0
    stall_in: str = "compute"
    collapsed_features: bool = False
    blind_steps: tuple[int, ...] = ()  # steps whose teacher targets carry no image
    val_alarm: str | None = None
    val_error_at: int | None = None  # the unit whose validation raises (a bug, a CUDA OOM)
    val_ctrl_c_at: int | None = None  # the unit whose validation's import a Ctrl-C cuts short
    scores: dict[int, float] = field(default_factory=dict)
    epoch_metrics: bool = False
    loaded: list[int] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    clock: Clock = field(default_factory=Clock)
    phase: Callable[[], tuple[str, int]] = lambda: ("", 0)

    def load_state(self, state: dict[str, Any]) -> None:
        self.loaded.append(int(state["w"]))

    def state(self, step: int) -> dict[str, Any]:
        return {"w": torch.tensor(step)}

    def start(self, start_step: int) -> Iterator[dict[str, Any]]:
        for i in itertools.count(start_step):
            if self.stall_in == "data" and i + 1 == self.stall_at:
                # The prefetch thread loads ahead: stall once the loop waits for this batch.
                deadline = time.monotonic() + 60
                while self.phase() != ("data", i) and time.monotonic() < deadline:
                    time.sleep(0.001)
                self.clock.stall(self.stall_s)
            yield {"x": torch.tensor(i)}

    def before_step(self, step: int) -> None:
        pass

    def train_step(self, batch: dict[str, Any], step: int) -> StepResult:
        done = step + 1
        if done == self.stall_at and self.stall_in == "compute":
            self.clock.stall(self.stall_s)
        loss = math.nan if done == self.nan_at else 1.0 / done
        norm = math.inf if done == self.inf_norm_at else float(done)
        if self.collapsed_features:  # every token of every sample the same vector
            features = torch.ones(2, 16, 8)
        else:
            features = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(done))
        rows = monitor_rows(features)
        # Teacher targets: the same for every crop on a blind step, one prototype each otherwise.
        probs = torch.full((4, 8), 1 / 8) if done in self.blind_steps else torch.eye(8)[:4]
        monitors = target_entropies(probs)
        return StepResult(torch.tensor(loss), torch.tensor(norm), rows, {"lr": 0.1}, monitors)

    def end_of_unit(self, unit: int) -> tuple[dict[str, float], str | None]:
        if self.stall_in == "end of epoch" and unit == self.stall_at:
            self.clock.stall(self.stall_s)
        return ({"train/epoch_loss": 1.0 / unit} if self.epoch_metrics else {}), None

    def validate(self, unit: int) -> Evaluation:
        if self.stall_in == "validation" and unit == self.stall_at:
            self.clock.stall(self.stall_s)
        if unit == self.val_error_at:
            raise RuntimeError("CUDA out of memory in validation")
        if unit == self.val_ctrl_c_at:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as ctrl_c:  # what CPython makes of it inside an import
                raise ImportError("initialization failed") from ctrl_c
        score = self.scores.get(unit, float(unit))
        return Evaluation({"val/loss": 1.0 / unit}, score=score, alarm=self.val_alarm)

    def images(self, batch: dict[str, Any], result: StepResult) -> dict[str, np.ndarray]:
        return {}


def settings(run: Path, **sections: Any) -> Settings:
    return Settings(
        train=sections.get("train", TrainConfig(max_steps=8, run_dir=str(run))),
        validation=sections.get("validation", ValidationConfig()),
        logging=sections.get("logging", LoggingConfig(wandb_mode="disabled", log_every=100)),
        checkpoint=sections.get("checkpoint", CheckpointConfig(every=2)),
        config={},
        config_yaml="",
    )


def records(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def train(job: ScriptedJob, s: Settings) -> Any:
    backend = make_backend("cpu")
    try:
        trainer = Trainer(job, s, backend, clock=job.clock)
        job.clock.poll = trainer.watchdog.poll
        job.phase = lambda: (trainer.watchdog.phase, trainer.watchdog.step)
        return trainer.run()
    finally:
        backend.close()


def test_first_and_last_steps_are_logged_whatever_log_every_says(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(ScriptedJob(total_steps=7), settings(run))
    steps = [r["step"] for r in records(run) if "train/loss" in r]
    assert steps == [1, 7]


def test_a_nan_at_a_step_that_saves_stops_before_the_save(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"step 4: .*step_00000002\.pt"):
        train(ScriptedJob(total_steps=8, nan_at=4), settings(run))
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    assert [e["step"] for e in index["checkpoints"]] == [2]  # step 4 never saved
    alerts = [r for r in records(run) if r.get("event") == "alert"]
    assert alerts and alerts[0]["title"] == "non-finite loss"


def test_resume_auto_continues_after_the_last_good_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError):
        train(ScriptedJob(total_steps=8, nan_at=5), settings(run))
    job = ScriptedJob(total_steps=8)
    again = settings(run, checkpoint=CheckpointConfig(every=2, resume="auto"))
    result = train(job, again)
    assert job.loaded == [4] and result.steps == 8
    assert min(r["step"] for r in records(run)[-3:] if "train/loss" in r) >= 5


def test_a_stall_reaches_the_console_and_the_log_with_its_phase(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    s = settings(run, train=TrainConfig(max_steps=3, run_dir=str(run), stall_timeout_s=100))
    with caplog.at_level("WARNING", logger="octtrain"):
        train(ScriptedJob(total_steps=3, stall_at=2, stall_s=150), s)
    alerts = [r for r in records(run) if r.get("event") == "alert"]
    assert [a["title"] for a in alerts] == ["training stalled"]
    assert "150 s after step 1" in alerts[0]["text"] and "compute" in alerts[0]["text"]
    assert any("training stalled" in m and "compute" in m for m in caplog.messages)


@pytest.mark.parametrize(("allowance", "stalled"), [(100.0, False), (0.0, True)])
def test_the_first_step_gets_train_first_step_allowance_s_before_it_is_a_stall(
    tmp_path: Path, allowance: float, stalled: bool
) -> None:
    """A first step of 150 s (a slow first XLA compile) with stall_timeout_s 100: a stall only
    without the allowance the Trainer hands the watchdog (the pod presets give 1800 s)."""
    run = tmp_path / "run"
    train_cfg = TrainConfig(
        max_steps=2, run_dir=str(run), stall_timeout_s=100, first_step_allowance_s=allowance
    )
    train(ScriptedJob(total_steps=2, stall_at=1, stall_s=150), settings(run, train=train_cfg))
    alerts = [r["title"] for r in records(run) if r.get("event") == "alert"]
    assert alerts == (["training stalled"] if stalled else [])


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("data", "waits for data (blocked on the DataLoader"),
        ("compute", "waits for compute (forward/backward"),
        ("validation", "waits for validation (its loader"),
        ("end of epoch", "waits for the end-of-epoch metrics"),
    ],
)
def test_a_stall_names_the_phase_it_happened_in(tmp_path: Path, where: str, says: str) -> None:
    run = tmp_path / "run"
    s = settings(
        run,
        train=TrainConfig(max_steps=4, run_dir=str(run), stall_timeout_s=100),
        validation=ValidationConfig(every=1),
    )
    train(ScriptedJob(total_steps=4, stall_at=3, stall_s=150, stall_in=where), s)
    alerts = [r["text"] for r in records(run) if r.get("event") == "alert"]
    assert len(alerts) == 1 and says in alerts[0], alerts
    assert f"after step {2 if where in ('data', 'compute') else 3}" in alerts[0]


def test_collapse_in_training_features_raises_an_alarm(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, logging=LoggingConfig(wandb_mode="disabled", log_every=1, console=False))
    train(ScriptedJob(total_steps=2, collapsed_features=True), s)
    alerts = [r for r in records(run) if r.get("event") == "alert"]
    assert alerts and all(a["title"] == "collapse" for a in alerts)
    assert "train, step 1" in alerts[0]["text"]


def test_a_validation_alarm_reaches_the_log(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, validation=ValidationConfig(every=4))
    train(ScriptedJob(total_steps=4, val_alarm="val: one class takes 100%"), s)
    alerts = [r for r in records(run) if r.get("event") == "alert"]
    assert [a["text"] for a in alerts] == ["val: one class takes 100%"]


def test_the_best_checkpoint_is_the_highest_score(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, validation=ValidationConfig(every=2))
    result = train(ScriptedJob(total_steps=6), s)
    assert result.best_unit == 6 and result.best_checkpoint.endswith("step_00000006.pt")


def test_a_checkpoint_whose_targets_carry_no_image_is_never_the_best(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, validation=ValidationConfig(every=1), checkpoint=CheckpointConfig(every=1))
    # Scores rise every unit, but from step 3 on the teacher's targets ignore the input; the
    # steps are not logged (log_every=100): the step before each validation is judged anyway.
    result = train(ScriptedJob(total_steps=4, blind_steps=(3, 4)), s)
    assert result.best_unit == 2 and result.best_checkpoint.endswith("step_00000002.pt")
    alerts = [r for r in records(run) if r.get("event") == "alert"]
    assert {a["title"] for a in alerts} == {"targets carry no image"}
    texts = " | ".join(a["text"] for a in alerts)
    assert "train, step 3" in texts and "unit 3 is not picked as the best checkpoint" in texts
    refused = [r for r in records(run) if r.get("val/best_refused")]
    assert [r["step"] for r in refused] == [3, 4]


def test_healthy_targets_log_their_entropies_and_raise_no_alarm(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, logging=LoggingConfig(wandb_mode="disabled", log_every=1, console=False))
    train(ScriptedJob(total_steps=2), s)
    assert not [r for r in records(run) if r.get("event") == "alert"]
    logged = [r for r in records(run) if "train/loss" in r]
    gaps = [r["train/teacher_entropy_gap"] for r in logged]
    assert gaps == [pytest.approx(math.log(4))] * 2  # batch log 4, each crop 0


def test_a_blank_run_dir_is_a_timestamped_folder_never_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = settings(tmp_path, train=TrainConfig(max_steps=1, run_dir=" ", output_dir="runs"))
    result = train(ScriptedJob(total_steps=1), s)
    assert result.run_dir.parent == Path("runs") or result.run_dir.parent.name == "runs"
    assert result.run_dir.name.startswith("pretrain-")
    assert not list(tmp_path.rglob("None"))


def test_the_collapse_monitor_samples_every_sample_of_the_batch() -> None:
    features = torch.zeros(4, 2048, 3)
    for b in range(4):
        features[b, :, 0] = b  # each sample's tokens carry its index
    rows = monitor_rows(features)
    assert rows.shape[0] <= 1024
    assert sorted(set(rows[:, 0].tolist())) == [0.0, 1.0, 2.0, 3.0]


def test_each_unit_records_its_training_time_without_validation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, train=TrainConfig(max_steps=3, run_dir=str(run)))
    result = train(ScriptedJob(total_steps=3, stall_at=2, stall_s=5.0), s)
    times = [h["unit_time_s"] for h in result.history]
    assert times == [0.0, 5.0, 0.0]  # the slow step, in its unit
    assert [h["unit_data_wait_frac"] for h in result.history] == [0.0, 0.0, 0.0]


def test_validation_time_is_not_training_time(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(
        run, train=TrainConfig(max_steps=3, run_dir=str(run)), validation=ValidationConfig(every=1)
    )
    job = ScriptedJob(total_steps=3, stall_at=2, stall_s=5.0, stall_in="validation")
    result = train(job, s)
    assert [h["unit_time_s"] for h in result.history] == [0.0, 0.0, 0.0]
    assert [r["val/time_s"] for r in records(run) if "val/time_s" in r] == [0.0, 5.0, 0.0]


def test_a_validation_that_crashes_keeps_its_units_checkpoint(tmp_path: Path) -> None:
    """A DINO run on an H100 trained, then died at its validation (no copairs there) without the
    unit's checkpoint: the steps since the last one were lost. The error still ends the run."""
    run = tmp_path / "run"
    s = settings(run, validation=ValidationConfig(every=2))
    with pytest.raises(RuntimeError, match="out of memory in validation"):
        train(ScriptedJob(total_steps=8, val_error_at=4), s)
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    assert [e["step"] for e in index["checkpoints"]] == [2, 4]
    assert index["best"]["step"] == 2  # saved without a score: never the best


def test_a_ctrl_c_inside_a_validations_import_is_the_interrupt_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not "validation of step 2 failed" and the ImportError raised once saved: the run stops
    as at any Ctrl-C, at once."""
    run = tmp_path / "run"
    s = settings(run, validation=ValidationConfig(every=2))
    with pytest.raises(KeyboardInterrupt):
        train(ScriptedJob(total_steps=8, val_ctrl_c_at=2), s)
    assert not [r for r in caplog.records if "validation of step" in r.getMessage()]


def test_a_slow_loader_counts_as_data_wait(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, train=TrainConfig(max_steps=3, run_dir=str(run)))
    result = train(ScriptedJob(total_steps=3, stall_at=2, stall_s=5.0, stall_in="data"), s)
    assert [h["unit_data_wait_frac"] for h in result.history] == [0.0, 1.0, 0.0]


def test_an_infinite_grad_norm_with_a_finite_loss_stops_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"step 3: loss 0\.33.*grad norm inf"):
        train(ScriptedJob(total_steps=8, inf_norm_at=3), settings(run))
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    assert [e["step"] for e in index["checkpoints"]] == [2]


def test_train_metrics_are_logged_before_validation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(
        run,
        logging=LoggingConfig(wandb_mode="disabled", log_every=2),
        validation=ValidationConfig(every=2),
    )
    train(ScriptedJob(total_steps=4, epoch_metrics=True), s)
    order = [
        (r["step"], key)
        for r in records(run)
        for key in ("train/loss", "train/epoch_loss", "val/loss")
        if key in r
    ]
    for step in (2, 4):
        seen = [k for st, k in order if st == step]
        assert seen == ["train/loss", "train/epoch_loss", "val/loss"], order


def test_a_nan_score_never_becomes_the_best_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, validation=ValidationConfig(every=1), checkpoint=CheckpointConfig(every=1))
    job = ScriptedJob(total_steps=4, scores={1: math.nan, 2: 0.5, 3: math.nan, 4: 0.4})
    result = train(job, s)
    assert result.best_unit == 2 and result.best_checkpoint.endswith("step_00000002.pt")
    text = (run / "checkpoints" / "index.json").read_text()
    index = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in index.json"))
    assert index["best"]["step"] == 2


def test_early_stopping_and_the_best_checkpoint_name_the_same_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, validation=ValidationConfig(every=1), checkpoint=CheckpointConfig(every=1))
    s = dataclasses.replace(s, min_delta=0.1)
    job = ScriptedJob(total_steps=3, scores={1: 0.5, 2: 0.55, 3: 0.52})  # +0.05: not by min_delta
    result = train(job, s)
    assert result.best_unit == 1 and result.best_checkpoint.endswith("step_00000001.pt")


def test_validation_time_never_counts_towards_a_stall_of_the_next_step(tmp_path: Path) -> None:
    # Validation takes 90 s, the next step 20 s: each under the 100 s timeout, together over.
    run = tmp_path / "run"
    s = settings(
        run,
        train=TrainConfig(max_steps=3, run_dir=str(run), stall_timeout_s=100),
        validation=ValidationConfig(every=1),
    )
    job = ScriptedJob(total_steps=3, stall_at=2, stall_s=90, stall_in="validation")
    original = job.train_step

    def slow_third(batch: dict[str, Any], step: int) -> StepResult:
        if step + 1 == 3:
            job.clock.stall(20)
        return original(batch, step)

    job.train_step = slow_third  # type: ignore[method-assign]
    train(job, s)
    assert [r for r in records(run) if r.get("event") == "alert"] == []


def test_an_infinite_score_is_never_the_best(tmp_path: Path) -> None:
    run = tmp_path / "run"
    s = settings(run, validation=ValidationConfig(every=1), checkpoint=CheckpointConfig(every=1))
    result = train(ScriptedJob(total_steps=3, scores={1: 0.2, 2: math.inf, 3: 0.3}), s)
    assert result.best_unit == 3 and result.best_score == 0.3
    assert result.best_checkpoint.endswith("step_00000003.pt")


def test_resume_keeps_the_early_stopping_best_and_its_patience_count(tmp_path: Path) -> None:
    run = tmp_path / "run"
    scores = {1: 0.9, 2: 0.1, 3: 0.1, 4: 0.1, 5: 0.1, 6: 0.1}
    base = settings(run, validation=ValidationConfig(every=1), checkpoint=CheckpointConfig(every=1))
    s = dataclasses.replace(base, patience=3)
    with pytest.raises(NonFiniteLossError):  # stops after step 2: best 0.9 at 1, one bad
        train(ScriptedJob(total_steps=6, scores=scores, nan_at=3), s)
    again = dataclasses.replace(s, checkpoint=CheckpointConfig(every=1, resume="auto"))
    result = train(ScriptedJob(total_steps=6, scores=scores), again)
    # Forgetting the best would make 0.1 at unit 3 a new best; forgetting the count, stop at 5.
    assert result.stopped_early and result.steps == 4
    assert result.best_unit == 1 and result.best_score == 0.9
