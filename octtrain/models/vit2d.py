"""The 2D ViT for C-channel fields (Cell Painting): per-channel input standardisation, Conv2d
patches, a CLS token, positions for whatever grid the crop gives (global and local crops share the
weights) and a learned mask token that replaces masked patches (iBOT).

Positions (``pos_embed``, models/inputs.py): ``learned`` is DINOv2's, a table for the
``pos_grid`` of the global crop initialised at std 0.02 and resized bicubically to any other grid;
``sincos`` the legacy fixed table at full scale (old checkpoints). ``input_norm`` is the first op.

``ViT2D.forward(x, masks)`` takes ``x [B, C, H, W]`` and optional ``masks [B, N]`` (True: the
patch is masked) and returns ``(cls [B, D], patches [B, N, D])`` after the final LayerNorm. The
blocks are the 3D encoder's (``models/vit3d.Block``), so the attention kernel is the same one,
with DINOv2's LayerScale on each residual branch where ``layerscale`` > 0 (``model.layerscale``);
``models/attention_maps.py`` reads the last block's attention through any wrapper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octtrain.config.dino import VIT2D_PRESETS
from octtrain.models.inputs import InputNorm, learned_positions
from octtrain.models.vit3d import Block, init_weights, rescale_blocks, run_blocks


def sincos_2d(gh: int, gw: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """Fixed 2D sin-cos positions ``[gh * gw, dim]`` (half the channels per axis); torch ops
    only, so a compiled graph folds it into a constant per crop size."""
    per_axis = 2 * (dim // 4)
    omega = 1.0 / 10000 ** (torch.arange(per_axis // 2, device=device) / (per_axis / 2))
    ys, xs = torch.meshgrid(
        torch.arange(gh, device=device), torch.arange(gw, device=device), indexing="ij"
    )
    parts = []
    for c in (ys, xs):
        angles = c.reshape(-1, 1).float() * omega[None, :]
        parts += [angles.sin(), angles.cos()]
    emb = torch.cat(parts, dim=1)
    return torch.nn.functional.pad(emb, (0, dim - emb.shape[1]))


class ViT2D(nn.Module):
    """ViT over ``in_chans``-channel images; ``blocks`` is public for the attention reader."""

    def __init__(
        self,
        in_chans: int,
        patch: int,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        attention: str = "auto",
        input_norm: str = "dataset",
        pos_embed: str = "learned",
        pos_grid: int = 14,
        layerscale: float = 0.0,
    ) -> None:
        super().__init__()
        self.in_chans, self.patch, self.embed_dim = in_chans, patch, embed_dim
        self.num_heads = num_heads
        self.input_norm = InputNorm(in_chans, input_norm)
        self.patch_embed = nn.Conv2d(in_chans, embed_dim, kernel_size=patch, stride=patch)
        if pos_embed not in ("learned", "sincos"):
            raise ValueError(f"pos_embed {pos_embed!r} is not 'learned' or 'sincos'")
        self.pos_grid = pos_grid
        learned = pos_embed == "learned"
        self.pos_embed = learned_positions(pos_grid**2, embed_dim) if learned else None
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        rates = [drop_path * i / max(1, depth - 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, r, attention, layerscale=layerscale)
            for r in rates
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.apply(_init)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=1e-6)
        rescale_blocks(self.blocks)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """Patch grid of an ``height x width`` input (both must be multiples of the patch)."""
        if height % self.patch or width % self.patch:
            raise ValueError(f"input {height}x{width} is not divisible by patch {self.patch}")
        return height // self.patch, width // self.patch

    def positions(self, gh: int, gw: int, device: torch.device) -> torch.Tensor:
        """Positions ``[gh * gw, D]`` of a ``gh x gw`` grid: the learned table (resized when the
        grid is not ``pos_grid``), or the legacy fixed sin-cos table."""
        if self.pos_embed is None:
            return sincos_2d(gh, gw, self.embed_dim, device)
        if (gh, gw) == (self.pos_grid, self.pos_grid):
            return self.pos_embed[0]
        g, d = self.pos_grid, self.embed_dim
        table = self.pos_embed.reshape(1, g, g, d).permute(0, 3, 1, 2)
        resized = F.interpolate(table, size=(gh, gw), mode="bicubic", align_corners=False)
        return resized.permute(0, 2, 3, 1).reshape(gh * gw, d)

    def embed(self, x: torch.Tensor, masks: torch.Tensor | None = None) -> torch.Tensor:
        """Patch tokens ``[B, N, D]`` with positions (masked ones replaced), before the CLS
        token and the blocks."""
        gh, gw = self.grid(x.shape[-2], x.shape[-1])
        tokens: torch.Tensor = self.patch_embed(self.input_norm(x)).flatten(2).transpose(1, 2)
        if masks is not None:
            # torch.where keeps mask_token in the graph even when nothing is masked (DDP needs
            # every parameter to receive a gradient, zero or not).
            tokens = torch.where(masks[..., None], self.mask_token.to(tokens.dtype), tokens)
        return tokens + self.positions(gh, gw, tokens.device).to(tokens.dtype)[None]

    def forward(
        self, x: torch.Tensor, masks: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.embed(x, masks)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1).to(tokens.dtype)
        out = self.norm(run_blocks(self.blocks, torch.cat([cls, tokens], dim=1), False))
        return out[:, 0], out[:, 1:]


def _init(module: nn.Module) -> None:
    if isinstance(module, nn.Conv2d):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    else:
        init_weights(module)


def build_vit2d(
    preset: str,
    in_chans: int,
    *,
    patch: int | None = None,
    embed_dim: int | None = None,
    depth: int | None = None,
    num_heads: int | None = None,
    mlp_ratio: float = 4.0,
    drop_path: float = 0.0,
    attention: str = "auto",
    input_norm: str = "dataset",
    pos_embed: str = "learned",
    crop: int = 224,
    layerscale: float | None = None,
) -> ViT2D:
    """A named preset, any of its sizes overridden (``layerscale`` None: the preset's); a
    learned position table is sized for ``crop`` x ``crop`` inputs (the global crop)."""
    p = VIT2D_PRESETS[preset]
    size = patch or p.patch
    return ViT2D(
        in_chans,
        size,
        embed_dim or p.embed_dim,
        depth or p.depth,
        num_heads or p.num_heads,
        mlp_ratio,
        drop_path,
        attention,
        input_norm,
        pos_embed,
        max(1, crop // size),
        p.layerscale if layerscale is None else layerscale,
    )
