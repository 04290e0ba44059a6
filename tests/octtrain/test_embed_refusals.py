"""What ``octtrain embed`` refuses before it reads a pixel (``items.check_items``: fields of
other channel counts, fields smaller than a tile; ``encoders.checkpoint_encoder``: an encoder
choice a DINO checkpoint does not have), and how a crowded field's views are chosen
(``encode.field_views``: spread from the field's centre to its edge)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from torch import nn

from octtrain.embed.encode import field_views
from octtrain.embed.encoders import Encoder, checkpoint_encoder
from octtrain.embed.items import check_items
from octtrain.errors import ConfigError, DataError


def _encoder(in_chans: int = 5, tile: int = 32) -> Encoder:
    return Encoder(nn.Identity(), "cellpainting", "teacher", 1, {}, in_chans, tile, None, None)


def _fields(*shapes: tuple[int, int, int]) -> list[SimpleNamespace]:
    return [SimpleNamespace(shape=shape, channels=None) for shape in shapes]


def test_a_field_of_another_channel_count_is_refused_naming_it() -> None:
    with pytest.raises(DataError, match="item 1 has 4 channels, the checkpoint's encoder reads 5"):
        check_items(_fields((5, 64, 64), (4, 64, 64)), _encoder(), "m.json")


def test_a_field_smaller_than_the_tile_is_refused_naming_it() -> None:
    with pytest.raises(DataError, match="item 0 is a 16x64 field, smaller than the encoder's 32"):
        check_items(_fields((5, 16, 64), (5, 64, 64)), _encoder(), "m.json")
    check_items(_fields((5, 32, 32)), _encoder(), "m.json")  # a field of one tile is fine


@pytest.mark.parametrize("which", ["target", "context"])
def test_a_dino_checkpoint_refuses_an_encoder_it_does_not_have(which: str) -> None:
    with pytest.raises(ConfigError, match=f"--encoder {which}: a DINO checkpoint has one encoder"):
        checkpoint_encoder({"kind": "dino"}, "run/step.pt", which)


def test_a_crowded_fields_views_reach_from_its_centre_to_its_edge() -> None:
    """36 nuclei on a 128 px field hold more views than its 16 tiles: the 16 kept are spread in
    distance from the centre, so a corner cell is seen (the nearest 16 would never reach it)."""
    field = np.zeros((2, 128, 128), np.uint8)
    yy, xx = np.mgrid[0:128, 0:128]
    for cy in range(14, 128, 20):
        for cx in range(14, 128, 20):
            field[0][(yy - cy) ** 2 + (xx - cx) ** 2 <= 16] = 220
    field[1][(yy - 114) ** 2 + (xx - 114) ** 2 <= 16] = 200  # the farthest corner cell's marker
    views = field_views(field, 32)
    assert len(views) == 16
    assert views[:, 1].max() == 200  # some view holds the corner cell
