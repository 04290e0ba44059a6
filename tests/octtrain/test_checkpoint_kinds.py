"""A checkpoint of another job is refused naming the file, the kind found and what to pass
instead (resuming another job's run folder, ``--init`` with a fine-tuning checkpoint or a file
that is no checkpoint, ``evaluate`` of a pretraining checkpoint), and leaves the run it found as
it was; ``checkpoint.resume=auto`` says when it starts fresh, and a run that stopped before its
first step does not block a re-run in its folder; a run shorter than its warmup is said."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from octtrain import cli
from octtrain.train.job import RunResult
from tests.octtrain.finetune_fixtures import FINETUNE_TINY, PRETRAIN_TINY

FAST = ["logging.wandb_mode=disabled", "logging.console=false"]


def run(*args: str | Path) -> int:
    return cli.main([str(a) for a in args])


def test_a_checkpoint_of_another_job_is_refused_naming_file_kind_and_what_to_pass(
    tiny_cache: tuple[Path, Path],
    tiny_pretrained: str,
    tiny_finetuned: RunResult,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    manifest, _ = tiny_cache
    assert tiny_finetuned.run_dir is not None
    # Copies: the session's runs stay as they are whatever happens here.
    pre = Path(shutil.copytree(Path(tiny_pretrained).parents[1], tmp_path / "pre"))
    ft = Path(shutil.copytree(tiny_finetuned.run_dir, tmp_path / "ft"))
    before = {p: p.read_bytes() for p in (ft / "config.yaml", pre / "config.yaml")}
    notes = tmp_path / "notes.txt"
    notes.write_text("not a checkpoint\n")
    dino = tmp_path / "dino.pt"  # what a DINO run's checkpoint says it is (its weights aside)
    torch.save({"kind": "dino", "config": {}, "schedule": {"step": 3}}, dino)
    pretrain = ["pretrain", "--config", PRETRAIN_TINY, "--manifest", manifest, *FAST]
    finetune = ["finetune", "--config", FINETUNE_TINY, "--manifest", manifest, *FAST]
    fresh = f"train.run_dir={tmp_path / 'new'}"
    cases: list[tuple[list[str | Path], list[str]]] = [
        (
            [*pretrain, f"train.run_dir={ft}", "checkpoint.resume=auto", "train.max_steps=6"],
            [f"{ft}/checkpoints/step_", "a fine-tuning checkpoint (octtrain finetune); this "
             "needs a V-JEPA pretraining checkpoint", "train.overwrite=true"],
        ),
        (
            [*finetune, f"train.run_dir={pre}", "checkpoint.resume=auto",
             "--init", tiny_pretrained],
            [f"{pre}/checkpoints/step_", "a V-JEPA pretraining checkpoint (octtrain pretrain); "
             "this needs a fine-tuning checkpoint", "another train.run_dir"],
        ),
        (
            [*finetune, fresh, "--init", ft / "checkpoints"],
            [f"--init {ft}/checkpoints: a fine-tuning checkpoint", "--init wants the V-JEPA "
             "pretraining checkpoint", "checkpoints/ folder"],
        ),
        (
            [*finetune, fresh, "--init", notes],
            [f"{notes}: not a readable checkpoint", "--init wants the V-JEPA pretraining"],
        ),
        (
            [*finetune, fresh, "--init", dino],
            [f"--init {dino}: a DINO pretraining checkpoint", "--init wants the V-JEPA"],
        ),
        (
            ["probe", "--checkpoint", dino, "--manifest", manifest, "--out", tmp_path / "probe"],
            [f"{dino}: a DINO pretraining checkpoint", "`octtrain profile`"],
        ),
        (
            ["evaluate", "--checkpoint", tiny_pretrained, "--manifest", manifest,
             "--out", tmp_path / "eval"],
            [f"{tiny_pretrained}: a V-JEPA pretraining checkpoint", "`octtrain probe`"],
        ),
    ]  # fmt: skip
    for args, said in cases:
        caplog.clear()
        assert run(*args) == 2, caplog.text
        text = " ".join(caplog.text.split())
        for part in said:
            assert part in text, (part, text)
        assert "Traceback" not in text
    # The runs found are left as they were (the config.yaml is written after the resume).
    assert {p: p.read_bytes() for p in before} == before


def test_a_run_that_stopped_before_its_first_step_is_run_again_with_resume_auto_announced(
    tiny_cache: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest, _ = tiny_cache
    folder = tmp_path / "run"
    folder.mkdir()
    # What a run that failed at step 0 leaves: its config and a summary, no step, no checkpoint.
    (folder / "config.yaml").write_text("# the failed run\n")
    (folder / "metrics.jsonl").write_text('{"event": "summary", "best_unit": null}\n')
    base = ["pretrain", "--config", PRETRAIN_TINY, "--manifest", manifest, *FAST]
    base += [f"train.run_dir={folder}", "train.max_steps=2"]  # tiny.yaml warms up over 5
    assert run(*base) == 2
    assert "never trained" in caplog.text and "checkpoint.resume=auto" in caplog.text
    caplog.clear()
    assert run(*base, "checkpoint.resume=auto") == 0
    assert f"checkpoint.resume=auto: no checkpoint in {folder / 'checkpoints'}; starting fresh" in (
        caplog.text
    )
    assert (folder / "checkpoints" / "step_00000002.pt").is_file()
    # A run shorter than its warmup is said (a smoke run of a real config is one).
    assert "schedule.warmup_steps (5) exceeds train.max_steps (2)" in caplog.text
