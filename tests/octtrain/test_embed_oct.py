"""``octtrain embed`` of V-JEPA checkpoints on the tiny OCT cache: one row per volume and per
participant, the features ``probe`` reads (the mean of the same tokens), the probe's linear result
reproduced from the exported table, scikit-learn reading it unchanged, and the kind refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from octstage import manifest as mf
from octstage.outputs import claim_export_folder
from octtrain.cli import main as octtrain
from octtrain.embed import export
from octtrain.embed.encoders import load_encoder
from octtrain.embed.export import read_groups, read_header, read_items
from octtrain.errors import ConfigError, DataError
from octtrain.eval.common.metrics import balanced_accuracy, confusion_matrix
from octtrain.eval.oct.probe_train import ProbeSettings, fit_probe, predict_probs
from octtrain.eval.oct.tokens import split_features
from octtrain.runtime.backend import make_backend
from octtrain.runtime.checkpoint import load_checkpoint
from octtrain.train.job import RunResult


def embed(checkpoint: str, manifest: Path, out: Path, *extra: str) -> int:
    args = ["embed", "--checkpoint", checkpoint, "--manifest", str(manifest), "--out", str(out)]
    return octtrain([*args, "--device", "cpu", "--num-workers", "0", *extra])


@pytest.fixture(scope="module")
def exported(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("embed-oct") / "export"
    assert embed(tiny_pretrained, tiny_cache[0], out, "--part-size", "20") == 0
    return out


def test_one_row_per_volume_and_per_participant_with_their_metadata(
    exported: Path, tiny_cache: tuple[Path, Path]
) -> None:
    header = read_header(exported)
    volumes = read_items(exported).to_pandas()
    participants = read_groups(exported).to_pandas()
    listed = mf.load(tiny_cache[0])
    assert header["kind"] == "oct" and header["checkpoint"]["encoder"] == "target"
    assert [p["rows"] for p in header["parts"]] == [20, 20, 8]
    assert volumes["Metadata_ZarrPath"].tolist() == [v.zarr_path for v in listed.volumes]
    assert volumes["Metadata_ParticipantId"].tolist() == [v.participant_id for v in listed.volumes]
    assert volumes["Metadata_Label"].tolist() == [v.label for v in listed.volumes]
    assert {"Metadata_Device", "Metadata_Laterality", "Metadata_Region", "Metadata_Split",
            "Metadata_StudyGroup"} <= set(volumes.columns)  # fmt: skip
    ids = sorted({v.participant_id for v in listed.volumes})
    assert sorted(participants["Metadata_ParticipantId"]) == ids
    feats = [c for c in volumes.columns if not c.startswith("Metadata_")]
    one = participants.iloc[0]
    mine = volumes[volumes["Metadata_ParticipantId"] == one["Metadata_ParticipantId"]]
    assert one["Metadata_Volumes"] == len(mine)
    assert np.allclose(one[feats].to_numpy(float), mine[feats].to_numpy().mean(axis=0), atol=1e-5)


def _split(volumes: object, split: str, feats: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = volumes[volumes["Metadata_Split"] == split]  # type: ignore[index]
    x = torch.tensor(rows[feats].to_numpy(np.float32))
    return x[:, None, :], torch.tensor(rows["Metadata_Label"].to_numpy(np.int64))


def test_the_probe_s_features_and_its_linear_result_come_back_from_the_export(
    exported: Path, tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    """The export is the mean of the tokens ``probe`` caches (float16 there); the linear probe
    fitted on the exported rows picks the same learning rate and epoch and scores the test
    split as the probe on its tokens does; scikit-learn's logistic regression reads the table
    as it is (its score is reported beside, not pinned: another optimiser and penalty)."""
    from sklearn.linear_model import LogisticRegression

    volumes = read_items(exported).to_pandas()
    feats = [c for c in volumes.columns if not c.startswith("Metadata_")]
    state = load_checkpoint(tiny_pretrained)
    encoder, shape, heads, _ = load_encoder(state, tiny_pretrained, "target")
    manifest, root = mf.load(tiny_cache[0]), tiny_cache[1]
    backend = make_backend("cpu")
    tokens = {
        split: split_features(
            encoder, manifest, root, split, shape, split, tmp_path, backend, batch_size=8
        )
        for split in ("train", "val", "test")
    }
    test_rows = volumes[volumes["Metadata_Split"] == "test"][feats].to_numpy()
    pooled = tokens["test"].tokens.float().mean(dim=1).numpy()
    assert np.abs(pooled - test_rows).max() <= 2e-3 * np.abs(test_rows).max()

    settings = ProbeSettings(lrs=(1e-3, 3e-3), epochs=5)
    classes = len(manifest.classes)

    def fitted(data: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> tuple[object, float]:
        fit = fit_probe("linear", data["train"], data["val"], classes, heads, settings)
        probs = predict_probs(fit.head, data["test"][0]).numpy()
        cm = confusion_matrix(data["test"][1].numpy(), probs.argmax(1), classes)
        return (fit.chosen.lr, fit.chosen.best_epoch), balanced_accuracy(cm)

    from_tokens = fitted({k: (v.tokens, v.labels) for k, v in tokens.items()})
    from_export = fitted({k: _split(volumes, k, feats) for k in ("train", "val", "test")})
    assert from_export == from_tokens, (from_export, from_tokens)

    train, test = (volumes[volumes["Metadata_Split"] == s] for s in ("train", "test"))
    lr = LogisticRegression(max_iter=2000).fit(train[feats], train["Metadata_Label"])
    predicted = lr.predict(test[feats])
    cm = confusion_matrix(test["Metadata_Label"].to_numpy(), predicted, classes)
    print(f"linear probe {from_tokens[1]:.3f}, logistic regression {balanced_accuracy(cm):.3f}")
    assert 0.0 <= balanced_accuracy(cm) <= 1.0


def test_a_finetuned_checkpoint_embeds_with_its_encoder(
    tiny_finetuned: RunResult, tiny_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    assert tiny_finetuned.best_checkpoint is not None
    out = tmp_path / "ft"
    assert embed(tiny_finetuned.best_checkpoint, tiny_cache[0], out, "--split", "test") == 0
    header = json.loads((out / "embed.json").read_text())
    assert header["checkpoint"]["encoder"] == "finetuned" and header["items"] == 8
    assert set(read_items(out).to_pandas()["Metadata_Split"]) == {"test"}


@pytest.mark.parametrize("which", ["target", "context", "teacher"])
def test_an_encoder_named_for_a_finetuned_checkpoint_is_refused_not_ignored(
    which: str, tiny_finetuned: RunResult, tiny_cache: tuple[Path, Path], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A fine-tuning checkpoint holds one encoder: a choice of another is refused, not dropped."""
    assert tiny_finetuned.best_checkpoint is not None
    out = tmp_path / "ft"
    assert embed(tiny_finetuned.best_checkpoint, tiny_cache[0], out, "--encoder", which) == 2
    assert f"--encoder {which}" in caplog.text and "fine-tuning checkpoint" in caplog.text
    assert not out.exists()


def test_wrong_encoder_split_or_flags_are_refused_with_the_way_out(
    tiny_pretrained: str, tiny_cache: tuple[Path, Path], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    assert embed(tiny_pretrained, tiny_cache[0], tmp_path / "a", "--encoder", "teacher") == 2
    assert "not a DINO one; use --encoder target" in caplog.text
    assert embed(tiny_pretrained, tiny_cache[0], tmp_path / "b", "--split", "tset") == 2
    assert "--split 'tset'" in caplog.text and "'test'" in caplog.text
    assert embed(tiny_pretrained, tiny_cache[0], tmp_path / "c", "--part-size", "0") == 2
    assert embed(tiny_pretrained, tiny_cache[0], tmp_path / "d", "--prefix", "Metadata_x") == 2
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_a_full_disk_names_the_part_and_the_resume_finishes_the_export(
    tiny_pretrained: str, tiny_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    """A write the disk refuses (here the kernel's file-size limit: a real EFBIG) is one line
    naming the part's file, exit 2; the same command run again finishes the export."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = tmp_path / "export"
    args = [sys.executable, "-m", "octtrain.cli", "embed", "--checkpoint", tiny_pretrained]
    args += ["--manifest", str(tiny_cache[0]), "--out", str(out), "--device", "cpu"]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "1000"}
    proc = subprocess.run(
        args, preexec_fn=small_files, capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "File too large" in proc.stderr
    assert str(out / "parts") in proc.stderr and "run the same command again" in proc.stderr
    assert embed(tiny_pretrained, tiny_cache[0], out) == 0
    assert read_header(out)["items"] == 48


def test_a_resume_under_another_split_or_encoder_of_the_same_item_count_is_refused(
    tiny_pretrained: str, tiny_cache: tuple[Path, Path], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The same number of items is not the same items: the identity names the split and the
    encoder, so another's parts are never reused under their names."""
    out = tmp_path / "export"
    first = ("--split", "test", "--limit", "4")
    assert embed(tiny_pretrained, tiny_cache[0], out, *first) == 0
    parts = sorted(p.name for p in (out / "parts").iterdir())
    assert embed(tiny_pretrained, tiny_cache[0], out, "--split", "val", "--limit", "4") == 2
    assert "split: 'test' there, 'val' now" in caplog.text
    assert embed(tiny_pretrained, tiny_cache[0], out, *first, "--encoder", "context") == 2
    assert "encoder: 'target' there, 'context' now" in caplog.text
    assert sorted(p.name for p in (out / "parts").iterdir()) == parts  # nothing touched


def test_a_changed_data_page_or_header_format_fails_the_check(
    exported: Path, tmp_path: Path
) -> None:
    """The header's SHA-256 is compared, not only the row count a footer gives (a byte changed in
    a data page keeps the footer); a header of another format is not read as this one."""
    copy = tmp_path / "export"
    shutil.copytree(exported, copy)
    header = read_header(copy)
    part = copy / header["parts"][0]["name"]
    data = bytearray(part.read_bytes())
    data[len(data) // 4] ^= 0xFF  # inside the column chunks, far from the footer at the end
    part.write_bytes(bytes(data))
    with pytest.raises(DataError, match="differs from the header"):
        read_header(copy)
    shutil.copy(exported / header["parts"][0]["name"], part)
    (copy / export.HEADER).write_text(json.dumps({**header, "format": export.FORMAT + 1}))
    with pytest.raises(DataError, match=f"not an export header of format {export.FORMAT}"):
        read_header(copy)


def test_a_hidden_temp_a_killed_export_left_does_not_make_the_folder_foreign(
    exported: Path, tmp_path: Path
) -> None:
    """A SIGKILL while a table is written leaves ``.<name>.<pid>.tmp``: the resume still sees the
    folder as the export's own (and finishes it) instead of refusing it as someone else's."""
    copy = tmp_path / "export"
    shutil.copytree(exported, copy)
    (copy / ".participants.parquet.4242.tmp").write_bytes(b"half a table")
    plan = json.loads((copy / export.PLAN).read_text())
    identity = {k: plan[k] for k in ("kind", "checkpoint_sha256", "encoder", "split", "items")}
    earlier = claim_export_folder(copy, export.PLAN, export.own, identity, ConfigError)
    assert earlier is not None and earlier["items"] == plan["items"]
    (copy / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"notes\.txt"):  # a name of someone else's: refused
        claim_export_folder(copy, export.PLAN, export.own, identity, ConfigError)
