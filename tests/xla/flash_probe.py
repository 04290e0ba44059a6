"""Run in its own process by test_xla_flash.py on 2 XLA:CPU devices (SPMD): what the flash call
receives under SPMD. The Pallas kernel compiles for TPUs only, so torch_xla's ``flash_attention``
is replaced by a recorder that answers with exact attention; everything around it (the kernel
choice, the partition spec, the global mesh the backend set, the student's forward and backward)
is the trainer's; the backend keeps XLA's persistent compilation cache in ``argv[1]``. Prints
one ``XLA-RESULT {json}`` line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch_xla
import torch_xla.distributed.spmd as xs
from torch_xla.experimental.custom_kernel import FlashAttention

from octtrain.config.sections import ModelConfig
from octtrain.models import attention, flash_blocks
from octtrain.models.jepa import build_student
from octtrain.runtime.backend import make_backend

RESULT_PREFIX = "XLA-RESULT "
calls: list[dict[str, Any]] = []


def recorder(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float = 1.0,
    partition_spec: Any = None,
    mesh: Any = None,
) -> torch.Tensor:
    """torch_xla's ``flash_attention`` signature; records what the trainer passed."""
    calls.append(
        {
            "batch": int(q.shape[0]),
            "spec": None if partition_spec is None else list(partition_spec),
            "global_mesh": mesh is not None and mesh is xs.get_global_mesh(),
            "mesh_round_trip": mesh is not None
            and xs.Mesh.from_str(str(mesh)).mesh_shape == mesh.mesh_shape,
        }
    )
    return attention.math_attention(q, k, v)


def main(compile_cache: str) -> dict[str, Any]:
    # 2 devices: SPMD, the ('data',) mesh set as global; compiled programs persisted on disk
    backend = make_backend("xla", "fp32", compile_cache)
    device = backend.device
    real_choice = attention.choose("auto", device)
    pallas_missing = attention._pallas_missing()
    # A TPU with Pallas, as far as the kernel choice can tell; the recorder as the kernel.
    attention._xla_flash = lambda: ("TPU", recorder)  # type: ignore[assignment]
    attention._pallas_missing = lambda: None  # type: ignore[assignment]
    tpu_choice = attention.choose("auto", device)

    gen = torch.Generator().manual_seed(0)
    for batch in (4, 1):  # 4 splits over 2 devices; 1 (the picture forward) cannot
        q, k, v = (torch.randn(batch, 2, 16, 8, generator=gen).to(device) for _ in range(3))
        attention.attend(q, k, v, "auto", 1024)
    direct = list(calls)

    calls.clear()
    cfg = ModelConfig(preset="tiny", input_shape=(8, 32, 32), patch=(4, 8, 8))
    student = build_student(cfg).to(device).train()
    x = torch.randn(2, 1, 8, 32, 32, generator=gen).to(device)
    context = torch.arange(8).repeat(2, 1).to(device)
    target = torch.arange(8, 32).repeat(2, 1).to(device)
    student(x, context, target).abs().mean().backward()  # type: ignore[no-untyped-call]
    torch_xla.sync()
    grads = sum(int(p.grad is not None) for p in student.parameters())
    block_b_less = {k: v for k, v in FlashAttention.DEFAULT_BLOCK_SIZES.items() if k != "block_b"}
    return {
        "real_choice": list(real_choice),
        "pallas_missing": pallas_missing,
        "tpu_choice": list(tpu_choice),
        "direct": direct,
        "student": calls,
        "student_grads": grads,
        "spmd": backend.spmd,
        "blocks_match": block_b_less == flash_blocks.DEFAULT_BLOCK_SIZES,
        "cached_files": sum(1 for p in Path(compile_cache).rglob("*") if p.is_file()),
    }


if __name__ == "__main__":
    print(RESULT_PREFIX + json.dumps(main(sys.argv[1])), flush=True)
