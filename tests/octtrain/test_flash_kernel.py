"""The Pallas flash kernel a TPU run uses, run on CPU through JAX's interpreter at the lengths of
the production preset, with the block sizes torch_xla 2.9 would hand it; and the config check
that refuses, before any compile, a length the kernel cannot take.

torch_xla's ``flash_attention`` traces JAX's ``jax.experimental.pallas.ops.tpu.flash_attention``
kernels (forward, ``dkv`` and ``dq`` backward) into a TPU custom call; JAX runs the same kernels
here with ``interpret=True``, so what is checked is the kernel's arithmetic and its block checks
at these shapes, not Mosaic's TPU compilation (README: what the tests simulate).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash

from octtrain.config.loader import load_config
from octtrain.config.pretrain import PretrainConfig
from octtrain.errors import ConfigError
from octtrain.models import attention
from octtrain.models.flash_blocks import check_lengths, kernel_blocks, length_problem
from octtrain.train.pretrain import attention_lengths, check_kernel

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "pretrain"


def _preset(name: str, *overrides: str) -> PretrainConfig:
    return load_config(PretrainConfig, CONFIGS / f"{name}.yaml", list(overrides))


def _head_dims(cfg: PretrainConfig) -> dict[str, int]:
    p = cfg.model.sizes()
    enc = p.embed_dim // p.num_heads
    return {"context encoder": enc, "target encoder": enc, "predictor": p.pred_dim // p.pred_heads}


def _flash(length: int, head_dim: int) -> Callable[..., Any]:
    blocks = jax_flash.BlockSizes(block_b=1, **kernel_blocks(length))
    scale = head_dim**-0.5
    return lambda q, k, v: jax_flash.flash_attention(q, k, v, sm_scale=scale, block_sizes=blocks)


def _exact(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
    scores = q @ k.swapaxes(-1, -2) * q.shape[-1] ** -0.5
    return jax.nn.softmax(scores, axis=-1) @ v


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``pallas_call`` of JAX's flash module through the Pallas interpreter (CPU)."""
    monkeypatch.setattr(pl, "pallas_call", functools.partial(pl.pallas_call, interpret=True))


def _compare(length: int, head_dim: int) -> None:
    keys = jax.random.split(jax.random.PRNGKey(length), 4)
    q, k, v, grad = (jax.random.normal(key, (1, 1, length, head_dim)) for key in keys)
    q, k, v = (t.astype(jnp.bfloat16) for t in (q, k, v))
    out, vjp = jax.vjp(_flash(length, head_dim), q, k, v)
    grads = vjp(grad.astype(jnp.bfloat16))
    want, want_vjp = jax.vjp(_exact, q, k, v)
    want_grads = want_vjp(grad)
    for got, ref in zip((out, *grads), (want, *want_grads), strict=True):
        got32 = got.astype(jnp.float32)
        # bf16 inputs and outputs: 8 mantissa bits (torch's bf16 tolerance, rtol 1.6e-2)
        err = float(jnp.max(jnp.abs(got32 - ref) / (1e-2 + 1.6e-2 * jnp.abs(ref))))
        assert err <= 1.0, f"flash vs exact at {length} tokens: {err:.2f} x bf16 tolerance"


def test_production_lengths_pass_the_check() -> None:
    cfg = _preset("vit29m-384")
    lengths = attention_lengths(cfg)
    assert lengths == {"context encoder": 2048, "target encoder": 9216, "predictor": 9216}
    check_lengths(lengths)
    for name in ("vit90m-384", "vit29m-384-v4-32", "vit90m-384-v4-32"):
        check_lengths(attention_lengths(_preset(name)))


@pytest.mark.parametrize("model", ["vit29m", "vit90m"])
def test_v4_32_presets_keep_the_v4_8_volumes_per_chip(model: str) -> None:
    v4_8, v4_32 = _preset(f"{model}-384"), _preset(f"{model}-384-v4-32")
    assert v4_32.data.batch_size // 16 == v4_8.data.batch_size // 4  # 16 chips vs 4
    assert v4_32.data.batch_size % 4 == 0  # over 4 hosts
    assert dataclasses.replace(v4_32, data=v4_8.data, train=v4_8.train) == v4_8


def test_the_check_refuses_the_old_mask_ratio_before_compiling() -> None:
    # ratio 0.75 leaves 2,304 context tokens: the forward's k blocks take it only padded, the
    # dq backward (block_q_dq 1,024) not at all: step 0's backward() died on the TPU.
    cfg = _preset("vit29m-384", "mask.ratio=0.75")
    with pytest.raises(ConfigError, match=r"context encoder sees 2,304 tokens.*block_\w+ = 512"):
        check_lengths(attention_lengths(cfg))


@pytest.mark.parametrize("length", [128, 256, 384, 512, 768, 1024, 1536, 2048, 2304, 3072, 9216])
def test_the_check_agrees_with_jax_block_checks(length: int) -> None:
    # Tracing (no run) forward and backward makes JAX verify every block against the length.
    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return _flash(length, 64)(q, k, v).sum()

    shape = jax.ShapeDtypeStruct((1, 1, length, 64), jnp.float32)
    try:
        jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2)), shape, shape, shape)
        jax_takes = True
    except ValueError:
        jax_takes = False
    assert (length_problem(length) is None) == jax_takes


def test_context_length_runs_exactly_forward_and_backward(interpret: None) -> None:
    cfg = _preset("vit29m-384")
    length = attention_lengths(cfg)["context encoder"]
    _compare(length, _head_dims(cfg)["context encoder"])


@pytest.mark.slow
@pytest.mark.parametrize("where", ["target encoder", "predictor"])
def test_full_length_runs_exactly_forward_and_backward(interpret: None, where: str) -> None:
    cfg = _preset("vit29m-384")
    _compare(attention_lengths(cfg)[where], _head_dims(cfg)[where])


def test_blocks_are_torch_xla_defaults_capped_by_length() -> None:
    assert kernel_blocks(9216)["block_q_dq"] == 1024
    assert kernel_blocks(200) == dict.fromkeys(kernel_blocks(200), 200)
    assert dataclasses.is_dataclass(jax_flash.BlockSizes)


def test_a_tpu_run_with_a_bad_length_is_refused_before_the_model_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # run_pretrain calls check_kernel right after the backend starts, before the job builds.
    monkeypatch.setattr(attention, "_xla_flash", lambda: ("TPU", attention.math_attention))
    monkeypatch.setattr(attention, "_pallas_missing", lambda: None)
    xla = torch.device("xla")
    assert check_kernel(_preset("vit29m-384"), xla)[0] == "flash"
    with pytest.raises(ConfigError, match="2,304 tokens"):
        check_kernel(_preset("vit29m-384", "mask.ratio=0.75"), xla)
    assert check_kernel(_preset("vit29m-384", "mask.ratio=0.75", "model.attention=blocked"), xla)
