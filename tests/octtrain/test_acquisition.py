"""Acquisition augmentations: each option changes the view as documented, none when off."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from octstage.manifest import load
from octtrain.config.acquisition import AcquisitionConfig
from octtrain.config.finetune import FinetuneConfig
from octtrain.config.loader import load_config
from octtrain.config.pretrain import PretrainConfig
from octtrain.config.sections import AugmentConfig
from octtrain.data.acquisition import (
    AcquisitionTransform,
    Look,
    TwoLookDataset,
    draw,
    make_transform,
    render,
    two_looks,
)
from octtrain.data.dataset import ManifestDataset, Transform
from octtrain.errors import ConfigError
from octtrain.runtime.backend import make_backend
from octtrain.train.finetune import FinetuneJob
from octtrain.train.pretrain import PretrainJob, resolve, run_pretrain

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
Cache = tuple[Path, Path]
ON = AcquisitionConfig(
    gain=(0.75, 1.33),
    gamma=(0.7, 1.5),
    speckle_looks=(4.0, 32.0),
    noise=(0.0, 10.0),
    axial_shift=0.15,
    tilt=0.1,
    lateral_scale=(0.8, 1.25),
)
NO_JITTER = AugmentConfig(random_crop=False, flip_w=0.0, brightness=0.0, contrast=0.0)


def flat(level: int, shape: tuple[int, int, int] = (8, 32, 32)) -> np.ndarray:
    return np.full(shape, level, dtype=np.uint8)


def rows(shape: tuple[int, int, int] = (4, 32, 24)) -> np.ndarray:
    """A dark volume whose row 10 of every B-scan is bright (a thin retinal layer)."""
    v = np.zeros(shape, dtype=np.uint8)
    v[:, 10] = 200
    return v


def bright_row(v: np.ndarray, column: int) -> int:
    return int(np.argmax(v[0, :, column]))


def test_every_option_off_is_the_identity() -> None:
    v = np.random.default_rng(0).integers(0, 256, (8, 32, 32), dtype=np.uint8)
    rng = np.random.default_rng(1)
    assert not AcquisitionConfig().enabled and not AcquisitionConfig(p=0.5).enabled
    assert draw(AcquisitionConfig(), 32, rng) == Look()
    assert render(v, Look(), rng) is v
    # The default config builds the plain Transform: no acquisition code on the path at all.
    assert type(make_transform((8, 32, 32), NO_JITTER, AcquisitionConfig())) is Transform
    # p = 0: the option ranges are set but no view gets a look.
    assert draw(AcquisitionConfig(p=0.0, gain=(2.0, 2.0)), 32, rng) == Look()


def test_gain_multiplies_the_signal() -> None:
    out = render(flat(100), Look(gain=1.3), np.random.default_rng(0))
    assert out.dtype == np.uint8 and np.all(out == 130)
    assert np.all(render(flat(250), Look(gain=1.3), np.random.default_rng(0)) == 255)  # clipped


def test_gamma_is_the_display_curve() -> None:
    v = np.arange(256, dtype=np.uint8).reshape(1, 16, 16)
    out = render(v, Look(gamma=2.0), np.random.default_rng(0)).astype(np.float64)
    expected = 255.0 * (np.arange(256) / 255.0) ** 2
    np.testing.assert_allclose(out.ravel(), expected, atol=0.51)
    assert out.ravel()[0] == 0 and out.ravel()[255] == 255  # black and white stay put


def test_speckle_is_multiplicative_with_mean_one_and_std_one_over_root_looks() -> None:
    for level in (40, 80):
        out = render(flat(level, (16, 64, 64)), Look(speckle_looks=16.0), np.random.default_rng(0))
        ratio = out.astype(np.float64) / level
        assert abs(ratio.mean() - 1.0) < 0.01
        assert abs(ratio.std() - 0.25) < 0.01  # 1 / sqrt(16), whatever the level
    assert np.all(render(flat(0), Look(speckle_looks=4.0), np.random.default_rng(0)) == 0)


def test_noise_is_additive_with_the_drawn_std() -> None:
    out = render(flat(128, (16, 64, 64)), Look(noise=10.0), np.random.default_rng(0))
    diff = out.astype(np.float64) - 128
    assert abs(diff.mean()) < 0.2 and abs(diff.std() - 10.0) < 0.2


def test_axial_shift_moves_the_retina_in_depth_with_edges_repeated() -> None:
    v = rows()
    down = render(v, Look(axial_shift=3.0), np.random.default_rng(0))
    up = render(v, Look(axial_shift=-4.0), np.random.default_rng(0))
    assert {bright_row(down, c) for c in range(24)} == {13}
    assert {bright_row(up, c) for c in range(24)} == {6}
    assert np.all(down[:, :13] == 0) and np.all(down[:, 14:] == 0)  # nothing wraps around
    half = render(v, Look(axial_shift=0.5), np.random.default_rng(0))
    assert half[0, 10, 0] == half[0, 11, 0] == 100  # sub-row shifts interpolate


def test_tilt_shifts_depth_linearly_across_the_bscan() -> None:
    out = render(rows(), Look(tilt=4.0), np.random.default_rng(0))
    assert bright_row(out, 0) == 8 and bright_row(out, 23) == 12  # -tilt/2 .. +tilt/2
    depths = [bright_row(out, c) for c in range(24)]
    assert depths == sorted(depths)  # one slope, not a shuffle


def test_lateral_scale_resamples_the_ascan_axis_about_the_centre() -> None:
    v = np.zeros((2, 4, 33), dtype=np.uint8)
    v[:, :, 16] = 255  # the centre column
    v[:, :, 20] = 255  # 4 columns right of it
    out = render(v, Look(lateral_scale=2.0), np.random.default_rng(0))
    assert out[0, 0, 16] == 255 and out[0, 0, 24] == 255  # 4 columns became 8
    assert out[0, 0, 20] == 0
    shrunk = render(v, Look(lateral_scale=0.5), np.random.default_rng(0))
    assert shrunk[0, 0, 18] == 255 and shrunk[0, 0, 20] == 0  # ... or 2


def test_draws_stay_in_their_ranges_and_p_is_the_share_of_changed_views() -> None:
    rng = np.random.default_rng(0)
    looks = [draw(ON, 40, rng) for _ in range(400)]
    assert all(0.75 <= x.gain <= 1.33 and 0.7 <= x.gamma <= 1.5 for x in looks)
    assert all(4 <= x.speckle_looks <= 32 and 0 <= x.noise <= 10 for x in looks)
    assert all(abs(x.axial_shift) <= 0.15 * 40 and abs(x.tilt) <= 0.1 * 40 for x in looks)
    assert all(0.8 <= x.lateral_scale <= 1.25 for x in looks)
    assert min(x.gamma for x in looks) < 0.75 and max(x.gamma for x in looks) > 1.4
    half = AcquisitionConfig(p=0.5, gain=(1.5, 2.0))
    changed = sum(draw(half, 40, rng) != Look() for _ in range(400))
    assert 160 < changed < 240


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"p": 1.5}, "p must be a probability"),
        ({"gain": (1.2, 0.8)}, "gain must satisfy"),
        ({"gain": (0.0, 1.0)}, "gain must satisfy"),
        ({"gamma": (0.05, 1.0)}, "gamma must satisfy"),
        ({"speckle_looks": (0.5, 4.0)}, "speckle_looks must be"),
        ({"speckle_looks": (8.0, 4.0)}, "speckle_looks must be"),
        ({"noise": (-1.0, 4.0)}, "noise must satisfy"),
        ({"axial_shift": 0.8}, "axial_shift must be in"),
        ({"tilt": -0.1}, "tilt must be in"),
        ({"lateral_scale": (0.1, 1.0)}, "lateral_scale must satisfy"),
    ],
)
def test_out_of_range_options_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AcquisitionConfig(**overrides)  # type: ignore[arg-type]


def test_views_are_keyed_by_seed_and_validation_items_untouched(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    manifest = load(manifest_path)
    plain = ManifestDataset(manifest, cache, "train", Transform((8, 32, 32), NO_JITTER))
    acquired = ManifestDataset(
        manifest, cache, "train", AcquisitionTransform((8, 32, 32), NO_JITTER, ON)
    )
    a, b, c = acquired[(0, 1)], acquired[(0, 1)], acquired[(0, 2)]
    assert a["image"].dtype == torch.uint8 and a["image"].shape == (1, 8, 32, 32)
    assert torch.equal(a["image"], b["image"]) and not torch.equal(a["image"], c["image"])
    assert not torch.equal(a["image"], plain[(0, 1)]["image"])
    assert torch.equal(acquired[0]["image"], plain[0]["image"])  # no seed: evaluation view


def test_pretraining_and_finetuning_views_get_the_configured_looks(
    tiny_cache: Cache, tmp_path: Path
) -> None:
    sets = [f"acquisition.{k}" for k in ("gain=[0.75,1.33]", "noise=[0,10]", "axial_shift=0.1")]
    common = [f"data.manifest={tiny_cache[0]}", f"train.run_dir={tmp_path}", *sets]
    pre = load_config(PretrainConfig, CONFIGS / "pretrain" / "tiny.yaml", common)
    assert pre.acquisition == AcquisitionConfig(gain=(0.75, 1.33), noise=(0, 10), axial_shift=0.1)
    manifest = load(tiny_cache[0])
    backend = make_backend("cpu", "fp32")
    job = PretrainJob(resolve(pre, manifest), manifest, backend)
    assert isinstance(job.train_set.transform, AcquisitionTransform)
    assert type(job.val_set.transform) is Transform
    fine = load_config(
        FinetuneConfig, CONFIGS / "finetune" / "tiny.yaml", [*common, "init_encoder=random"]
    )
    assert fine.acquisition == pre.acquisition
    tuning = FinetuneJob(fine, manifest, None, backend)
    assert isinstance(tuning.train_set.transform, AcquisitionTransform)
    assert type(tuning.val_set.transform) is Transform
    off = load_config(PretrainConfig, CONFIGS / "pretrain" / "tiny.yaml", common[:2])
    assert not off.acquisition.enabled  # the tiny configs keep tests as they were


def test_two_looks_share_the_geometry_and_differ_in_intensity() -> None:
    # Gain and curve only (monotone: the brightest row stays the brightest), so the geometry shows.
    cfg = AcquisitionConfig(gain=(0.75, 1.33), gamma=(0.7, 1.5), axial_shift=0.15, two_looks=True)
    context, target = two_looks(rows(), cfg, np.random.default_rng(3))
    assert context.shape == target.shape == (4, 32, 24) and context.dtype == np.uint8
    where = [bright_row(context, c) for c in range(24)]
    assert where == [bright_row(target, c) for c in range(24)]  # the same voxels ...
    assert where != [10] * 24  # ... moved together
    assert not np.array_equal(context, target)  # ... with two intensity looks


def test_two_look_items_carry_the_targets_view(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    cfg = dataclasses.replace(ON, two_looks=True)
    transform = AcquisitionTransform((8, 32, 32), NO_JITTER, cfg)
    ds = TwoLookDataset(load(manifest_path), cache, "train", transform)
    item = ds[(0, 1)]
    assert item["image"].shape == item["target_image"].shape == (1, 8, 32, 32)
    assert item["target_image"].dtype == torch.uint8
    assert not torch.equal(item["image"], item["target_image"])
    plain = ds[0]  # evaluation: one view, twice
    assert torch.equal(plain["image"], plain["target_image"])
    batch = torch.utils.data.default_collate([ds[(i, i)] for i in range(3)])
    assert batch["target_image"].shape == (3, 1, 8, 32, 32)


def test_two_looks_are_refused_without_an_intensity_option_and_in_finetuning(
    tiny_cache: Cache, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="two_looks needs at least one intensity option"):
        AcquisitionConfig(axial_shift=0.1, two_looks=True)
    with pytest.raises(ConfigError, match="two_looks is for pretraining"):
        load_config(
            FinetuneConfig,
            CONFIGS / "finetune" / "tiny.yaml",
            [
                f"data.manifest={tiny_cache[0]}",
                "acquisition.gain=[0.8,1.2]",
                "acquisition.two_looks=true",
            ],
        )


def test_a_two_look_pretraining_run_trains(tiny_cache: Cache, tmp_path: Path) -> None:
    cfg = load_config(
        PretrainConfig,
        CONFIGS / "pretrain" / "tiny.yaml",
        [
            f"data.manifest={tiny_cache[0]}",
            f"train.run_dir={tmp_path / 'run'}",
            "train.max_steps=4",
            "checkpoint.every=4",
            "validation.every=0",
            *(f"acquisition.{o}" for o in ("gain=[0.75,1.33]", "speckle_looks=[4,32]")),
            "acquisition.two_looks=true",
        ],
    )
    result = run_pretrain(cfg)
    assert result.steps == 4 and result.last_loss is not None and math.isfinite(result.last_loss)


def test_the_target_encoder_reads_the_second_look(tiny_cache: Cache, tmp_path: Path) -> None:
    overrides = [
        f"data.manifest={tiny_cache[0]}",
        f"train.run_dir={tmp_path}",
        "acquisition.gain=[0.75,1.33]",
        "acquisition.two_looks=true",
    ]
    cfg = load_config(PretrainConfig, CONFIGS / "pretrain" / "tiny.yaml", overrides)
    manifest = load(tiny_cache[0])
    cfg = resolve(cfg, manifest)
    backend = make_backend("cpu", "fp32")
    data = PretrainJob(cfg, manifest, backend).train_set
    batch = torch.utils.data.default_collate([data[(i, i)] for i in range(4)])
    inverted = {**batch, "target_image": 255 - batch["target_image"]}
    losses = [
        float(PretrainJob(cfg, manifest, backend).train_step(b, 0).loss) for b in (batch, inverted)
    ]
    assert losses[0] != losses[1]
