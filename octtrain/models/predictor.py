"""The V-JEPA predictor: a narrow transformer that fills masked positions from context tokens.

Context tokens ``[B, Nc, D]`` are projected to the predictor width, given their positions; one
learned mask token per target position (plus that position's embedding) is appended; after the
blocks, the target slots are projected back to the encoder width: ``[B, K, D]``. The attention
kernel and activation checkpointing follow the ModelConfig, as in the encoder.
"""

from __future__ import annotations

import torch
from torch import nn

from octtrain.config.sections import ModelConfig
from octtrain.models.vit3d import (
    Block,
    gather_tokens,
    init_weights,
    rescale_blocks,
    run_blocks,
    sincos_3d,
)


class Predictor(nn.Module):
    pos_embed: torch.Tensor

    def __init__(
        self,
        grid: tuple[int, int, int],
        embed_dim: int,
        pred_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        attention: str = "auto",
        attention_block: int = 1024,
        checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.embed = nn.Linear(embed_dim, pred_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, pred_dim))
        self.register_buffer("pos_embed", sincos_3d(grid, pred_dim)[None], persistent=False)
        self.blocks = nn.ModuleList(
            Block(pred_dim, num_heads, mlp_ratio, 0.0, attention, attention_block)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(pred_dim)
        self.proj = nn.Linear(pred_dim, embed_dim)
        self.apply(init_weights)
        rescale_blocks(self.blocks)
        # Zero, as in V-JEPA: every masked position starts as its position embedding alone.
        nn.init.zeros_(self.mask_token)

    def forward(
        self, context: torch.Tensor, context_idx: torch.Tensor, target_idx: torch.Tensor
    ) -> torch.Tensor:
        pos = self.pos_embed.expand(context.shape[0], -1, -1)
        ctx = self.embed(context) + gather_tokens(pos, context_idx)
        tgt = self.mask_token.expand(target_idx.shape[0], target_idx.shape[1], -1)
        tgt = tgt + gather_tokens(pos, target_idx)
        x = torch.cat([ctx, tgt], dim=1)
        x = run_blocks(self.blocks, x, self.checkpointing and self.training)
        return self.proj(self.norm(x[:, context.shape[1] :]))  # type: ignore[no-any-return]


def predictor_from_config(cfg: ModelConfig, grid: tuple[int, int, int]) -> Predictor:
    """The predictor a ModelConfig describes, for an encoder with patch grid ``grid``."""
    p = cfg.sizes()
    return Predictor(
        grid,
        p.embed_dim,
        p.pred_dim,
        p.pred_depth,
        p.pred_heads,
        cfg.mlp_ratio,
        cfg.attention,
        cfg.attention_block,
        cfg.activation_checkpointing,
    )
