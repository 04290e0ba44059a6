"""Classification heads on top of encoder tokens: pooling, then a linear or MLP classifier.

Encoders hand over tokens ``(batch, tokens, dim)``. Pooling turns them into one vector per
volume: ``mean`` over patch tokens, ``cls`` (the encoder's first token; only when the encoder
has one) or ``attentive`` (learned queries cross-attending to the tokens, V-JEPA's attentive
probe). The head kinds:

* ``linear``    LayerNorm + Linear: the classic linear probe.
* ``mlp``       LayerNorm + Linear + GELU + Dropout + Linear.
* ``attentive`` attentive pooling + LayerNorm + Linear (pooling must be ``attentive``).

The pooled vector is normalised first (``head.norm``): LayerNorm, or BatchNorm without affine
parameters (MAE's linear probe: self-supervised features often share a large constant
component, and standardising each feature across samples is what lets a linear probe see the
rest), or nothing. Every shape is static, so the same module runs on CPU, CUDA and XLA.
"""

from __future__ import annotations

import torch
from torch import nn

from octtrain.config.finetune import HeadConfig


class AttentivePooler(nn.Module):
    """Learned queries attend to all tokens (one cross-attention block with an MLP)."""

    def __init__(self, dim: int, num_heads: int, num_queries: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.queries = nn.Parameter(torch.zeros(1, num_queries, dim))
        nn.init.trunc_normal_(self.queries, std=0.02)
        self.norm_kv = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        self.norm_mlp = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        kv = self.norm_kv(tokens)
        q = self.queries.expand(tokens.shape[0], -1, -1)
        x = q + self.attn(q, kv, kv, need_weights=False)[0]
        x = x + self.mlp(self.norm_mlp(x))
        pooled: torch.Tensor = x.mean(dim=1)
        return pooled


class ClassifierHead(nn.Module):
    """Pool encoder tokens, then classify. ``has_cls`` says whether token 0 is a CLS token."""

    def __init__(self, cfg: HeadConfig, embed_dim: int, num_classes: int, has_cls: bool) -> None:
        super().__init__()
        if cfg.pooling == "cls" and not has_cls:
            raise ValueError(
                "head.pooling=cls but the encoder has no CLS token; use mean or attentive"
            )
        self.pooling = cfg.pooling
        self.skip = 1 if has_cls else 0  # mean/attentive pooling ignore the CLS token
        self.pooler = (
            AttentivePooler(embed_dim, cfg.num_heads, cfg.num_queries)
            if cfg.pooling == "attentive"
            else None
        )
        self.norm: nn.Module
        if cfg.norm == "batch":
            self.norm = nn.BatchNorm1d(embed_dim, affine=False)
        elif cfg.norm == "layer":
            self.norm = nn.LayerNorm(embed_dim)
        else:
            self.norm = nn.Identity()
        layers: list[nn.Module]
        if cfg.kind == "mlp":
            layers = [
                nn.Linear(embed_dim, cfg.hidden_dim),
                nn.GELU(),
                nn.Dropout(cfg.dropout),
                nn.Linear(cfg.hidden_dim, num_classes),
            ]
        else:  # linear and attentive both end in one linear layer
            layers = [nn.Dropout(cfg.dropout), nn.Linear(embed_dim, num_classes)]
        self.classifier = nn.Sequential(*layers)
        for module in self.classifier:
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            return tokens[:, 0]
        patches = tokens[:, self.skip :]
        if self.pooler is not None:
            pooled: torch.Tensor = self.pooler(patches)
            return pooled
        return patches.mean(dim=1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.norm(self.pool(tokens)))
        return logits


class Classifier(nn.Module):
    """Encoder + head. The encoder maps a batch of volumes to tokens ``(B, N, D)``.

    While ``encoder_frozen`` the encoder runs without autograd and stays in eval mode (no drop
    path), so a frozen epoch costs a forward pass of the encoder and nothing more.
    """

    def __init__(self, encoder: nn.Module, head: ClassifierHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.encoder_frozen = False

    def freeze_encoder(self, frozen: bool) -> None:
        """Stop (or restart) gradients into the encoder; the optimizer is the caller's part."""
        self.encoder_frozen = frozen
        for p in self.encoder.parameters():
            p.requires_grad_(not frozen)
        self.train(self.training)

    def train(self, mode: bool = True) -> Classifier:
        super().train(mode)
        if self.encoder_frozen:
            self.encoder.eval()
        return self

    def forward(self, volumes: torch.Tensor) -> torch.Tensor:
        if self.encoder_frozen:
            with torch.no_grad():
                tokens = self.encoder(volumes)
        else:
            tokens = self.encoder(volumes)
        return self.head(tokens)  # type: ignore[no-any-return]
