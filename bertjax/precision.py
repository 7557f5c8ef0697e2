"""The precision of matrix products, by name (docs/precision.md): the analyses' `--precision` and
training's `matmul_precision` name one of these, and what runs under `matmul_precision(name)` is
traced with it.

JAX's default lets an accelerator round float32 operands: TF32 on NVIDIA GPUs since Ampere (JAX's
own `Precision` docs), bfloat16 passes on TPUs; XLA's CPU code multiplies in float32 whatever it is
told. So a float32 analysis on a GPU ran its products in TF32 unless it said otherwise. The names
here say what the products are on every device; `bfloat16` is JAX's dot algorithm with bfloat16
operands and float32 sums, not its "bfloat16" level, which on a GPU is the DEFAULT level, TF32.

No JAX import at module level: the parsers read the names before JAX loads.
"""

from __future__ import annotations

import contextlib
from typing import Any

# Each name's value of `jax.default_matmul_precision`.
MATMUL_PRECISIONS = {"float32": "highest", "tf32": "tensorfloat32", "bfloat16": "BF16_BF16_F32"}
# Training's choices: "default" leaves JAX's default (the products of every run before the setting).
TRAINING_PRECISIONS = ("default", *MATMUL_PRECISIONS)


def matmul_precision(name: str) -> Any:
    """A context under which every matrix product without a precision of its own is computed as
    `name` says ("default": as JAX's default is). jit keys its cache on it, so a jitted function
    called inside is traced and compiled for it, whatever an earlier call outside compiled."""
    if name == "default":
        return contextlib.nullcontext()
    import jax

    return jax.default_matmul_precision(MATMUL_PRECISIONS[name])
