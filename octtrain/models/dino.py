"""The DINOv2 student: a 2D ViT, a DINO head on the CLS token and an iBOT head on masked patches.

``DinoStudent.forward(global_crops, local_crops, masks)`` runs the backbone once over the global
crops (masked patches replaced by the mask token) and once over the local crops, and returns the
head logits the losses need: one call, so a DDP wrapper sees every parameter used in one forward.
The teacher is a copy of the student updated by EMA (``models/jepa.ema_update``), in eval mode
and without drop path; it sees the global crops unmasked. Heads follow DINOv2: an MLP to a
bottleneck, L2-normalised, then a weight-normalised linear layer onto the prototypes whose norm
is fixed at 1; that last part in float32 under autocast (the logits are cosines the losses divide
by temperatures down to 0.04).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octtrain.config.dino import DinoConfig
from octtrain.models.vit2d import ViT2D, build_vit2d
from octtrain.models.vit3d import DropPath


class DinoHead(nn.Module):
    """MLP (``layers`` linear layers, GELU) -> bottleneck -> L2 norm -> prototypes."""

    def __init__(
        self, in_dim: int, out_dim: int, hidden: int = 2048, bottleneck: int = 256, layers: int = 3
    ) -> None:
        super().__init__()
        self.out_dim = out_dim
        dims = [in_dim] + [hidden] * (layers - 1) + [bottleneck]
        mlp: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(dims)):
            mlp.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                mlp.append(nn.GELU())
        self.mlp = nn.Sequential(*mlp)
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                # By fan-in, not DINO's std 0.02: at 0.02 a narrow head's output vanishes
                # (~1e-3 through 48 -> 64 -> 64 -> 32), Adam's first bias steps swamp it and every
                # crop gets one bottleneck direction: a uniform teacher from the first steps.
                # At DINOv2's widths (384 -> 2048 -> 2048 -> 256) this is 0.051, 0.022, 0.022.
                nn.init.trunc_normal_(m.weight, std=m.in_features**-0.5)
                nn.init.zeros_(m.bias)
        last = nn.Linear(bottleneck, out_dim, bias=False)
        self.last_layer = nn.utils.parametrizations.weight_norm(last)
        # The prototypes' norm stays 1 (DINO's norm_last_layer): only their directions learn.
        g = self.last_layer.parametrizations.weight.original0
        g.data.fill_(1.0)
        g.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)
        # The logits are cosines in [-1, 1] that the losses divide by 0.04-0.1: in bf16 (8
        # significant bits) one near 0.9 is off by up to 0.002, 0.05 after the teacher's 0.04
        # (fp16: 0.006). So the norm and the prototypes run in float32, autocast or not.
        with torch.autocast(x.device.type, enabled=False):
            x = F.normalize(x.float(), dim=-1, eps=1e-6)
            return self.last_layer(x)  # type: ignore[no-any-return]


@dataclass
class StudentOutput:
    """What one student forward gives the losses (crop-major rows: crop 0's batch, then 1's)."""

    global_logits: torch.Tensor  # [2B, K] DINO head on the global crops' CLS tokens
    local_logits: torch.Tensor  # [LB, K] on the local crops' CLS tokens
    global_cls: torch.Tensor  # [2B, D] backbone CLS tokens (KoLeo)
    masked_logits: torch.Tensor  # [M, K_ibot] iBOT head on the masked patch tokens
    patches: torch.Tensor  # [2B, N, D] the global crops' patch tokens (collapse monitor)


class DinoStudent(nn.Module):
    """Backbone + DINO head + iBOT head (a separate head unless ``ibot_head`` is None)."""

    def __init__(self, backbone: ViT2D, dino_head: DinoHead, ibot_head: DinoHead | None) -> None:
        super().__init__()
        self.backbone = backbone
        self.dino_head = dino_head
        self.ibot_head = ibot_head

    def patch_head(self) -> DinoHead:
        """The head applied to masked patch tokens (the DINO head when shared)."""
        return self.ibot_head if self.ibot_head is not None else self.dino_head

    def forward(
        self,
        global_crops: torch.Tensor,
        local_crops: torch.Tensor | None = None,
        masks: torch.Tensor | None = None,
        mask_input: bool = True,
        mask_index: torch.Tensor | None = None,
    ) -> StudentOutput:
        """``mask_input`` False (the teacher): the crops are seen whole and the masks only
        choose the patch tokens the iBOT head scores. ``mask_index [M]`` (flat positions in the
        ``[2B * N]`` patch tokens, ``data/ibot_masks.py``) picks them at a fixed size; without
        it they come from ``masks`` (a data-dependent size: tests and one-off forwards)."""
        g_cls, g_patches = self.backbone(global_crops, masks if mask_input else None)
        if local_crops is not None and local_crops.shape[0]:
            local_logits = self.dino_head(self.backbone(local_crops)[0])
        else:
            local_logits = g_cls.new_zeros((0, self.dino_head.out_dim))
        tokens = g_patches.flatten(0, 1)
        if mask_index is not None:
            masked = tokens.index_select(0, mask_index)  # [M, D], M fixed by the batch size
        elif masks is not None:
            masked = tokens[masks.flatten()]
        else:  # no iBOT (the pictures' forward)
            masked = tokens[:0]
        return StudentOutput(
            global_logits=self.dino_head(g_cls),
            local_logits=local_logits,
            global_cls=g_cls,
            masked_logits=self.patch_head()(masked),
            patches=g_patches,
        )


def make_teacher(student: DinoStudent) -> DinoStudent:
    """A frozen copy of the student (EMA-updated, never back-propagated), built without drop
    path and in eval mode for good, as DINOv2's teacher: its outputs are the targets, and a
    target that drops residual branches at random is noise the student is asked to match."""
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.requires_grad = False
    for module in teacher.modules():
        if isinstance(module, DropPath):
            module.p = 0.0
    return teacher.eval()


def teacher_outputs(
    teacher: DinoStudent,
    global_crops: torch.Tensor,
    masks: torch.Tensor,
    mask_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher's DINO logits ``[2B, K]``, iBOT logits on the student's masked positions
    ``[M, K_ibot]`` and its CLS tokens ``[2B, D]`` (unmasked global crops, no graph)."""
    # Through the module's own forward, so a wrapper's hooks (FSDP's all-gather) run.
    with torch.no_grad():
        out = teacher(global_crops, None, masks, mask_input=False, mask_index=mask_index)
    return out.global_logits, out.masked_logits, out.global_cls


def build_student(cfg: DinoConfig, in_chans: int) -> DinoStudent:
    """Backbone and heads as configured."""
    m, d = cfg.model, cfg.dino
    backbone = build_vit2d(
        m.preset,
        in_chans,
        patch=m.patch,
        embed_dim=m.embed_dim,
        depth=m.depth,
        num_heads=m.num_heads,
        mlp_ratio=m.mlp_ratio,
        drop_path=m.drop_path,
        attention=m.attention,
        input_norm=m.input_norm,
        pos_embed=m.pos_embed,
        crop=cfg.crops.global_size,
        layerscale=m.layerscale,
    )
    dim = backbone.embed_dim

    def head(out: int) -> DinoHead:
        return DinoHead(dim, out, d.head_hidden, d.head_bottleneck, d.head_layers)

    ibot = head(d.ibot_prototypes) if d.separate_ibot_head else None
    return DinoStudent(backbone, head(d.dino_prototypes), ibot)
