"""What a head passes on and how an analysis reads a head's attention: Kobayashi et al.'s value
norms (`value_norms`, over `householder_r`'s factors) and norm-weighted attention, and the readings
the analyses choose between (`attention_reading`, `attention_rows`). Pure functions of arrays and
of a model's output; the model (`bertjax.model`) calls `value_norms` when a call captures them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Array = jax.Array


def value_norms(v: Array, output: nnx.Linear) -> Array:
    """‖f_h(x_j)‖ [B, H, T] in float32 (Kobayashi et al. 2020, "Attention is Not Only a Weight"):
    f_h(x) = (x W_V^h + b_V^h) W_O^h is what head h passes on from key j to the residual stream,
    from its values v [B, T, H, d_head] (bias included) and W_O^h, the d_head rows of the output
    projection `output`'s kernel [H·d_head, d] that head h's slice of the context feeds.

    The output bias b_O is left out, as in the paper: it is added once to the sum over heads, not
    per head or per key, so it belongs to no head's transfer. What head h adds at query i is
    Σ_j α_ij f_h(x_j), so ‖α_ij f_h(x_j)‖ is key j's share; since α_ij ≥ 0, ‖α_ij f_h(x_j)‖ =
    α_ij ‖f_h(x_j)‖ exactly, so one norm per (head, key) and a product with the weights give every
    (query, key) norm without a [B, H, T, T, d] tensor.

    W_O^h is [d_head, d]: its transpose factors as Q_h R_h (QR, Q_h [d, d_head] with orthonormal
    columns, R_h [d_head, d_head]), so f_h(x) = v_h R_hᵀ Q_hᵀ and ‖f_h(x)‖ = ‖v_h R_hᵀ‖: a d_head ×
    d_head product per head and key instead of d_head × d (12× fewer operations at BERT's shapes,
    and no [B, T, H, d] transient). It is as exact as the product itself: Householder QR is backward
    stable (R_h is the factor of W_O^h within a few d·u of its size) and Q_h preserves norms. The
    Gram form ‖f‖² = v_h (W_O^h W_O^hᵀ) v_hᵀ, as cheap, is not: it squares, and loses the small norms
    (the sink tokens' f, the ones the measure is about) to cancellation. The d_head × d_head factors
    come from the weights in every call, a few MFLOP, so a model whose weights change (training,
    the probes) needs nothing recomputed by hand; `householder_r` computes them in XLA's own ops."""
    heads, head_dim = v.shape[2], v.shape[3]
    kernel = output.kernel[...].astype(jnp.float32).reshape(heads, head_dim, -1)
    r = householder_r(jnp.swapaxes(kernel, 1, 2))  # [H, d_head, d_head]
    # HIGHEST: a float32 product must not be rounded to TF32 or bf16 passes on an accelerator.
    reduced = jnp.einsum("bthd,hed->bhte", v.astype(jnp.float32), r, precision=jax.lax.Precision.HIGHEST)
    return jnp.sqrt(jnp.sum(jnp.square(reduced), axis=-1))


def householder_r(a: Array) -> Array:
    """The R factor [..., n, n] of the QR decomposition of a [..., m, n] (m ≥ n, float32), up to the
    signs of its rows: one Householder reflection per column, in XLA's own ops. Not
    `jnp.linalg.qr`: on a CPU that is LAPACK's geqrf in OpenBLAS, whose threads, on a shared 2-core
    machine, took a median 8 ms and a tenth of the calls over 50 ms for one MiniLM layer's factors
    (12 heads of 384 × 32), 0.7 ms on one thread; six layers a batch made the norms cost what the
    load said. These ops take 2 ms there, loaded or not. Householder QR is backward stable either
    way. A zero column gets no reflection."""
    m, n = a.shape[-2:]
    rows = jnp.arange(m)

    def reflect(k, a):
        x = jnp.where(rows >= k, jnp.take(a, k, axis=-1), 0.0)
        # x goes to alpha e_k, alpha of the sign opposite x_k's, so v = x − alpha e_k never cancels.
        head = jnp.take(x, k, axis=-1)
        alpha = -jnp.where(head >= 0, 1.0, -1.0) * jnp.sqrt(jnp.sum(x * x, axis=-1))
        v = x - jnp.where(rows == k, alpha[..., None], 0.0)
        vv = jnp.sum(v * v, axis=-1)
        scale = jnp.where(vv > 0, 2.0 / jnp.where(vv > 0, vv, 1.0), 0.0)
        projected = jnp.einsum("...m,...mn->...n", v, a, precision=jax.lax.Precision.HIGHEST)
        return a - scale[..., None, None] * v[..., :, None] * projected[..., None, :]

    return jnp.triu(jax.lax.fori_loop(0, n, reflect, a)[..., :n, :n])


def norm_weighted(attention: Array, norms: Array) -> Array:
    """Kobayashi et al.'s norm-weighted attention: α_ij ‖f_h(x_j)‖ [..., H, T, T] from the weights
    α [..., H, T, T] and `value_norms` [..., H, T], each query row divided by its sum so that it is a
    distribution over the keys as the weights are (what β and every other weight statistic read).
    A row whose sum is 0 (a head masked to zero) stays 0 rather than 0/0."""
    raw = attention * norms[..., None, :]
    total = jnp.sum(raw, axis=-1, keepdims=True)
    return raw / jnp.where(total > 0, total, 1.0)


# What an analysis can read as a head's attention: the weights α, or their norm-weighted attention.
ATTENTION_READINGS = ("weights", "norms")


def attention_reading(out: Any, reading: str) -> tuple[Array, ...]:
    """L × [B, H, T, T]: the weights of `out` (`reading` "weights") or their norm-weighted attention
    ("norms": `out` from a call with attention_norms=True)."""
    if reading == "weights":
        return out.attentions
    return tuple(norm_weighted(a, n) for a, n in zip(out.attentions, out.value_norms, strict=True))


def attention_rows(out: Any, reading: str) -> tuple[Array, Array | None]:
    """`reading` of `out` as unnormalised rows: the weights α [L, B, H, T, T] and, for "norms", the
    per-key weights `value_norms` [L, B, H, T] that multiply them (None for "weights"). For a
    statistic that each row's scale leaves alone (β: `sieves.kernel.sieve_scores(...,
    key_weights=...)`), this is the norm-weighted attention without the [L, B, H, T, T] product
    and renormalisation of `attention_reading`: two passes fewer over the attention."""
    attentions = jnp.stack(out.attentions)
    return attentions, jnp.stack(out.value_norms) if reading == "norms" else None
