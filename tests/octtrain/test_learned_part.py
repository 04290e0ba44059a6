"""What the network adds, measured apart (issue 51): an embedding's token columns and its
restored statistics columns (``encode.embedding_parts``), the statistics the same whatever the
weights (``profile_run.network_parts``), the noise floor, and the family subsets of the scores
(``scores.subsets``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from octtrain.config.dino import DinoConfig
from octtrain.config.loader import load_config
from octtrain.embed.encode import (
    embedding_parts,
    field_embedding,
    stats_restored,
    tile_embeddings,
    tile_stats,
)
from octtrain.eval.cellpainting.profile_run import network_parts, noise_floor
from octtrain.eval.cellpainting.scores import paired_difference, profile_scores, subsets
from octtrain.models.dino import build_student
from tests.octtrain.cell_cache import WellField

CHANNELS = 5
DINO_TINY = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "dino-tiny.yaml"


def _backbone(seed: int, norm: str = "sample") -> torch.nn.Module:
    cfg = load_config(DinoConfig, DINO_TINY, [f"model.input_norm={norm}"])
    torch.manual_seed(seed)
    return build_student(cfg, CHANNELS).backbone.eval()


def _tiles(seed: int) -> torch.Tensor:
    return torch.rand((3, CHANNELS, 32, 32), generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _field(backbone: torch.nn.Module, tiles: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return field_embedding(tile_embeddings(backbone, tiles)).numpy().astype(np.float64)


def test_the_statistics_columns_are_the_crops_statistics_and_the_rest_the_tokens() -> None:
    backbone, tiles = _backbone(0), _tiles(1)
    assert stats_restored(backbone)
    x = _field(backbone, tiles)
    tokens, stats = embedding_parts(len(x), CHANNELS)
    assert len(tokens) + len(stats) == len(x) and not set(tokens) & set(stats)
    np.testing.assert_array_equal(x[stats], field_embedding(tile_stats(tiles)).numpy())
    # the token columns move with the weights; the statistics columns do not
    other = _field(_backbone(1), tiles)
    np.testing.assert_array_equal(other[stats], x[stats])
    assert not np.allclose(other[tokens], x[tokens])
    with pytest.raises(ValueError, match="holds no 10 statistics"):
        embedding_parts(21, CHANNELS)


def test_network_parts_split_every_encoder_and_none_without_restored_statistics() -> None:
    tiles = [_tiles(seed) for seed in range(4)]
    trained, random = _backbone(0), _backbone(5)
    features = {
        "dino": np.stack([_field(trained, t) for t in tiles]),
        "random_init_0": np.stack([_field(random, t) for t in tiles]),
    }
    parts = network_parts(features, trained, CHANNELS)
    assert set(parts) == {"dino_tokens", "random_init_0_tokens", "statistics"}
    tokens, stats = embedding_parts(features["dino"].shape[1], CHANNELS)
    np.testing.assert_array_equal(parts["dino_tokens"], features["dino"][:, tokens])
    np.testing.assert_array_equal(
        parts["random_init_0_tokens"], features["random_init_0"][:, tokens]
    )
    np.testing.assert_array_equal(parts["statistics"], features["random_init_0"][:, stats])
    # an encoder that standardises over the dataset restores nothing: its embedding is tokens
    plain = _backbone(0, "dataset")
    assert network_parts({"dino": np.stack([_field(plain, t) for t in tiles])}, plain, 5) == {}


def test_the_noise_floor_is_fixed_gaussian_features_of_the_width() -> None:
    floor = noise_floor(40, 12)
    assert floor.shape == (40, 12)
    np.testing.assert_array_equal(floor, noise_floor(40, 12))  # the same floor every run
    assert abs(float(floor.mean())) < 0.1 and 0.9 < float(floor.std()) < 1.1


def _screen() -> tuple[np.ndarray, list[WellField]]:
    """Three plates: DMSO in 4 wells, ``a`` and ``b`` (strong) and ``c`` (absent) in 2 each."""
    rng = np.random.default_rng(0)
    fields, rows = [], []
    for p in range(3):
        for w, pert in enumerate(["DMSO"] * 4 + ["a", "a", "b", "b", "c", "c"]):
            fields.append(WellField(f"P{p}", f"W{w:02d}", pert, pert == "DMSO"))
            centre = {"DMSO": 0.0, "a": 2.0, "b": -2.0, "c": 0.0}[pert]
            rows.append(centre * np.eye(6)[0] + rng.normal(0, 0.5, 6))
    return np.stack(rows), fields


def test_subsets_score_each_family_apart() -> None:
    assert subsets({"a", "b"}) == {"": None}
    assert subsets({"a", "b", "c"}, ["c", "x"], {"amount": ["a", "b"], "none": ["y"]}) == {
        "": None,
        "unseen_": ["c"],
        "amount_": ["a", "b"],
    }
    x, fields = _screen()
    families = {"amount": ["a", "b"], "learned": ["c"]}
    scored = profile_scores(x, fields, resamples=100, families=families)  # type: ignore[arg-type]
    ap = scored.retrieval.aps["activity"]
    assert ap is not None
    for family, ids in families.items():
        mine = ap[ap["perturbation"].isin(ids)]["average_precision"].mean()
        assert scored.metrics[f"{family}_activity_map"] == pytest.approx(mine)
    # the family that changes nothing sits below the one that does, and a paired difference of
    # an encoder with itself is 0 on every family's draws
    assert scored.metrics["learned_activity_map"] < scored.metrics["amount_activity_map"]
    same = paired_difference(scored, scored, "learned_activity")
    assert same.value == same.low == same.high == 0.0
