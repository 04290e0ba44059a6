"""The 3D ViT encoder: Conv3d tubelet patches, positions, configurable attention.

``ViT3D.forward(x, keep_idx)`` embeds a volume ``x [B, 1, D, H, W]`` into ``N`` patch tokens and,
when ``keep_idx [B, M]`` is given, keeps only those tokens before the transformer (the V-JEPA
context encoder sees only unmasked patches). It returns ``[B, N or M, embed_dim]`` after a final
LayerNorm. Its first op standardises the input and its positions are learned (or the legacy
fixed sin-cos table): ``model.input_norm`` and ``model.pos_embed``, see models/inputs.py. Sizes
come from the named presets in ``octtrain.config.sections``; the attention kernel
from ``model.attention`` (models/attention.py). With ``checkpointing`` each block's activations are
recomputed in the backward pass instead of kept (``model.activation_checkpointing``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.utils.checkpoint
from torch import nn

from octtrain.config.sections import ModelConfig
from octtrain.models.attention import attend
from octtrain.models.inputs import InputNorm, learned_positions


def sincos_3d(grid: tuple[int, int, int], dim: int) -> torch.Tensor:
    """Fixed 3D sin-cos position embedding ``[N, dim]`` (a third of the channels per axis)."""
    per_axis = 2 * (dim // 6)
    coords = np.meshgrid(*[np.arange(g, dtype=np.float64) for g in grid], indexing="ij")
    parts = []
    for c in coords:
        omega = 1.0 / 10000 ** (np.arange(per_axis // 2, dtype=np.float64) / (per_axis / 2))
        angles = c.reshape(-1)[:, None] * omega[None, :]
        parts += [np.sin(angles), np.cos(angles)]
    emb = np.concatenate(parts, axis=1)
    pad = dim - emb.shape[1]  # channels left over when dim is not a multiple of 6 stay zero
    emb = np.pad(emb, ((0, 0), (0, pad)))
    return torch.from_numpy(emb).float()


def gather_tokens(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[b, idx[b]]`` for tokens ``x [B, N, D]`` and indices ``idx [B, M]``."""
    return torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch for a whole sample (fine-tuning regulariser)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class LayerScale(nn.Module):
    """A learned per-channel gain on a residual branch, starting at ``init`` (CaiT; DINOv2's
    ``layers/layer_scale.py``: 1e-5), so each block starts close to the identity."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma.to(x.dtype)


class Attention(nn.Module):
    """Multi-head self-attention; ``kind`` and ``block`` pick the kernel (models/attention.py)."""

    def __init__(self, dim: int, num_heads: int, kind: str = "auto", block: int = 1024) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed dim {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.kind = kind
        self.block = block
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = attend(q, k, v, self.kind, self.block)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))  # type: ignore[no-any-return]


class Block(nn.Module):
    """Pre-norm transformer block; with ``layerscale`` > 0 each branch is scaled by a
    ``LayerScale`` (``ls1``, ``ls2``: DINOv2's names) before drop path and the residual add."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        drop_path: float,
        attention: str = "auto",
        attention_block: int = 1024,
        layerscale: float = 0.0,
    ) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, attention, attention_block)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop_path = DropPath(drop_path)
        # Without LayerScale no parameter is added: the state dict keeps its keys.
        self.ls1: nn.Module = LayerScale(dim, layerscale) if layerscale > 0 else nn.Identity()
        self.ls2: nn.Module = LayerScale(dim, layerscale) if layerscale > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))  # type: ignore[no-any-return]


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, checkpointing: bool) -> torch.Tensor:
    """``x`` through ``blocks``; with ``checkpointing`` (and a graph being recorded) each block
    keeps only its input and recomputes the rest in the backward pass."""
    if not (checkpointing and torch.is_grad_enabled()):
        for block in blocks:
            x = block(x)
        return x
    if x.device.type == "xla":
        # torch_xla's checkpoint puts an optimization barrier on the block input; with torch's,
        # XLA merges (CSE) the recomputation with the forward and keeps every activation. It
        # puts the parameters into that barrier only when given a bound method of a module
        # (``inspect.ismethod``): ``block.forward``, not ``block``.
        from torch_xla.utils.checkpoint import checkpoint as xla_checkpoint

        for block in blocks:
            x = xla_checkpoint(block.forward, x, use_reentrant=True)  # XLA: reentrant only
        return x
    for block in blocks:
        x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    return x


def init_weights(module: nn.Module) -> None:
    """Truncated-normal linear/conv weights, zero biases, unit LayerNorms (ViT/V-JEPA init)."""
    if isinstance(module, nn.Linear | nn.Conv3d):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def rescale_blocks(blocks: nn.ModuleList) -> None:
    """Shrink each residual output projection by sqrt(2 * layer) so deep stacks start stable."""
    for i, block in enumerate(blocks, start=1):
        assert isinstance(block, Block)
        for linear in (block.attn.proj, block.mlp[2]):
            assert isinstance(linear, nn.Linear)
            linear.weight.data.div_(math.sqrt(2.0 * i))


class ViT3D(nn.Module):
    """3D ViT encoder over single-channel volumes; ``blocks`` is public for layer-wise decay."""

    pos_embed: torch.Tensor

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        patch: tuple[int, int, int],
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        attention: str = "auto",
        attention_block: int = 1024,
        checkpointing: bool = False,
        input_norm: str = "dataset",
        pos_embed: str = "learned",
    ) -> None:
        super().__init__()
        if any(s % p for s, p in zip(input_shape, patch, strict=True)):
            raise ValueError(f"input shape {input_shape} is not divisible by patch {patch}")
        self.input_shape = input_shape
        self.patch = patch
        self.grid: tuple[int, int, int] = (
            input_shape[0] // patch[0],
            input_shape[1] // patch[1],
            input_shape[2] // patch[2],
        )
        self.num_patches = self.grid[0] * self.grid[1] * self.grid[2]
        self.embed_dim = embed_dim
        self.input_norm = InputNorm(1, input_norm)
        self.patch_embed = nn.Conv3d(1, embed_dim, kernel_size=patch, stride=patch)
        if pos_embed == "learned":
            self.pos_embed = learned_positions(self.num_patches, embed_dim)
        elif pos_embed == "sincos":  # legacy: fixed, not saved with the weights
            table = sincos_3d(self.grid, embed_dim)[None]
            self.register_buffer("pos_embed", table, persistent=False)
        else:
            raise ValueError(f"pos_embed {pos_embed!r} is not 'learned' or 'sincos'")
        rates = [drop_path * i / max(1, depth - 1) for i in range(depth)]
        self.checkpointing = checkpointing
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, r, attention, attention_block) for r in rates
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.apply(init_weights)
        rescale_blocks(self.blocks)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Patch tokens ``[B, N, D]`` with positions, before the blocks (content-share test)."""
        tokens: torch.Tensor = self.patch_embed(self.input_norm(x)).flatten(2).transpose(1, 2)
        return tokens + self.pos_embed.to(tokens.dtype)

    def forward(self, x: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        tokens = self.embed(x)
        if keep_idx is not None:
            tokens = gather_tokens(tokens, keep_idx)
        tokens = run_blocks(self.blocks, tokens, self.checkpointing and self.training)
        return self.norm(tokens)  # type: ignore[no-any-return]


def encoder_from_config(cfg: ModelConfig) -> ViT3D:
    """The encoder a ModelConfig describes (``input_shape`` must be resolved, not None)."""
    if cfg.input_shape is None:
        raise ValueError("model.input_shape is unresolved (None); resolve it from the cache first")
    p = cfg.sizes()
    return ViT3D(
        cfg.input_shape,
        cfg.patch,
        p.embed_dim,
        p.depth,
        p.num_heads,
        cfg.mlp_ratio,
        cfg.drop_path,
        cfg.attention,
        cfg.attention_block,
        cfg.activation_checkpointing,
        cfg.input_norm,
        cfg.pos_embed,
    )
