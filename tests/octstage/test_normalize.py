"""Normalization and resizing as pure functions, against independent numpy references."""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from octstage.cachebuild.normalize import (
    MIN_SAMPLE,
    axis_weights,
    histogram_percentiles,
    intensity_lut,
    normalize_volume,
    resize_volume,
    sample_strides,
    scaled_spacing,
)


def retina_like(shape: tuple[int, int, int], seed: int = 0) -> npt.NDArray[np.uint8]:
    """Bright layers on a dark background with multiplicative speckle, like an OCT B-scan stack."""
    rng = np.random.default_rng(seed)
    rows = shape[1]
    depth = np.linspace(0.0, 1.0, rows)[None, :, None]
    layers = 30 + 120 * np.exp(-(((depth - 0.45) / 0.05) ** 2)) + 80 * (np.abs(depth - 0.6) < 0.04)
    speckle = rng.gamma(4.0, 0.25, size=shape)
    return np.clip(layers * speckle, 0, 255).astype(np.uint8)


def area_reference(
    volume: npt.NDArray[np.float64], shape: tuple[int, int, int]
) -> npt.NDArray[np.float64]:
    """True area averaging: repeat every voxel to a common multiple, then average blocks."""
    out = volume
    for axis, n_out in enumerate(shape):
        n_in = out.shape[axis]
        rep = n_out // np.gcd(n_in, n_out)
        fine = np.repeat(out, rep, axis=axis)
        block = n_in * rep // n_out
        new_shape = [*fine.shape[:axis], n_out, block, *fine.shape[axis + 1 :]]
        out = fine.reshape(new_shape).mean(axis=axis + 1)
    return out


@pytest.mark.parametrize("p", [(1.0, 99.0), (0.5, 99.5), (2.5, 97.3), (0.0, 100.0)])
def test_histogram_percentiles_equal_numpy_on_the_subsample(p: tuple[float, float]) -> None:
    vol = retina_like((64, 512, 256), seed=3)
    a, b, c = sample_strides(vol.shape, (2, 4, 4))
    assert (a, b, c) != (1, 1, 1)  # a strided sample, not the whole volume
    got = histogram_percentiles(vol, p[0], p[1], (2, 4, 4))
    want = np.percentile(vol[::a, ::b, ::c], p)
    np.testing.assert_allclose(got, want, atol=1e-9)


@pytest.mark.parametrize("p", [(1.0, 99.0), (0.5, 99.5)])
def test_a_small_volume_is_taken_whole(p: tuple[float, float]) -> None:
    """13x84x49 (53,508 voxels): a (2,4,4) stride would keep ~1,900 and miss what sits between
    its rows; the percentiles must be the whole volume's."""
    vol = retina_like((13, 84, 49), seed=4)
    vol[:, 1::4, :] = np.maximum(vol[:, 1::4, :], 250)  # bright rows the stride steps over
    assert sample_strides(vol.shape, (2, 4, 4)) == (1, 1, 1)
    got = histogram_percentiles(vol, p[0], p[1], (2, 4, 4))
    np.testing.assert_allclose(got, np.percentile(vol, p), atol=1e-9)


def test_strides_shrink_only_as_far_as_the_minimum_sample() -> None:
    shape = (61, 496, 768)  # Spectralis: (2,4,4) holds 0.73 M voxels
    strides = sample_strides(shape, (2, 4, 4))
    held = np.prod([-(-n // s) for n, s in zip(shape, strides, strict=True)])
    assert held >= MIN_SAMPLE and strides != (1, 1, 1)
    assert sample_strides((200, 1024, 512), (2, 4, 4)) == (2, 4, 4)  # already enough


def test_subsample_percentiles_within_one_grey_level_of_full_volume() -> None:
    vol = retina_like((61, 496, 768), seed=1)
    low, high = histogram_percentiles(vol, 1.0, 99.0, (2, 4, 4))
    full_low, full_high = np.percentile(vol, [1.0, 99.0])
    assert abs(low - full_low) <= 1.0
    assert abs(high - full_high) <= 1.0
    assert high - low > 50  # a meaningful range, not a degenerate pass


def production_like(shape: tuple[int, int, int], seed: int = 0) -> npt.NDArray[np.uint8]:
    """Curved bright layers whose depth and brightness drift across B-scans, with exponential
    speckle over a floor; one B-scan at a time in float32, so 105 M voxels take a few seconds."""
    frames, rows, columns = shape
    rng = np.random.default_rng(seed)
    out = np.empty(shape, np.uint8)
    depth = np.linspace(0.0, 1.0, rows, dtype=np.float32)[:, None]
    sway = np.sin(np.linspace(0.0, np.pi, columns, dtype=np.float32))[None, :]
    for i in range(frames):
        centre = 0.4 + 0.1 * sway * np.float32(np.cos(i / 60))
        layers = 20 + 100 * np.exp(-(((depth - centre) / 0.04) ** 2))
        layers += 60 * (np.abs(depth - centre - 0.15) < 0.03)
        speckle = 1.0 - rng.random((rows, columns), dtype=np.float32)  # (0, 1]
        np.log(speckle, out=speckle)
        speckle *= -0.6 * layers * np.float32(0.8 + 0.4 * i / frames)
        speckle += 0.4 * layers
        out[i] = np.clip(speckle, 0, 255)
    return out


def test_percentiles_at_the_production_shape_stay_within_one_grey_level() -> None:
    """200x1024x512 (105 M voxels): the configured (2,4,4) stride already holds 3.3 M, so the
    sample (and its cost) is what it was; p_low/p_high land within one grey level of numpy's
    exact percentiles of the whole volume."""
    shape = (200, 1024, 512)
    assert sample_strides(shape, (2, 4, 4)) == (2, 4, 4)
    vol = production_like(shape)
    for p in ((1.0, 99.0), (0.5, 99.5), (2.5, 97.5)):
        got = histogram_percentiles(vol, p[0], p[1], (2, 4, 4))
        want = np.percentile(vol, p)
        assert np.all(np.abs(np.asarray(got) - want) <= 1.0), (p, got, want)
        assert want[0] >= 3 and want[1] - want[0] > 100  # neither end pinned at 0 or 255


def test_histogram_percentiles_refuses_other_dtypes() -> None:
    with pytest.raises(ValueError, match="uint8"):
        histogram_percentiles(np.zeros((2, 2, 2), np.uint16), 1, 99)  # type: ignore[arg-type]


def test_intensity_lut_clips_and_stretches() -> None:
    lut = intensity_lut(10.0, 60.0)
    assert lut[0] == 0 and lut[10] == 0 and lut[60] == 255 and lut[255] == 255
    assert lut[35] == pytest.approx(127.5)
    flat = intensity_lut(7.0, 7.0)
    assert flat[7] == 0 and flat[8] == 255


@pytest.mark.parametrize(("n_in", "n_out"), [(61, 64), (128, 64), (512, 64), (10, 4), (7, 7)])
def test_axis_weights_sum_to_one_and_stay_in_range(n_in: int, n_out: int) -> None:
    for method in ("area", "linear"):
        weights = axis_weights(n_in, n_out, method)
        assert len(weights) == n_out
        for pairs in weights:
            assert sum(w for _, w in pairs) == pytest.approx(1.0)
            assert all(0 <= k < n_in for k, _ in pairs)


def test_area_weights_cover_every_source_frame_when_shrinking() -> None:
    used = {k for pairs in axis_weights(512, 64, "area") for k, _ in pairs}
    assert used == set(range(512))
    linear_used = {k for pairs in axis_weights(512, 64, "linear") for k, _ in pairs}
    assert len(linear_used) < 512 // 2  # linear skips frames: the aliasing area avoids


@pytest.mark.parametrize(
    ("src", "dst"),
    [((8, 64, 96), (4, 16, 24)), ((10, 15, 12), (4, 6, 8)), ((12, 40, 30), (3, 16, 12))],
)
def test_area_resize_matches_true_block_averaging(
    src: tuple[int, int, int], dst: tuple[int, int, int]
) -> None:
    vol = retina_like(src, seed=5)
    got = resize_volume(vol, dst, method="area")
    want = area_reference(vol.astype(np.float64), dst)
    assert got.dtype == np.uint8 and got.shape == dst
    assert np.abs(got.astype(np.float64) - want).max() <= 0.5 + 1e-3


def test_mixed_resize_averages_the_shrinking_axis() -> None:
    # Rows alternate 0/255: shrinking rows 40 -> 16 must average (values 40%/60% of 255), even
    # though columns grow at the same time (where OpenCV's INTER_AREA alone would not average).
    vol = np.zeros((4, 40, 10), np.uint8)
    vol[:, ::2, :] = 255
    area = resize_volume(vol, (4, 16, 30), method="area")
    assert area.min() >= 100 and area.max() <= 155
    linear = resize_volume(vol, (4, 16, 30), method="linear")
    assert linear.max() - linear.min() > 100  # the aliased alternative really differs
    one_pass = cv2.resize(vol[0].astype(np.float32), (30, 16), interpolation=cv2.INTER_AREA)
    assert one_pass.max() - one_pass.min() > 100  # why resize_plane splits a mixed resize


def test_depth_shrink_averages_frames() -> None:
    vol = np.zeros((40, 8, 8), np.uint8)
    vol[::2] = 255
    out = resize_volume(vol, (16, 8, 8), method="area")
    assert out.min() >= 100 and out.max() <= 155


def test_upsampling_is_linear_between_frames() -> None:
    vol = np.stack([np.full((4, 4), v, np.uint8) for v in (0, 100, 200)])
    out = resize_volume(vol, (6, 4, 4), method="area")
    np.testing.assert_array_equal(out[:, 0, 0], [0, 25, 75, 125, 175, 200])


def test_normalize_volume_clips_to_percentiles_and_records_them() -> None:
    vol = retina_like((16, 128, 128), seed=2)
    out, norm = normalize_volume(vol, (8, 32, 32), p_low=1.0, p_high=99.0, subsample=(1, 1, 1))
    low, high = np.percentile(vol, [1.0, 99.0])
    assert (norm.low, norm.high) == pytest.approx((low, high))
    assert (norm.p_low, norm.p_high) == (1.0, 99.0)
    assert out.shape == (8, 32, 32) and out.dtype == np.uint8
    # Same as stretching first with numpy and then area-averaging the float volume.
    stretched = np.clip((vol.astype(np.float64) - low) / (high - low), 0, 1) * 255
    want = area_reference(stretched, (8, 32, 32))
    assert np.abs(out.astype(np.float64) - want).max() <= 0.5 + 1e-2


def test_resize_volume_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="resize method"):
        resize_volume(np.zeros((2, 2, 2), np.uint8), (1, 1, 1), method="cubic")
    with pytest.raises(ValueError, match="3-D uint8"):
        resize_volume(np.zeros((2, 2), np.uint8), (1, 1, 1))


def test_scaled_spacing_keeps_the_physical_extent() -> None:
    spacing = scaled_spacing((0.12, 0.0039, 0.0115), (61, 496, 768), (64, 384, 384))
    assert spacing[0] * 64 == pytest.approx(0.12 * 61)
    assert spacing[1] * 384 == pytest.approx(0.0039 * 496)
    assert spacing[2] * 384 == pytest.approx(0.0115 * 768)
