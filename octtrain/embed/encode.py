"""An item's embedding, the one definition that ``embed``, ``profile`` and ``probe`` share.

* **A Cell Painting field** (``field_views`` then ``tile_embeddings`` then ``field_embedding``):
  the field's views are its cells: a ``tile`` x ``tile`` crop (the crop size the encoder trained
  on, at native scale) centred on each nucleus (``data/nuclei.py``, the segmentation cp-measure's
  features use), moved inside the field where the nucleus is near its edge. A field where no
  nucleus is found (empty, out of focus) is described by its non-overlapping tiles instead
  (``field_tiles``). Centring the view on a cell, rather than cutting cells where a grid falls,
  is what single-cell profiles do (CellProfiler measures per cell); on the tuning twin it raised
  activity mAP for every encoder (DINO 0.594 -> 0.681 under JUMP's deep-learning recipe, 0.775
  -> 0.837 sphered; a random init 0.547 -> 0.661, 0.747 -> 0.814). Each view goes through the
  encoder in its 8 flips and quarter turns (a field has no up; training draws the same
  transforms), and a view's ("tile's") embedding is its CLS token, its mean patch token (with
  the CLS token, DINOv2's linear-evaluation features) and
  the spread (standard deviation) of its patch tokens, averaged over the transforms. An encoder
  that standardises each crop's channels over its own pixels (``model.input_norm: sample``)
  never sees a channel's brightness or spread, which carry the intensity phenotypes (a brighter
  membrane, a dimmer ER) and part of the size ones (more stained area): its tile embedding gets
  back what that normalisation took away, the tile's per-channel log mean and log standard
  deviation (``tile_stats``, ``2 x C`` features after the ``3D``; ``stats_restored``). The
  field's embedding is the mean of its views' embeddings, then their standard deviation
  (``2 x (3D [+ 2C])`` features): a field is a population of cells, and how its local
  descriptors and its cells vary is a phenotype the mean alone averages away (CellProfiler
  profiles carry it in per-object measurements). Measured on the tuning twin, sphered activity
  mAP 0.696 -> 0.775 for DINO and 0.556 -> 0.747 for a random init (the spreads are a texture
  description any encoder gains from), 0.598 -> 0.594 under JUMP's deep-learning recipe
  (``docs/cellpainting-evaluation.md``).
* **An OCT volume** (``pool_tokens``): the mean of the encoder's output tokens, what the linear
  probe reads (``eval/oct/probe_train.py``) and what RETFound-style users pool.

Several fields go through the encoder as one batch of views (``embed_fields``): a field is a
handful of cells, too few to keep a GPU busy alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from octtrain.data.cellpainting import scale
from octtrain.data.dataset import to_model_input
from octtrain.data.nuclei import crop_start, nucleus_centres, segment_nuclei
from octtrain.runtime.backend import Backend

STAT_EPS = 1.0 / 255.0  # one grey level of the uint8 field
# A field's views are at most its grid's tile count or this, whichever is more: a crop per
# nucleus of a 1,080 px JUMP field at the ViT-S/8's 224 px would be ~100 overlapping views
# against the grid's 16; the cap keeps the export's forwards where the grid's were.
MIN_VIEW_CAP = 16
# The definition's version per data kind, in every export's identity: a half-finished export
# of an earlier definition is refused, not resumed (its parts have other features). Cell
# Painting 2: the spreads (of the patch tokens, of the tiles) joined the means; 3: the views are
# crops centred on the cells, not a grid of tiles.
VERSIONS = {"cellpainting": 3, "oct": 1}


def field_tiles(field: np.ndarray, tile: int) -> np.ndarray:
    """The non-overlapping ``tile`` x ``tile`` tiles of a ``[C, Y, X]`` field, row by row, as
    ``[T, C, tile, tile]`` (a margin narrower than a tile is left out); ValueError when the
    field is smaller than one tile."""
    _, h, w = field.shape
    if h < tile or w < tile:
        raise ValueError(f"a field of {h}x{w} pixels holds no {tile}x{tile} tile")
    return np.stack(
        [
            field[:, y : y + tile, x : x + tile]
            for y in range(0, h - tile + 1, tile)
            for x in range(0, w - tile + 1, tile)
        ]
    )


def field_views(field: np.ndarray, tile: int) -> np.ndarray:
    """A ``[C, Y, X]`` field's views ``[V, C, tile, tile]``: a crop centred on each nucleus
    (moved inside the field at its edges; at most the grid's tile count or ``MIN_VIEW_CAP``
    nuclei, spread from the field's centre to its edge), or, when no nucleus is found, its
    tiles (``field_tiles``; the module docstring). ValueError when the field is smaller than
    one tile."""
    _, h, w = field.shape
    if h < tile or w < tile:
        raise ValueError(f"a field of {h}x{w} pixels holds no {tile}x{tile} tile")
    centres = nucleus_centres(segment_nuclei(field))
    if not len(centres):
        return field_tiles(field, tile)
    cap = max((h // tile) * (w // tile), MIN_VIEW_CAP)
    if len(centres) > cap:
        # Evenly spaced in distance from the field's centre: from the middle to the edge, and
        # the same nuclei when the field is turned (a raster order would change with the turn).
        distance = np.hypot(centres[:, 0] - (h - 1) / 2, centres[:, 1] - (w - 1) / 2)
        order = np.argsort(distance, kind="stable")
        centres = centres[order[np.rint(np.linspace(0, len(order) - 1, cap)).astype(int)]]
    # Symmetric under a flip (crop_start): a turned field gets the same views, turned, and the
    # same embedding.
    top, left = crop_start(centres[:, 0], tile, h), crop_start(centres[:, 1], tile, w)
    return np.stack([field[:, y : y + tile, x : x + tile] for y, x in zip(top, left, strict=True)])


def dihedral(tiles: torch.Tensor) -> list[torch.Tensor]:
    """The 8 flips and quarter turns of square tiles ``[N, C, S, S]`` (the identity first)."""
    turns = [torch.rot90(tiles, k, dims=(-2, -1)) for k in range(4)]
    return turns + [t.flip(-1) for t in turns]


def stats_restored(backbone: nn.Module) -> bool:
    """Whether ``backbone`` standardises each sample's channels over its own pixels, so that its
    embedding carries ``tile_stats`` (the module docstring)."""
    norm = getattr(backbone, "input_norm", None)
    return getattr(norm, "mode", None) == "sample"


def tile_stats(tiles: torch.Tensor) -> torch.Tensor:
    """``[N, 2C]``: each tile's per-channel log mean, then log standard deviation, of its pixels
    (``tiles`` in the model's [-1, 1] scale, taken to [0, 1]; ``STAT_EPS`` keeps a black or flat
    channel finite). A flip or a quarter turn leaves them as they are."""
    x = (tiles.float() + 1.0) / 2.0
    var, mean = torch.var_mean(x, dim=(-2, -1), correction=0)
    return torch.cat([torch.log(mean + STAT_EPS), torch.log(var.sqrt() + STAT_EPS)], dim=-1)


def tile_embeddings(backbone: nn.Module, tiles: torch.Tensor) -> torch.Tensor:
    """``[N, 3D]`` (``[N, 3D + 2C]`` with ``tile_stats``): each tile's CLS token, mean patch
    token and the per-dimension standard deviation of its patch tokens, concatenated, averaged
    over the tile's 8 flips and quarter turns (one forward per transform: memory of one tile
    batch)."""
    total = torch.zeros((), device=tiles.device)
    for view in dihedral(tiles):
        cls, patches = backbone(view)
        patches = patches.float()
        spread = patches.std(dim=1, correction=0)
        total = total + torch.cat([cls.float(), patches.mean(dim=1), spread], dim=-1)
    if stats_restored(backbone):
        return torch.cat([total / 8.0, tile_stats(tiles)], dim=-1)
    return total / 8.0


def field_embedding(per_tile: torch.Tensor) -> torch.Tensor:
    """A field's embedding from its views' ``[T, E]``: their mean, then their standard
    deviation (``[2E]``; a field of one view has a spread of 0)."""
    spread, mean = torch.std_mean(per_tile, dim=0, correction=0)
    return torch.cat([mean, spread])


def embedding_parts(width: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """The columns of a Cell Painting field embedding ``width`` wide, of an encoder whose
    ``stats_restored`` holds, that carry its tokens, and those that carry the restored per-crop
    statistics (``tile_stats``: the last ``2 x channels`` of each half, the mean's and the
    spread's). Scoring the two apart shows what the network adds to the statistics."""
    half, stats = width // 2, 2 * channels
    if width % 2 or half <= stats:
        raise ValueError(f"an embedding of {width} features holds no {stats} statistics a half")
    within = np.arange(width) % half
    columns = np.arange(width)
    return columns[within < half - stats], columns[within >= half - stats]


def embed_fields(
    backbone: nn.Module, tiles: Sequence[torch.Tensor], device: torch.device
) -> np.ndarray:
    """The embeddings ``[fields, 2E]`` (float32; ``field_embedding``) of fields given as their
    uint8 views (``field_views``), all views in one batch."""
    counts = [len(t) for t in tiles]
    batch = scale(torch.cat(list(tiles)).to(device))
    with torch.no_grad():
        per_tile = tile_embeddings(backbone, batch)
    rows = [field_embedding(part) for part in torch.split(per_tile, counts)]
    return torch.stack(rows).float().cpu().numpy()  # float32 under bf16 autocast too


def volume_tokens(encoder: nn.Module, batch: dict[str, Any], backend: Backend) -> torch.Tensor:
    """The encoder's tokens ``[N, T, D]`` of a batch of volumes (``image``, ``gain``, ``shift``
    as the loader gives them), under the backend's autocast."""
    image = {k: batch[k].to(backend.device) for k in ("image", "gain", "shift")}
    with torch.no_grad(), backend.autocast():
        tokens: torch.Tensor = encoder(to_model_input(image))
    return tokens


def pool_tokens(tokens: torch.Tensor) -> torch.Tensor:
    """A volume's embedding ``[N, D]`` from its encoder tokens ``[N, T, D]``: their mean."""
    return tokens.float().mean(dim=1)
