"""Checkpoints: atomic files + index, keep last N and the best, default folder, clear errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from octtrain.config.sections import CheckpointConfig
from octtrain.errors import CheckpointError
from octtrain.runtime.checkpoint import (
    CheckpointManager,
    checkpoint_dir,
    load_checkpoint,
    load_encoder_state,
    resume_url,
)


def _state(step: int) -> dict[str, object]:
    return {
        "step": step,
        "w": torch.full((3,), float(step)),
        "config": {"model": {"x": 1}},
        "target_encoder": {"w": torch.ones(2)},
    }


def test_keeps_last_n_and_the_best(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path / "ck"), keep_last=2, keep_best=True)
    scores = {10: 0.5, 20: 0.8, 30: 0.6, 40: 0.7, 50: None}  # higher is better
    for step, score in scores.items():
        manager.save(_state(step), step, score)
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert files == ["index.json", "step_00000020.pt", "step_00000040.pt", "step_00000050.pt"]
    assert manager.latest() == f"{tmp_path}/ck/step_00000050.pt"
    assert manager.best() == f"{tmp_path}/ck/step_00000020.pt"
    state = load_checkpoint(manager.latest() or "")
    assert state["step"] == 50 and torch.equal(state["w"], torch.full((3,), 50.0))


def test_folder_url_means_latest_and_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        load_checkpoint(str(tmp_path / "empty"))
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_checkpoint(str(tmp_path / "nope" / "step_00000001.pt"))
    manager = CheckpointManager(str(tmp_path / "ck"), keep_last=3, keep_best=False)
    manager.save(_state(1), 1)
    manager.save(_state(2), 2)
    assert load_checkpoint(str(tmp_path / "ck"))["step"] == 2
    weights, model = load_encoder_state(str(tmp_path / "ck"))
    assert torch.equal(weights["w"], torch.ones(2)) and model == {"x": 1}


def test_a_file_at_the_filesystem_root_is_not_read_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"step-{tmp_path.name}.pt"  # nothing of that name at /
    torch.save(_state(7), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    assert load_checkpoint(name)["step"] == 7  # a bare name is the current folder's
    with pytest.raises(CheckpointError, match=f"^/{name}: cannot read checkpoint"):
        load_checkpoint(f"/{name}")


def test_corrupt_checkpoint_is_reported(tmp_path: Path) -> None:
    (tmp_path / "step_00000001.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(str(tmp_path / "step_00000001.pt"))


def garbage(seed: int, size: int = 2048) -> bytes:
    """Seeded random bytes: the same damage on every run."""
    rng = random.Random(seed)
    return bytes(rng.getrandbits(8) for _ in range(size))


# Random bytes trip torch's weights-only unpickler in different ways; these seeds were found
# to raise UnpicklingError, IndexError, KeyError and UnicodeDecodeError (torch 2.13).
@pytest.mark.parametrize("seed", [0, 7, 44, 199], ids=["unpickling", "index", "key", "unicode"])
def test_any_damage_is_a_checkpoint_error(tmp_path: Path, seed: int) -> None:
    (tmp_path / "step_00000001.pt").write_bytes(garbage(seed))
    with pytest.raises(CheckpointError, match=r"step_00000001\.pt: not a readable checkpoint"):
        load_checkpoint(str(tmp_path / "step_00000001.pt"))


def test_a_pickle_of_something_else_is_not_a_checkpoint(tmp_path: Path) -> None:
    torch.save([1, 2, 3], tmp_path / "step_00000001.pt")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load_checkpoint(str(tmp_path / "step_00000001.pt"))


def test_no_temporary_files_are_left_behind(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), keep_last=1, keep_best=False)
    for step in range(3):
        manager.save(_state(step), step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json", "step_00000002.pt"]


@pytest.mark.parametrize("value", [None, "", "None"])
def test_default_dir_is_under_the_run_folder(tmp_path: Path, value: str | None) -> None:
    assert checkpoint_dir(CheckpointConfig(dir=value), tmp_path) == str(tmp_path / "checkpoints")
    assert checkpoint_dir(CheckpointConfig(dir="gs://b/p/"), tmp_path) == "gs://b/p"


def test_resume_auto_finds_the_latest_or_nothing(tmp_path: Path) -> None:
    auto = CheckpointConfig(resume="auto")
    assert resume_url(auto, str(tmp_path)) is None
    CheckpointManager(str(tmp_path), 2, False).save(_state(7), 7)
    assert resume_url(auto, str(tmp_path)) == f"{tmp_path}/step_00000007.pt"
    assert resume_url(CheckpointConfig(), str(tmp_path)) is None
    assert resume_url(CheckpointConfig(resume="x/step_1.pt"), str(tmp_path)) == "x/step_1.pt"


def test_gs_checkpoints_through_the_gcs_double(cloud_env: dict[str, str], gcs_bucket: str) -> None:
    url = f"gs://{gcs_bucket}/runs/a/checkpoints"
    manager = CheckpointManager(url, keep_last=1, keep_best=True)
    manager.save(_state(1), 1, score=0.9)
    manager.save(_state(2), 2, score=0.7)
    manager.save(_state(3), 3, score=0.5)
    assert manager.latest() == f"{url}/step_00000003.pt"
    assert manager.best() == f"{url}/step_00000001.pt"
    assert load_checkpoint(url)["step"] == 3
    assert load_checkpoint(f"{url}/step_00000001.pt")["step"] == 1
    # Read back through a second client (google-cloud-storage), not the fsspec store under test.
    from google.cloud import storage

    client = storage.Client.create_anonymous_client()
    names = sorted(b.name for b in client.list_blobs(gcs_bucket, prefix="runs/a/checkpoints/"))
    assert names == [
        f"runs/a/checkpoints/{n}" for n in ("index.json", "step_00000001.pt", "step_00000003.pt")
    ]


def test_a_nan_score_is_never_the_best_and_the_index_stays_json(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), keep_last=1, keep_best=True)
    manager.save(_state(1), 1, float("nan"))  # e.g. the AUROC of a one-class validation split
    manager.save(_state(2), 2, 0.5)
    manager.save(_state(3), 3, float("inf"))
    text = (tmp_path / "index.json").read_text()
    index = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in index.json"))
    assert index["best"]["step"] == 2
    assert [e["score"] for e in index["checkpoints"]] == [0.5, None]
    assert manager.best() == f"{tmp_path}/step_00000002.pt"


def test_a_nan_best_left_by_an_older_index_is_ignored(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), keep_last=2, keep_best=True)
    manager.save(_state(1), 1, 0.1)
    old = {"checkpoints": [{"name": "step_00000001.pt", "step": 1, "score": float("nan")}]}
    old["best"] = old["checkpoints"][0]
    (tmp_path / "index.json").write_text(json.dumps(old))
    assert manager.best() is None
    manager.save(_state(2), 2, 0.2)
    assert manager.best() == f"{tmp_path}/step_00000002.pt"


def test_the_callers_verdict_decides_the_best(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), keep_last=1, keep_best=True)
    manager.save(_state(1), 1, 0.5, is_best=True)
    manager.save(_state(2), 2, 0.51, is_best=False)  # better, but not by min_delta
    assert manager.best() == f"{tmp_path}/step_00000001.pt"
