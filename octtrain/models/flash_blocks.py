"""The sequence lengths torch_xla's Pallas flash attention takes (pure logic, no torch_xla).

torch_xla 2.9's ``FlashAttention`` sets no block sizes of its own per call: each of its Pallas
kernels (JAX's ``jax.experimental.pallas.ops.tpu.flash_attention``: the forward, the ``dkv``
and the ``dq`` backward kernels) gets ``min(DEFAULT_BLOCK_SIZES[name], length)``, and JAX
refuses a length its block does not divide. The forward pads keys up to a multiple of 512, the
backward pads nothing, so a length that passes the forward (2,304 = 4.5 x 512) can still die in
step 0's ``backward()`` (not a multiple of ``block_q_dq`` = 1,024). ``check_lengths`` refuses such
a config before anything compiles; ``kernel_blocks`` is what a test hands JAX's kernel to run it
with exactly the trainer's blocks.

Every attention here is self-attention (query and key lengths equal), so one length decides.
"""

from __future__ import annotations

from collections.abc import Mapping

from octtrain.errors import ConfigError

# torch_xla 2.9.0's FlashAttention.DEFAULT_BLOCK_SIZES (MaxText's), less block_b (the batch
# block: JAX's kernel takes any batch). tests/xla checks this copy against the installed one.
DEFAULT_BLOCK_SIZES: dict[str, int] = {
    "block_q": 512,
    "block_k_major": 512,
    "block_k": 512,
    "block_q_major_dkv": 512,
    "block_k_major_dkv": 512,
    "block_q_dkv": 512,
    "block_k_dkv": 512,
    "block_q_dq": 1024,
    "block_k_dq": 256,
    "block_k_major_dq": 512,
}


def kernel_blocks(length: int) -> dict[str, int]:
    """The block sizes torch_xla 2.9 passes the Pallas kernels at sequence length ``length``."""
    return {name: min(size, length) for name, size in DEFAULT_BLOCK_SIZES.items()}


def length_problem(length: int) -> tuple[str, int] | None:
    """(the block name, its size) of the first kernel block that does not divide ``length``;
    None when the forward and both backward kernels take it."""
    for name, block in kernel_blocks(length).items():
        if length % block:
            return name, block
    return None


def check_lengths(lengths: Mapping[str, int]) -> None:
    """Raise ``ConfigError`` naming the first of ``{where: length}`` flash cannot take."""
    for where, length in lengths.items():
        problem = length_problem(length)
        if problem is not None:
            name, block = problem
            raise ConfigError(
                f"model.attention flash: the {where} sees {length:,} tokens, not a multiple of "
                f"the kernel's {name} = {block:,} (flash takes up to 256 tokens, 512, 1,024 or "
                "a multiple of 1,024); change mask.ratio, model.input_shape or model.patch, or "
                "use model.attention=blocked"
            )
