"""Well profiles and retrieval mAP (copairs) on known features, and ``profile_fields`` on a
DINO checkpoint of the tiny Cell Painting cache with its two baselines."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from octtrain.config.dino import DinoConfig
from octtrain.config.loader import load_config
from octtrain.eval.profile_run import field_embeddings, profile_fields, tile_embeddings
from octtrain.eval.profiles import WellKey, handcrafted_features, retrieval_map, well_profiles
from octtrain.models.vit2d import build_vit2d
from octtrain.runtime.backend import make_backend
from octtrain.train.dino import DinoJob
from octtrain.train.job import Settings
from octtrain.train.loop import Trainer
from tests.octtrain.cell_cache import synth_field, write_cell_cache

ROOT = Path(__file__).resolve().parents[2]
DINO_TINY = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"


def _wells(plates: int = 3) -> list[WellKey]:
    out = []
    for p in range(plates):
        for w, pert in enumerate(["DMSO", "DMSO", "a", "b"]):
            out.append(WellKey(f"P{p}", f"W{w}", pert, pert == "DMSO"))
    return out


def test_profiles_average_fields_and_centre_each_plate_on_its_controls() -> None:
    keys = [WellKey("P0", "W0", "DMSO", True)] * 2 + [WellKey("P0", "W1", "a", False)] * 2
    keys += [WellKey("P1", "W0", "DMSO", True), WellKey("P1", "W1", "a", False)]
    x = np.array([[1.0], [3.0], [5.0], [7.0], [100.0], [104.0]])  # plate 1 offset by ~100
    profiles, wells = well_profiles(x, keys)
    assert [w.well for w in wells] == ["W0", "W1", "W0", "W1"]
    assert profiles[0, 0] == pytest.approx(0.0, abs=1e-5)  # the control is the origin
    assert profiles[2, 0] == pytest.approx(0.0, abs=1e-5)
    assert profiles[1, 0] == pytest.approx(profiles[3, 0], rel=1e-5)  # plate effect gone


def test_map_is_high_when_replicates_separate_and_chance_when_they_do_not() -> None:
    wells = _wells()
    rng = np.random.default_rng(0)
    centres = {"DMSO": np.zeros(8), "a": np.eye(8)[0] * 5, "b": np.eye(8)[1] * 5}
    good = np.stack([centres[w.perturbation] + rng.normal(0, 0.3, 8) for w in wells])
    noise = rng.normal(0, 1, (len(wells), 8))
    separated, mixed = retrieval_map(good, wells), retrieval_map(noise, wells)
    assert separated["activity_map"] > 0.95 and separated["consistency_map"] > 0.95
    assert separated["activity_retrieved"] == 1.0
    assert mixed["activity_map"] < 0.8 and mixed["activity_retrieved"] < 1.0


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


def test_a_tile_embedding_is_cls_and_mean_patch_token_over_its_flips_and_turns() -> None:
    torch.manual_seed(0)
    backbone = build_vit2d("tiny", 5).eval()
    tiles = torch.rand(3, 5, 16, 16) * 2 - 1
    with torch.no_grad():
        emb = tile_embeddings(backbone, tiles)
        cls, _ = backbone(tiles)
        turned = tile_embeddings(backbone, torch.rot90(tiles, 1, dims=(-2, -1)).flip(-1))
    assert emb.shape == (3, 2 * backbone.embed_dim)
    # The patch half of the identity view is the mean patch token; the average differs from it.
    assert not torch.allclose(emb[:, : backbone.embed_dim], cls, atol=1e-4)
    assert torch.allclose(turned, emb, atol=1e-5)  # a tile's orientation does not matter


def test_a_field_embedding_does_not_depend_on_the_field_orientation() -> None:
    torch.manual_seed(0)
    backbone = build_vit2d("tiny", 5).eval()
    field = np.random.default_rng(0).integers(0, 256, (5, 64, 64), dtype=np.uint8)
    turned = np.ascontiguousarray(np.rot90(field, 1, axes=(1, 2))[:, :, ::-1])
    data = _Fields([field, turned])
    x = field_embeddings(backbone, data, 32, torch.device("cpu"))  # type: ignore[arg-type]
    assert x.shape == (2, 2 * backbone.embed_dim)
    np.testing.assert_allclose(x[0], x[1], atol=1e-5)


def test_profile_report_for_a_dino_checkpoint_and_its_baselines(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    fields = write_cell_cache(root, n=24)
    run = tmp_path / "run"
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={run}", "train.max_steps=2"])
    backend = make_backend("cpu")
    train = [f for f in fields if f.split == "train"]
    Trainer(DinoJob(cfg, train, root, backend), Settings.of(cfg), backend).run()  # type: ignore[arg-type]
    report = profile_fields(str(run / "checkpoints" / "step_00000002.pt"), fields, root)
    assert report["fields"] == 24 and report["perturbations"] == ["DMSO", "cmpd1"]
    assert set(report["encoders"]) == {"dino", "random_init", "handcrafted", "cp_measure"}
    for metrics in report["encoders"].values():
        assert metrics["wells"] == 12.0  # 3 plates x 4 wells
        assert 0.0 <= metrics["activity_map"] <= 1.0
    # The twin's perturbation is the nucleus size, which the handcrafted set measures.
    assert report["encoders"]["handcrafted"]["activity_map"] > 0.9
    assert report["encoders"]["handcrafted"]["well_probe_knn_balanced_accuracy"] == 1.0


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
    assert math.isnan(metrics["activity_map"]) and math.isnan(metrics["consistency_map"])
