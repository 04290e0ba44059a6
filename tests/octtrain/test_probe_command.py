"""``octtrain probe``: frozen-feature probes on a real checkpoint, the report, the feature cache
and its key, determinism, refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from octstage import manifest as mf
from octtrain.cli import main
from octtrain.errors import ConfigError
from octtrain.eval.common.metrics import balanced_accuracy, confusion_matrix
from octtrain.eval.oct.breakdown import BootstrapSpec
from octtrain.eval.oct.probe_run import ProbeResult, run_probe
from octtrain.eval.oct.probe_train import ProbeSettings, predict_probs
from octtrain.eval.oct.tokens import feature_key
from octtrain.train.job import RunResult

from .test_checkpoint import garbage

FAST = ["--lrs", "1e-3", "3e-3", "--epochs", "3", "--bootstrap", "100", "--device", "cpu"]


def test_probe_writes_both_reports_and_reuses_its_features(
    tiny_cache: tuple[Path, Path],
    tiny_pretrained: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = ["probe", "--checkpoint", tiny_pretrained, "--manifest", str(tiny_cache[0])]
    assert main([*args, "--out", str(tmp_path / "a"), *FAST]) == 0
    summary = json.loads((tmp_path / "a" / "probe.json").read_text())
    assert summary["encoder"] == "target" and summary["seeds"] == {"probe": 0, "bootstrap": 0}
    assert summary["checkpoint_sha256"].startswith("sha256:")
    for kind in ("attentive", "linear"):
        probe = summary["probes"][kind]
        assert probe["chosen_lr"] in (1e-3, 3e-3) and 1 <= probe["chosen_epoch"] <= 3
        assert [p["lr"] for p in probe["grid"]] == [1e-3, 3e-3]
        doc = json.loads((tmp_path / "a" / kind / "metrics-test.json").read_text())
        assert doc["volume"]["num_samples"] == 8 and doc["probe"]["kind"] == kind
        assert {g["grouping"] for g in doc["groups"]} >= {"overall", "device", "site"}
        assert (tmp_path / "a" / kind / "groups-test.png").stat().st_size > 0
    features = sorted(p.name.split("-")[0] for p in (tmp_path / "a" / "features").iterdir())
    assert features == ["test", "train", "val"]

    # Same checkpoint, same volumes: the features come from the cache, the numbers are equal.
    def probe_again(out: str, split: str = "test") -> ProbeResult:
        return run_probe(
            tiny_pretrained,
            str(tiny_cache[0]),
            split=split,
            out=str(tmp_path / out),
            feature_cache=str(tmp_path / "a" / "features"),
            device="cpu",
            settings=ProbeSettings(lrs=(1e-3, 3e-3), epochs=3),
            bootstrap=BootstrapSpec(resamples=100),
        )

    again = probe_again("b")
    assert again.features_cached == {"train": True, "val": True, "test": True}
    second = json.loads(again.summary_json.read_text())
    assert second["probes"] == summary["probes"]
    for kind in ("attentive", "linear"):
        a = json.loads((tmp_path / "a" / kind / "metrics-test.json").read_text())
        b = json.loads((tmp_path / "b" / kind / "metrics-test.json").read_text())
        assert a["groups"] == b["groups"] and a["predictions"] == b["predictions"]

    # A damaged cache file is computed again (with a warning), never a crash.
    (val_file,) = (tmp_path / "a" / "features").glob("val-*.pt")
    val_file.write_bytes(garbage(7))  # an IndexError inside torch's unpickler
    third = probe_again("c")
    assert third.features_cached == {"train": True, "val": False, "test": True}
    assert json.loads(third.summary_json.read_text())["probes"] == summary["probes"]
    assert "caveat" not in summary

    # The split the probes were fitted on: scored, with the caveat said and recorded.
    caplog.clear()
    fitted = json.loads(probe_again("d", split="train").summary_json.read_text())
    said = "--split train scores the split the probes were fitted on"
    assert fitted["caveat"].startswith(said) and caplog.text.count(said) == 2


def test_probe_runs_on_a_finetuned_checkpoint_and_refuses_bad_input(
    tiny_cache: tuple[Path, Path], tiny_finetuned: RunResult, tmp_path: Path
) -> None:
    assert tiny_finetuned.best_checkpoint is not None
    args = ["probe", "--checkpoint", tiny_finetuned.best_checkpoint]
    args += ["--manifest", str(tiny_cache[0]), "--out", str(tmp_path / "ft")]
    assert main([*args, *FAST, "--epochs", "1"]) == 0
    assert json.loads((tmp_path / "ft" / "probe.json").read_text())["encoder"] == "finetuned"
    assert main([*args, "--lrs", "0"]) == 2
    assert main([*args, "--epochs", "0"]) == 2
    missing = ["probe", "--checkpoint", str(tmp_path / "nope.pt"), "--manifest", str(tiny_cache[0])]
    assert main(missing) == 2


def test_feature_key_follows_checkpoint_encoder_shape_and_volumes(
    tiny_cache: tuple[Path, Path],
) -> None:
    volumes = list(mf.load(tiny_cache[0]).split("val"))
    base = feature_key("sha256:a", "target", (8, 32, 32), volumes)
    assert base == feature_key("sha256:a", "target", (8, 32, 32), list(volumes))
    changed = [dataclasses.replace(volumes[0], checksum="sha256:other"), *volumes[1:]]
    others = [
        feature_key("sha256:b", "target", (8, 32, 32), volumes),
        feature_key("sha256:a", "context", (8, 32, 32), volumes),
        feature_key("sha256:a", "target", (8, 16, 16), volumes),
        feature_key("sha256:a", "target", (8, 32, 32), changed),
        feature_key("sha256:a", "target", (8, 32, 32), volumes[::-1]),
    ]
    assert base not in others and len(set(others)) == len(others)


@pytest.mark.parametrize("bad", [(), (0.0,), (-1e-3,)])
def test_probe_settings_refuse_bad_grids(bad: tuple[float, ...]) -> None:
    with pytest.raises(ConfigError, match="--lrs"):
        ProbeSettings(lrs=bad)


def test_probe_chooses_its_learning_rate_and_epoch_on_validation_never_on_the_test_split(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    # Features written into the cache by hand: train and val separable, the test split the
    # same tokens with every label moved to the next class. A head chosen on validation scores
    # its recorded validation accuracy on val; one chosen on test would record test's score.
    args = ["probe", "--checkpoint", tiny_pretrained, "--manifest", str(tiny_cache[0])]
    features = tmp_path / "features"
    assert main([*args, "--out", str(tmp_path / "a"), "--feature-cache", str(features), *FAST]) == 0
    classes = len(mf.load(tiny_cache[0]).classes)
    gen = torch.Generator().manual_seed(0)
    for path in features.glob("*.pt"):
        saved = torch.load(path, weights_only=False)
        n, tokens, dim = saved["tokens"].shape
        labels = torch.arange(n) % classes
        centres = 4.0 * torch.eye(classes, dim)
        noise = 0.1 * torch.randn(n, tokens, dim, generator=gen)
        saved["tokens"] = (centres[labels][:, None, :] + noise).to(torch.float16)
        saved["labels"] = (labels + 1) % classes if path.name.startswith("test-") else labels
        torch.save(saved, path)
    result = run_probe(
        tiny_pretrained,
        str(tiny_cache[0]),
        out=str(tmp_path / "b"),
        feature_cache=str(features),
        device="cpu",
        settings=ProbeSettings(lrs=(1e-3, 3e-2), epochs=3),
        bootstrap=BootstrapSpec(resamples=100),
    )
    assert result.features_cached == {"train": True, "val": True, "test": True}
    (val_file,) = features.glob("val-*.pt")
    val = torch.load(val_file, weights_only=False)
    for kind, fit in result.fits.items():
        probs = predict_probs(fit.head, val["tokens"])
        cm = confusion_matrix(val["labels"].numpy(), probs.argmax(1).numpy(), classes)
        assert fit.chosen.val_balanced_accuracy == pytest.approx(balanced_accuracy(cm)), kind
        assert fit.chosen.val_balanced_accuracy > 0.9, kind
        best = max(p.val_balanced_accuracy for p in fit.grid)
        assert fit.chosen.val_balanced_accuracy == best, kind
