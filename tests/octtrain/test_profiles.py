"""Well profiles (well means through JUMP's recipe) on known features, and ``profile_fields`` on
a DINO checkpoint of the tiny Cell Painting cache with its baselines, on held-out plates only."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from octstage.cellpainting.families import LEARNED, twin_families
from octtrain.config.dino import DinoConfig
from octtrain.config.loader import load_config
from octtrain.data.cellpainting import scale
from octtrain.embed.encode import (
    MIN_VIEW_CAP,
    dihedral,
    embed_fields,
    field_tiles,
    field_views,
    tile_embeddings,
)
from octtrain.errors import DataError
from octtrain.eval.cellpainting.profile_run import (
    encoders,
    field_embeddings,
    profile_fields,
)
from octtrain.eval.cellpainting.profiles import (
    WellKey,
    handcrafted_features,
    well_means,
    well_profiles,
)
from octtrain.eval.cellpainting.recipe import RecipeConfig
from octtrain.eval.cellpainting.retrieval import retrieval_map
from octtrain.models.vit2d import build_vit2d
from octtrain.runtime.backend import make_backend
from octtrain.train.dino import DinoJob
from octtrain.train.job import Settings
from octtrain.train.loop import Trainer
from tests.octtrain.cell_cache import synth_field, write_cell_cache

ROOT = Path(__file__).resolve().parents[2]
DINO_TINY = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"
LEARNED_ID = sorted(LEARNED)[0]


def test_well_means_average_each_well_s_fields_in_order_of_appearance() -> None:
    keys = [WellKey("P0", "W0", "DMSO", True)] * 2 + [WellKey("P0", "W1", "a", False)] * 2
    keys += [WellKey("P1", "W0", "DMSO", True), WellKey("P1", "W1", "a", False)]
    x = np.array([[1.0], [3.0], [5.0], [7.0], [100.0], [104.0]])
    means, wells = well_means(x, keys)
    assert [(w.plate, w.well) for w in wells] == [
        ("P0", "W0"),
        ("P0", "W1"),
        ("P1", "W0"),
        ("P1", "W1"),
    ]
    assert means[:, 0].tolist() == [2.0, 6.0, 100.0, 104.0]


def test_profiles_remove_a_plate_effect_through_each_plate_s_controls() -> None:
    rng = np.random.default_rng(0)
    perts = ["DMSO"] * 4 + ["a"] * 4 + ["b"] * 4
    base = rng.normal(size=(12, 6)) + np.array([[0.0] * 6] * 4 + [[2.0] * 6] * 4 + [[-2.0] * 6] * 4)
    keys, rows = [], []
    for plate, (gain, offset) in {"P0": (1.0, 0.0), "P1": (4.0, 50.0)}.items():
        for i, p in enumerate(perts):
            keys.append(WellKey(plate, f"W{i}", p, p == "DMSO"))
            rows.append(base[i] * gain + offset)
    off = RecipeConfig(corr_threshold=1.0, sphere=False)
    profiles, _ = well_profiles(np.array(rows), keys, off)
    assert profiles.shape[0] == 24
    # The same wells keep their order on both plates, and neither plate sits above the other
    # (ranked over all wells unscaled, plate P1's 50 offset would put all its wells on top).
    np.testing.assert_array_equal(
        np.argsort(profiles[:12], axis=0), np.argsort(profiles[12:], axis=0)
    )
    assert np.abs(profiles[:12].mean(axis=0) - profiles[12:].mean(axis=0)).max() < 0.1


def test_handcrafted_features_see_the_nucleus_size() -> None:
    rng = np.random.default_rng(1)
    small, large = synth_field(rng, 0, 5, 64), synth_field(rng, 1, 5, 64)
    fs, fl = handcrafted_features(small), handcrafted_features(large)
    assert fs.shape == fl.shape == (5 * 7 + 2,)
    assert fl[-1] > 2 * fs[-1]  # mean nucleus area: radius 6 vs 3


class _Field:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def read(self) -> np.ndarray:
        return self.array


class _Fields:
    """What ``field_embeddings`` reads of a dataset: its length and each field's array."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays)

    def open(self, index: int) -> _Field:
        return _Field(self.arrays[index])


def test_a_tile_embedding_is_cls_mean_and_spread_of_patch_tokens_over_its_flips_and_turns() -> None:
    torch.manual_seed(0)
    backbone = build_vit2d("tiny", 5).eval()
    d = backbone.embed_dim
    tiles = torch.rand(3, 5, 16, 16) * 2 - 1
    with torch.no_grad():
        emb = tile_embeddings(backbone, tiles)
        cls, patches = backbone(tiles)
        turned = tile_embeddings(backbone, torch.rot90(tiles, 1, dims=(-2, -1)).flip(-1))
        spreads = [backbone(v)[1].std(dim=1, correction=0) for v in dihedral(tiles)]
    assert emb.shape == (3, 3 * d)
    # The patch half of the identity view is the mean patch token; the average differs from it.
    assert not torch.allclose(emb[:, :d], cls, atol=1e-4)
    assert torch.allclose(turned, emb, atol=1e-5)  # a tile's orientation does not matter
    # The last third: the spread of the patch tokens, per dimension, over the 8 views.
    torch.testing.assert_close(emb[:, 2 * d :], torch.stack(spreads).mean(dim=0))
    assert not torch.allclose(emb[:, 2 * d :], patches.std(dim=1, correction=0), atol=1e-3)


def test_a_field_s_views_are_crops_centred_on_its_nuclei_kept_inside_the_field() -> None:
    field = np.zeros((5, 64, 64), np.uint8)
    field[0, 17:24, 17:24] = 200  # a nucleus centred at (20, 20)
    field[0, 33:40, 56:63] = 200  # one at (36, 59), near the right edge
    field[0, 55:62, 27:34] = 200  # one at (58, 30), near the bottom edge
    field[1] = np.arange(64, dtype=np.uint8)[:, None]  # rows and columns told apart
    field[2] = np.arange(64, dtype=np.uint8)[None, :]
    views = field_views(field, 16)
    assert views.shape == (3, 5, 16, 16)
    np.testing.assert_array_equal(views[0], field[:, 12:28, 12:28])  # centred
    np.testing.assert_array_equal(views[1], field[:, 28:44, 48:64])  # moved left, inside
    np.testing.assert_array_equal(views[2], field[:, 48:64, 22:38])  # moved up, inside


def test_a_crowded_field_s_views_are_capped_the_same_nuclei_however_it_is_turned() -> None:
    # 30 nuclei on a 96 px field of 32 px tiles (a grid of 9): MIN_VIEW_CAP views, from the
    # nucleus nearest the centre to the farthest, and the same ones, turned, for a turned field.
    rng = np.random.default_rng(3)
    field = np.zeros((5, 96, 96), np.uint8)
    field[1:] = rng.integers(0, 256, (4, 96, 96), dtype=np.uint8)
    spots = rng.choice(24 * 24, 30, replace=False)
    for y, x in zip(spots // 24 * 4, spots % 24 * 4, strict=True):
        field[0, y : y + 3, x : x + 3] = 200  # 3 x 3 nuclei, at least a pixel apart
    views = field_views(field, 32)
    assert views.shape == (MIN_VIEW_CAP, 5, 32, 32)
    turned = np.ascontiguousarray(np.rot90(field, 1, axes=(1, 2)))
    ours = sorted(np.rot90(v, 1, axes=(1, 2)).tobytes() for v in views)
    assert sorted(v.tobytes() for v in field_views(turned, 32)) == ours


def test_a_field_without_a_nucleus_is_described_by_its_tiles() -> None:
    blank = np.zeros((5, 64, 64), np.uint8)
    np.testing.assert_array_equal(field_views(blank, 32), field_tiles(blank, 32))
    with pytest.raises(ValueError, match="holds no 32x32 tile"):
        field_views(blank[:, :20], 32)


def test_a_field_embedding_is_the_mean_and_the_spread_of_its_tiles() -> None:
    # The first half is the tiles' mean, the second their spread: a field of two different
    # tiles has one, a field of one tile repeated has none.
    torch.manual_seed(0)
    backbone = build_vit2d("tiny", 5).eval()
    rng = np.random.default_rng(0)
    mixed = rng.integers(0, 256, (5, 32, 64), dtype=np.uint8)  # two different tiles
    same = np.concatenate([mixed[:, :, :32], mixed[:, :, :32]], axis=2)  # one tile, twice
    tiles = [torch.from_numpy(field_tiles(f, 32)) for f in (mixed, same)]
    x = embed_fields(backbone, tiles, torch.device("cpu"))
    with torch.no_grad():
        per_tile = tile_embeddings(backbone, scale(tiles[0])).numpy()
    e = per_tile.shape[1]
    assert x.shape == (2, 2 * e)
    np.testing.assert_allclose(x[0, :e], per_tile.mean(axis=0), atol=1e-4)
    np.testing.assert_allclose(x[0, e:], per_tile.std(axis=0), atol=1e-4)
    assert np.abs(x[1, e:]).max() < 1e-5  # one tile, no spread
    assert np.abs(x[0, e:]).max() > 0.01


def test_a_standardised_encoder_keeps_what_its_norm_removes() -> None:
    # A brighter AGP channel: per-crop standardisation removes the gain from the tokens, the
    # appended per-channel log mean and log sd keep it (intensity phenotypes live there).
    torch.manual_seed(0)
    backbone = build_vit2d("tiny", 5, input_norm="sample").eval()
    tiles01 = torch.rand(2, 5, 16, 16) * 0.5 + 0.1
    brighter = tiles01.clone()
    brighter[:, 1] *= 1.3
    with torch.no_grad():
        a, b = (tile_embeddings(backbone, t * 2 - 1) for t in (tiles01, brighter))
    d = 3 * backbone.embed_dim
    assert a.shape == (2, d + 2 * 5)
    torch.testing.assert_close(a[:, :d], b[:, :d], atol=2e-3, rtol=0)  # the tokens: no change
    moved = (b[:, d:] - a[:, d:]).abs().amax(dim=0)
    assert moved[1] == pytest.approx(math.log(1.3), abs=0.02)  # log mean of AGP, by log 1.3
    assert moved[6] > 0.2 and moved[[0, 2, 3, 4, 5, 7, 8, 9]].max() < 1e-6
    dataset_norm = build_vit2d("tiny", 5).eval()  # its tokens see intensity: nothing appended
    with torch.no_grad():
        assert tile_embeddings(dataset_norm, tiles01).shape == (2, d)


def test_a_field_embedding_does_not_depend_on_the_field_orientation() -> None:
    torch.manual_seed(0)
    backbone = build_vit2d("tiny", 5).eval()
    field = np.random.default_rng(0).integers(0, 256, (5, 64, 64), dtype=np.uint8)
    turned = np.ascontiguousarray(np.rot90(field, 1, axes=(1, 2))[:, :, ::-1])
    data = _Fields([field, turned])
    x = field_embeddings(backbone, data, 32, torch.device("cpu"))  # type: ignore[arg-type]
    assert x.shape == (2, 2 * 3 * backbone.embed_dim)
    np.testing.assert_allclose(x[0], x[1], atol=1e-5)


def test_profile_report_for_a_dino_checkpoint_and_its_baselines(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    # Plate P0 trains, P1 and P2 (8 fields each, in order) are held out.
    fields = write_cell_cache(root, n=24, splits=("train",) * 8 + ("val",) * 16)
    run = tmp_path / "run"
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={run}", "train.max_steps=2"])
    backend = make_backend("cpu")
    train = [f for f in fields if f.split == "train"]
    Trainer(DinoJob(cfg, train, root, backend), Settings.of(cfg), backend).run()  # type: ignore[arg-type]
    ckpt = str(run / "checkpoints" / "step_00000002.pt")
    report = profile_fields(ckpt, fields, root, resamples=200)
    assert report["plates"] == ["P1", "P2"] and report["perturbations"] == ["DMSO", "cmpd1"]
    assert report["fields"] == 16
    randoms = {"random_init_0", "random_init_1", "random_init_2"}
    tokens = {"dino_tokens"} | {f"{r}_tokens" for r in randoms}
    # the full embeddings, the tokens alone, the restored statistics alone, the noise floor
    parts = {"statistics", "noise_floor"}
    assert (
        set(report["encoders"]) == {"dino", "handcrafted", "cp_measure"} | randoms | tokens | parts
    )
    assert report["statistics_restored"] and report["families"] == {}
    for recipe in report["recipes"].values():
        assert recipe["floor"] == recipe["encoders"]["noise_floor"]
        assert set(recipe["dino_tokens_minus"]) == tokens - {"dino_tokens"} | parts
    # noise ranks nothing (with 2 wells a class a plate chance is high: 0.79 here), the nucleus
    # size does
    assert report["floor"]["activity_map"] < report["encoders"]["handcrafted"]["activity_map"]
    # DINO's tokens minus a random init's tokens: the two token sets' mAPs, paired
    enc, tokens_minus = report["encoders"], report["dino_tokens_minus"]
    for rival in ("random_init_1_tokens", "statistics"):
        gap = enc["dino_tokens"]["activity_map"] - enc[rival]["activity_map"]
        assert tokens_minus[rival]["activity"]["value"] == pytest.approx(gap)
    # the twin's families, as the bench passes them (twin_families of the treated ids), are
    # each scored apart
    twin = [
        dataclasses.replace(f, perturbation=LEARNED_ID) if f.perturbation == "cmpd1" else f
        for f in fields
    ]
    families = twin_families({f.perturbation for f in twin if not f.is_control})
    learned = profile_fields(ckpt, twin, root, resamples=20, random_seeds=1, families=families)
    assert learned["families"] == {"learned": [LEARNED_ID]}
    assert "learned_activity_map" in learned["encoders"]["dino_tokens"]
    assert len(set(report["random_seeds"])) == 3
    for metrics in report["encoders"].values():
        assert metrics["wells"] == 8.0  # 2 held-out plates x 4 wells
        assert 0.0 <= metrics["activity_map_low"] <= metrics["activity_map"]
        assert metrics["activity_map"] <= metrics["activity_map_high"] <= 1.0
    # Three seeds are three encoders, not one copied.
    _, _, backbones = encoders(ckpt, 5)
    firsts = [next(iter(b.parameters())).detach() for b in backbones]
    assert len(firsts) == 3 and not torch.equal(firsts[0], firsts[1])
    assert not torch.equal(firsts[1], firsts[2])
    # The twin's perturbation is the nucleus size, which the handcrafted set measures.
    assert report["encoders"]["handcrafted"]["activity_map"] > 0.9
    # JUMP's deep-learning recipe (no sphering) at the top, the sphered one beside it.
    assert report["recipe"] == "dl" and set(report["recipes"]) == {"dl", "sphered"}
    assert report["encoders"] == report["recipes"]["dl"]["encoders"]
    for name, sphered in (("dl", 0.0), ("sphered", 1.0)):
        assert report["recipes"][name]["encoders"]["dino"]["sphered"] == sphered
    assert set(report["dino_minus"]) == set(report["encoders"]) - {"dino"}
    diff = report["dino_minus"]["handcrafted"]["activity"]
    assert diff["low"] <= diff["value"] <= diff["high"]
    # The features that do not depend on the checkpoint are computed once for a bench's seeds:
    # a second call scores the cached ones (here: planted, so the report shows them used).
    fixed: dict[str, np.ndarray] = {}
    first = profile_fields(ckpt, fields, root, resamples=50, fixed=fixed)
    assert set(fixed) == {"handcrafted", "cp_measure"} and len(fixed["handcrafted"]) == 16
    for name in ("handcrafted", "dino"):
        assert first["encoders"][name]["activity_map"] == report["encoders"][name]["activity_map"]
    planted = {k: np.random.default_rng(1).normal(size=v.shape) for k, v in fixed.items()}
    again = profile_fields(ckpt, fields, root, resamples=50, fixed=dict(planted))
    assert again["encoders"]["handcrafted"]["activity_map"] < 0.9  # noise, not the nuclei
    with pytest.raises(ValueError, match="fixed features of other fields"):
        profile_fields(ckpt, fields, root, resamples=50, fixed={"handcrafted": np.zeros((3, 2))})


def test_profiling_refuses_a_checkpoint_s_own_training_plates(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    # Every plate has a training field: none is held out, even with "val" fields on them.
    fields = write_cell_cache(root, n=16)
    run = tmp_path / "run"
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={run}", "train.max_steps=1"])
    backend = make_backend("cpu")
    train = [f for f in fields if f.split == "train"]
    Trainer(DinoJob(cfg, train, root, backend), Settings.of(cfg), backend).run()  # type: ignore[arg-type]
    with pytest.raises(DataError, match="training split 'train'"):
        profile_fields(str(run / "checkpoints" / "step_00000001.pt"), fields, root)


@pytest.mark.parametrize(
    "wells",
    [
        [("A01", "DMSO", True), ("A02", "DMSO", True)],  # nothing treated
        [("A01", "c1", False), ("A02", "c1", False)],  # no control
        [("A01", "c1", False), ("A02", "DMSO", True)],  # no replicate well
    ],
)
def test_a_plate_without_pairs_to_rank_has_no_map_not_an_exception(
    wells: list[tuple[str, str, bool]],
) -> None:
    keys = [WellKey("P1", w, p, c) for w, p, c in wells for _ in range(2)]
    x = np.random.default_rng(0).normal(size=(len(keys), 5))
    profiles, kept = well_profiles(x, keys)
    metrics = retrieval_map(profiles, kept)
    assert math.isnan(metrics["activity_map"]) and math.isnan(metrics["distinctiveness_map"])
