"""Inputs and positions as the references do, and the alarm for targets that carry no image
(docs/learning-inputs.md): real models, real caches, real manifests."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from octstage import manifest as mf
from octtrain.config.dino import DinoConfig
from octtrain.config.loader import load_config, to_dict
from octtrain.config.pretrain import PretrainConfig
from octtrain.config.sections import ModelConfig
from octtrain.data.cellpainting import CellPaintingDataset, to_views
from octtrain.data.dataset import ManifestDataset, read_manifest, to_model_input
from octtrain.data.intensity import DEFAULT_UINT8, pooled
from octtrain.errors import CheckpointError, ConfigError
from octtrain.eval.cellpainting.profile_run import encoders
from octtrain.eval.common.collapse import blind_targets_alarm, sample_spread, target_entropies
from octtrain.eval.common.selection import EarlyStopping
from octtrain.models.classifier import encoder_from_state
from octtrain.models.dino import DinoStudent, build_student, make_teacher, teacher_outputs
from octtrain.models.dino_loss import teacher_probs
from octtrain.models.inputs import InputNorm, content_share
from octtrain.models.jepa import make_target
from octtrain.models.vit3d import ViT3D, encoder_from_config
from octtrain.runtime.backend import make_backend
from octtrain.train.dino import DinoJob
from octtrain.train.job import Settings
from octtrain.train.loop import Trainer
from octtrain.train.pretrain import PretrainJob, resolve, run_pretrain, settings
from tests.octtrain.cell_cache import CellField, write_cell_cache

ROOT = Path(__file__).resolve().parents[2]
DINO_TINY = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"
JEPA_TINY = ROOT / "configs" / "pretrain" / "tiny.yaml"
OCT = ModelConfig(preset="tiny", input_shape=(8, 32, 32), patch=(4, 8, 8))
LEGACY = {"input_norm": "none", "pos_embed": "sincos"}  # today's rule before this change
MARGIN, MIN_SPREAD = 0.03, 0.02  # ValidationConfig's defaults


@dataclasses.dataclass(frozen=True)
class Measured:
    intensity: mf.Intensity


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[CellField]]:
    root = tmp_path_factory.mktemp("cells")
    return root, write_cell_cache(root)


def _batch(
    root: Path, fields: list[CellField], cfg: DinoConfig, n: int = 8
) -> dict[str, torch.Tensor]:
    train = [f for f in fields if f.split == "train"]
    ds = CellPaintingDataset(train, root, cfg.crops, cfg.model.patch_size)
    items = [ds[(i, i)] for i in range(n)]
    keys = ("global", "local", "gain", "shift", "keep")
    batch = {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in keys}
    patches = (cfg.crops.global_size // cfg.model.patch_size) ** 2
    batch["masks"] = torch.zeros(len(items), 2, patches, dtype=torch.bool)  # no iBOT masking
    return batch


def _views(root: Path, fields: list[CellField], cfg: DinoConfig) -> tuple[torch.Tensor, ...]:
    return to_views(_batch(root, fields, cfg))


def _dino(cfg: DinoConfig, fields: list[CellField], blind: bool) -> DinoStudent:
    torch.manual_seed(0)
    student = build_student(cfg, 5)
    student.backbone.input_norm.set_stats(*pooled(fields, 5).to_input())
    if blind:  # an input-blind model: nothing of the image reaches a token
        student.backbone.patch_embed.weight.data.zero_()
        assert student.backbone.patch_embed.bias is not None
        student.backbone.patch_embed.bias.data.zero_()
    return make_teacher(student)


def _oct_batch(tiny_cache: tuple[Path, Path]) -> tuple[torch.Tensor, mf.Manifest]:
    manifest = mf.load(tiny_cache[0])
    ds = ManifestDataset(manifest, tiny_cache[1], "train")
    items = [ds[i] for i in range(16)]
    batch = {k: torch.stack([it[k] for it in items]) for k in ("image", "gain", "shift")}
    return to_model_input(batch), manifest


def _oct_encoder(manifest: mf.Manifest, blind: bool = False, **rule: str) -> ViT3D:
    torch.manual_seed(0)
    encoder = encoder_from_config(dataclasses.replace(OCT, **rule))
    encoder.input_norm.set_stats(*pooled(manifest.split("train"), 1).to_input())
    if blind:
        encoder.patch_embed.weight.data.zero_()
        assert encoder.patch_embed.bias is not None
        encoder.patch_embed.bias.data.zero_()
    return make_target(encoder)


# --- the content's share of a token at init ----------------------------------------------------


def test_the_image_is_most_of_a_2d_token_at_init_and_was_not_before(
    cells: tuple[Path, list[CellField]],
) -> None:
    root, fields = cells
    shares = {}
    for name, rule in (("new", {}), ("legacy", LEGACY)):
        cfg = load_config(DinoConfig, DINO_TINY, [f"model.{k}={v}" for k, v in rule.items()])
        views, _, _ = _views(root, fields, cfg)
        teacher = _dino(cfg, fields, blind=False)
        with torch.no_grad():
            shares[name] = content_share(teacher.backbone.embed(views))
    assert shares["new"] > 0.5, shares  # measured 0.94
    assert shares["legacy"] < 0.05, shares  # measured 0.009: positions swamped the image


def test_the_image_is_most_of_a_3d_token_at_init_and_was_not_before(
    tiny_cache: tuple[Path, Path],
) -> None:
    x, manifest = _oct_batch(tiny_cache)
    with torch.no_grad():
        new = content_share(_oct_encoder(manifest).embed(x))
        legacy = content_share(_oct_encoder(manifest, **LEGACY).embed(x))
    # The mean retina (layers at similar depths) is the same at a position for every volume,
    # so it counts against the share too: 0.57 measured, against 0.02 for the legacy rule.
    assert new > 0.3 and legacy < 0.05, (new, legacy)


# --- the input rule, option by option ------------------------------------------------------------


def test_dataset_norm_standardises_each_channel_with_the_manifest_statistics() -> None:
    rng = np.random.default_rng(0)
    arrays = [(rng.random((3, 16, 16)) * [[[40]], [[120]], [[250]]]).astype(np.uint8) for _ in "ab"]
    # Only an item's ``intensity`` is read: as build-cache measures it.
    items = [Measured(mf.Intensity.of(a, channels_first=True)) for a in arrays]
    stats = pooled(items, 3)
    whole = np.stack(arrays).transpose(1, 0, 2, 3).reshape(3, -1)
    assert stats.mean == pytest.approx(whole.mean(axis=1), abs=1e-3)
    assert stats.std == pytest.approx(whole.std(axis=1), abs=1e-3)
    norm = InputNorm(3, "dataset")
    norm.set_stats(*stats.to_input())
    x = torch.from_numpy(np.stack(arrays)).float() * (2 / 255) - 1
    z = norm(x)
    assert z.mean(dim=(0, 2, 3)).abs().max() < 1e-4
    assert (z.std(dim=(0, 2, 3), correction=0) - 1).abs().max() < 1e-3
    assert "mean" in norm.state_dict()  # the statistics travel with the weights


def test_sample_norm_removes_a_devices_gain_and_offset_and_zeroes_a_dropped_channel() -> None:
    norm = InputNorm(2, "sample")
    x = torch.rand(3, 2, 4, 8, 8) * 2 - 1
    looks = x * torch.tensor([0.5, 1.7, 1.1]).view(3, 1, 1, 1, 1) + 0.3  # per-volume gain/offset
    assert torch.allclose(norm(looks), norm(x), atol=1e-3)
    x[0, 1] = -0.4  # a constant (dropped) channel
    assert norm(x)[0, 1].abs().max() == 0
    assert torch.equal(InputNorm(2, "none")(x), x)  # the legacy [-1, 1] input


def test_per_crop_norm_cancels_the_crops_channel_jitter_so_the_config_refuses_it(
    cells: tuple[Path, list[CellField]],
) -> None:
    root, fields = cells
    cfg = load_config(DinoConfig, DINO_TINY, ["crops.channel_drop=0"])
    assert cfg.model.input_norm == "sample"  # the Cell Painting configs' rule
    batch = _batch(root, fields, cfg, 4)
    plain = to_views(batch)[0]
    batch["gain"] = 1 + (torch.rand(batch["gain"].shape) - 0.5)  # a +-25% gain per channel
    batch["shift"] = torch.rand(batch["shift"].shape) - 0.5
    jittered = to_views(batch)[0]
    norm = InputNorm(5, "sample")
    moved = (jittered - plain).abs().amax(dim=(2, 3))  # per crop and channel, input units
    seen = (norm(jittered) - norm(plain)).abs().amax(dim=(2, 3))  # in the channel's stds
    # The jitter moves the views by a large share of a channel's spread (input std ~0.15);
    # after the model's first op what is left is the variance floor's trace (SAMPLE_EPS),
    # visible only in a nearly flat channel of a crop.
    assert moved.mean() > 0.1 and moved.max() > 0.3
    assert seen.median() < 0.005 and seen.max() < 0.15, seen
    for key in ("crops.contrast=0.1", "crops.brightness=0.05"):
        with pytest.raises(ConfigError, match=r"no effect with model.input_norm: sample"):
            load_config(DinoConfig, DINO_TINY, [key])
        load_config(DinoConfig, DINO_TINY, [key, "model.input_norm=dataset"])  # acts there


def test_a_manifest_without_statistics_falls_back_to_the_legacy_scale_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="octtrain"):
        stats = pooled([object(), object()], 5)
    assert stats.items == 0 and stats.mean == (DEFAULT_UINT8[0],) * 5
    mean, std = stats.to_input()
    assert mean == [0.0] * 5 and std == [1.0] * 5  # the identity on [-1, 1]
    assert "records no intensity statistics" in caplog.text and "rebuild" in caplog.text


def test_the_manifest_records_intensity_and_older_manifests_still_load(
    tiny_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    data = json.loads(tiny_cache[0].read_text())
    assert set(data["volumes"][0]["intensity"]) == {"mean", "std"}
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(data, json.loads(mf.SCHEMA_PATH.read_text()))
    for v in data["volumes"]:
        del v["intensity"]  # as written before octstage measured it
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    jsonschema.validate(data, json.loads(mf.SCHEMA_PATH.read_text()))
    assert all(v.intensity is None for v in mf.load(old).volumes)


# --- old checkpoints -----------------------------------------------------------------------------


def test_an_encoder_saved_before_the_input_rule_loads_as_it_was_trained() -> None:
    torch.manual_seed(0)
    legacy_cfg = dataclasses.replace(OCT, **LEGACY)
    old = encoder_from_config(legacy_cfg).eval()
    saved = {k: v for k, v in to_dict(legacy_cfg).items() if k not in LEGACY}  # its config
    state = {"config": {"model": saved}, "target_encoder": old.state_dict()}
    encoder, cfg, _ = encoder_from_state(state, "old.pt", OCT, "target")
    assert (cfg.input_norm, cfg.pos_embed) == ("none", "sincos")
    x = torch.rand(2, 1, 8, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.equal(encoder.eval()(x), old(x))


def test_resuming_a_checkpoint_from_before_the_input_rule_is_refused_naming_it(
    tiny_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    def cfg(run: str, *extra: str) -> PretrainConfig:
        overrides = [f"data.manifest={tiny_cache[0]}", f"train.run_dir={tmp_path / run}"]
        return load_config(PretrainConfig, JEPA_TINY, [*overrides, "train.max_steps=1", *extra])

    run_pretrain(cfg("old", "model.input_norm=none", "model.pos_embed=sincos"))
    path = tmp_path / "old" / "checkpoints" / "step_00000001.pt"
    state: dict[str, Any] = torch.load(path, weights_only=False)
    for key in LEGACY:
        del state["config"]["model"][key]  # what the code before this change saved
    torch.save(state, path)
    with pytest.raises(CheckpointError) as exc:
        run_pretrain(cfg("new", f"checkpoint.resume={path}"))
    text = str(exc.value)
    assert str(path) in text and "input_norm" in text and "model.input_norm: none" in text
    resumed = run_pretrain(
        cfg(
            "legacy",
            f"checkpoint.resume={path}",
            "train.max_steps=2",
            *[f"model.{k}={v}" for k, v in LEGACY.items()],
        )
    )
    assert resumed.steps == 2  # the old rule, named in the config, resumes it


def test_a_dino_checkpoint_from_before_the_input_rule_profiles_as_it_was_trained(
    cells: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    root, fields = cells
    overrides = [
        f"train.run_dir={tmp_path / 'run'}",
        *(f"model.{k}={v}" for k, v in LEGACY.items()),
    ]
    cfg = load_config(DinoConfig, DINO_TINY, overrides)
    job = DinoJob(cfg, [f for f in fields if f.split == "train"], root, make_backend("cpu"))
    state = job.state(0)
    for key in LEGACY:
        del state["config"]["model"][key]  # what the code before this change saved
    path = tmp_path / "old.pt"
    torch.save(state, path)
    _, teacher, randoms = encoders(str(path), 5)
    for backbone in (teacher, *randoms):
        assert backbone.pos_embed is None and backbone.input_norm.mode == "none"
    x = torch.rand(2, 5, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.equal(teacher(x)[0], job.teacher.backbone.eval()(x)[0])


# --- the alarm for targets that carry no image -------------------------------------------------


@pytest.mark.parametrize("blind", [True, False])
def test_an_input_blind_dino_teacher_trips_the_alarm_and_a_healthy_one_does_not(
    cells: tuple[Path, list[CellField]], blind: bool
) -> None:
    root, fields = cells
    # The dataset rule: at init its healthy teacher clears the margin twice over (per-crop
    # standardisation, the tiny config's rule, gives 0.21 nats at init: clear, not twice).
    cfg = load_config(DinoConfig, DINO_TINY, ["model.input_norm=dataset"])
    views, _, masks = _views(root, fields, cfg)
    teacher = _dino(cfg, fields, blind)
    logits, _, _ = teacher_outputs(teacher, views, masks)
    probs = teacher_probs(logits, torch.zeros(logits.shape[1]), cfg.dino.warmup_teacher_temp)
    metrics = {k: float(v) for k, v in target_entropies(probs).items()}
    alarm = blind_targets_alarm(metrics, MARGIN, MIN_SPREAD)
    assert (alarm is not None) == blind, (metrics, alarm)
    if blind:
        assert metrics["train/teacher_entropy_gap"] == pytest.approx(0.0, abs=1e-5)
        assert "teacher's per-crop entropy" in alarm
    else:
        assert metrics["train/teacher_entropy_gap"] > 2 * MARGIN * math.log(64)


@pytest.mark.parametrize("blind", [True, False])
def test_an_input_blind_vjepa_target_trips_the_alarm_and_a_healthy_one_does_not(
    tiny_cache: tuple[Path, Path], blind: bool
) -> None:
    x, manifest = _oct_batch(tiny_cache)
    with torch.no_grad():
        tokens = _oct_encoder(manifest, blind=blind)(x)
    spread = float(sample_spread(tokens))
    alarm = blind_targets_alarm({"train/target_spread": spread}, MARGIN, MIN_SPREAD)
    assert (alarm is not None) == blind, spread  # measured: 0.0 blind, 0.76 healthy
    assert math.isnan(float(sample_spread(tokens[:1])))  # one sample: no verdict


def test_sample_spread_and_the_entropies_have_no_verdict_on_healthy_extremes() -> None:
    assert blind_targets_alarm({}, MARGIN, MIN_SPREAD) is None
    assert blind_targets_alarm({"train/target_spread": math.nan}, MARGIN, MIN_SPREAD) is None
    one_hot = torch.eye(8)  # every crop its own prototype: the image decides the target
    metrics = {k: float(v) for k, v in target_entropies(one_hot).items()}
    assert blind_targets_alarm(metrics, MARGIN, MIN_SPREAD) is None
    uniform = torch.full((8, 8), 1 / 8)
    metrics = {k: float(v) for k, v in target_entropies(uniform).items()}
    assert "uniform over the prototypes" in str(blind_targets_alarm(metrics, MARGIN, MIN_SPREAD))


def test_an_input_blind_dino_run_logs_the_alarm_loudly(
    cells: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    root, fields = cells
    run = tmp_path / "run"
    cfg = load_config(
        DinoConfig, DINO_TINY, [f"train.run_dir={run}", "logging.log_every=1", "train.max_steps=2"]
    )
    backend = make_backend("cpu")
    job = DinoJob(cfg, [f for f in fields if f.split == "train"], root, backend)
    for model in (job.raw, job.teacher):
        model.backbone.patch_embed.weight.data.zero_()
    job.teacher.backbone.patch_embed.bias.data.zero_()
    job.raw.backbone.patch_embed.bias.data.zero_()
    Trainer(job, Settings.of(cfg), backend).run()  # type: ignore[arg-type]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    alerts = [r for r in records if r.get("event") == "alert"]
    assert alerts and alerts[0]["title"] == "targets carry no image"
    assert "train, step 1" in alerts[0]["text"]
    logged = [r for r in records if "train/teacher_entropy_gap" in r]
    assert logged and logged[0]["train/teacher_entropy_gap"] == pytest.approx(0.0, abs=1e-4)


def test_an_input_blind_vjepa_run_logs_the_alarm_loudly(
    tiny_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    overrides = [f"data.manifest={tiny_cache[0]}", f"train.run_dir={run}", "logging.log_every=1"]
    cfg = load_config(PretrainConfig, JEPA_TINY, [*overrides, "train.max_steps=2"])
    manifest = read_manifest(cfg.data.manifest, "pretrain")
    cfg = resolve(cfg, manifest)
    backend = make_backend("cpu")
    job = PretrainJob(cfg, manifest, backend)
    for encoder in (job.raw.encoder, job.target):
        encoder.patch_embed.weight.data.zero_()
        assert encoder.patch_embed.bias is not None
        encoder.patch_embed.bias.data.zero_()
    Trainer(job, settings(cfg), backend).run()
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    alerts = [r for r in records if r.get("event") == "alert"]
    assert alerts and alerts[0]["title"] == "targets carry no image"
    assert "train, step 1" in alerts[0]["text"] and "target encoder" in alerts[0]["text"]
    spreads = [r["train/target_spread"] for r in records if "train/target_spread" in r]
    assert spreads and spreads[0] < 1e-4


def test_a_refused_validation_counts_against_patience_and_is_never_the_best() -> None:
    stop = EarlyStopping(patience=2, min_delta=0.0)
    assert stop.update(0.5)
    stop.refuse()
    assert stop.best == 0.5 and stop.bad == 1 and not stop.should_stop
    stop.refuse()
    assert stop.should_stop
