"""Surface-level attention patterns (Clark et al. 2019, §3) and head clustering (§6).

Per head, averaged over every real query row t of every sequence (token-weighted: a long
sequence weighs more; `weighting="sequences"` instead takes each sequence's mean over its rows
and averages those, so each sequence counts once, as the authors' General_Analysis notebook does —
the paper does not say which, docs/fidelity.md): the attention to [CLS], to the [SEP]s, to "." and
"," tokens, to the token itself, to the previous token (rows t ≥ 1) and to the next one (rows
t ≤ n − 2); the entropy −Σ_s α log α of the rows (all rows, and the [CLS] row alone), beside the
entropy log n of uniform attention over the same rows. Entropies are in nats.

Head distances: the Jensen–Shannon divergence between two heads' attention rows,
JS(P, Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M), M = ½(P + Q), in nats (= scipy's `jensenshannon(p, q)²`,
which returns the square root), averaged over every real row of every sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from analysis.attention.options import SURFACE_WEIGHTINGS as WEIGHTINGS
from analysis.common.finite import check_finite, silent_heads, warn_undefined
from analysis.common.forward import compiled, padded_batches
from bertjax.model import Model
from bertjax.readings import attention_reading, attention_rows
from sieves.align import EncodedSequence

STATISTICS = (
    "cls", "sep", "punct", "self", "prev", "next",
    "entropy", "entropy_cls", "uniform_entropy", "uniform_entropy_cls",
)  # fmt: skip


def surface_sums(
    attention: jax.Array,
    real: jax.Array,
    is_cls: jax.Array,
    is_sep: jax.Array,
    is_punct: jax.Array,
    weighting: str = "tokens",
):
    """attention [L, B, H, T, T] → (sums [L, H, S], counts [S]) for the STATISTICS, over real rows.

    `tokens`: sums over the rows and the number of rows; `sequences`: sums of each sequence's mean
    over its rows and the number of sequences that have such a row."""
    length = attention.shape[-1]
    real = real.astype(jnp.float32)
    n = real.sum(axis=-1, keepdims=True)  # [B, 1]
    position = jnp.arange(length)[None, :]
    has_prev = real * (position >= 1)
    has_next = real * (position <= n - 2)
    cls_row = real * is_cls
    to = lambda keys: jnp.einsum("lbhts,bs->lbht", attention, keys.astype(jnp.float32))
    diagonal = lambda k: jnp.diagonal(attention, offset=k, axis1=-2, axis2=-1)
    prev = jnp.pad(diagonal(-1), ((0, 0), (0, 0), (0, 0), (1, 0)))
    nxt = jnp.pad(diagonal(1), ((0, 0), (0, 0), (0, 0), (0, 1)))
    entropy = -jnp.sum(jax.scipy.special.xlogy(attention, attention), axis=-1)
    uniform = jnp.broadcast_to(jnp.log(jnp.maximum(n, 1.0)), real.shape)
    per_row = [
        (to(is_cls), real), (to(is_sep), real), (to(is_punct), real), (diagonal(0), real),
        (prev, has_prev), (nxt, has_next), (entropy, real), (entropy, cls_row),
    ]  # fmt: skip
    layers, heads = attention.shape[0], attention.shape[2]
    if weighting == "sequences":
        sums, counts = [], []
        uniform_rows = jnp.broadcast_to(uniform[None, :, None, :], attention.shape[:-1])
        for value, rows in [*per_row, (uniform_rows, real), (uniform_rows, cls_row)]:
            per_sequence = rows.sum(-1)  # [B]
            means = jnp.einsum("lbht,bt->lbh", value, rows) / jnp.maximum(per_sequence, 1.0)[None, :, None]
            sums.append(means.sum(axis=1))
            counts.append((per_sequence > 0).sum().astype(jnp.float32))
        return jnp.stack(sums, axis=-1), jnp.stack(counts)
    sums = [jnp.einsum("lbht,bt->lh", value, rows) for value, rows in per_row]
    for rows in (real, cls_row):
        sums.append(jnp.full((layers, heads), jnp.sum(uniform * rows)))
    counts = [rows.sum() for _, rows in per_row] + [real.sum(), cls_row.sum()]
    return jnp.stack(sums, axis=-1), jnp.stack(counts)


def js_sums(attention: jax.Array, real: jax.Array) -> jax.Array:
    """attention [L, B, H, T, T] → [L·H, L·H] JS divergence summed over the real rows.

    Uses JS(P, Q) = H(M) − ½ H(P) − ½ H(Q): the entropies of single rows are computed once, so a
    pair costs one logarithm per element instead of four.
    """
    layers, batch, heads, queries, keys = attention.shape
    rows = jnp.moveaxis(attention, 1, 2).reshape(layers * heads, batch * queries, keys)
    weight = real.reshape(-1).astype(jnp.float32)  # [B·T] real query rows
    xlogx = lambda x: jnp.sum(jax.scipy.special.xlogy(x, x), axis=-1)
    neg_entropy = xlogx(rows)  # [L·H, B·T]

    def against_all(head):
        p, neg_entropy_p = head
        return (0.5 * (neg_entropy_p[None] + neg_entropy) - xlogx(0.5 * (p[None] + rows))) @ weight

    return jax.lax.map(against_all, (rows, neg_entropy))


def classical_mds(distance: np.ndarray, dims: int = 2) -> np.ndarray:
    """Torgerson's classical multidimensional scaling of a symmetric distance matrix → [N, dims]."""
    n = distance.shape[0]
    centring = np.eye(n) - np.full((n, n), 1.0 / n)
    gram = -0.5 * centring @ (distance**2) @ centring
    values, vectors = np.linalg.eigh(gram)
    top = np.argsort(values)[::-1][:dims]
    return vectors[:, top] * np.sqrt(np.clip(values[top], 0.0, None))


def key_flag_batches(
    seqs: Sequence[EncodedSequence], batch_size: int, max_length: int, punct_ids: Sequence[int], desc: str
):
    """Padded model inputs plus the real-row mask and key flags of each length-sorted batch."""
    for chunk, arrays in padded_batches(seqs, batch_size, max_length, desc):
        length = arrays["input_ids"].shape[1]
        # pad_batch gives the filler rows of a short last batch one real token; they are not data.
        arrays["real"] = arrays["attention_mask"].copy()
        arrays["real"][len(chunk) :] = 0
        for name in ("is_cls", "is_sep", "is_punct"):
            arrays[name] = np.zeros((batch_size, length), np.float32)
        for b, seq in enumerate(chunk):
            arrays["is_cls"][b, : seq.length] = seq.is_cls
            arrays["is_sep"][b, : seq.length] = seq.is_sep
            arrays["is_punct"][b, : seq.length] = np.isin(seq.input_ids, punct_ids) & ~seq.special
        yield arrays


def _attention_fn(model: Model, reduce, reading: str, *options):
    """Jitted forward whose stacked attention [L, B, H, T, T] of `reading` (`--attention`: the
    weights or the norm-weighted attention) goes straight into `reduce(attention, arrays,
    *options)` (`reduce` a module-level function: part of the key of the compiled function, as
    `reading` and `options` are); returns what `reduce` does and `finite.silent_heads` [L, B, H],
    whose attention is NaN in the reduction (undefined, not the 0 of its all-zero rows)."""
    run, (state,) = compiled(_jit_attention_fn, model, static=(reduce, reading, *options))
    return lambda arrays: run(state, arrays)


def _jit_attention_fn(graphdef, reduce, reading, *options):
    @jax.jit
    def run(state, arrays):
        out = nnx.merge(graphdef, state)(
            arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], output_attentions=True,
            attention_norms=reading == "norms",
        )  # fmt: skip
        silent = silent_heads(*attention_rows(out, reading), arrays["real"].astype(bool))
        attention = jnp.where(silent[..., None, None], jnp.nan, jnp.stack(attention_reading(out, reading)))
        return reduce(attention, arrays, *options), silent

    return run


def _surface_reduce(attention, arrays, weighting):
    return surface_sums(attention, arrays["real"], arrays["is_cls"], arrays["is_sep"], arrays["is_punct"], weighting)


def _js_reduce(attention, arrays):
    return js_sums(attention, arrays["real"])


def surface_statistics(
    model: Model,
    seqs: Sequence[EncodedSequence],
    punct_ids: Sequence[int],
    batch_size: int,
    max_length: int,
    weighting: str = "tokens",
    reading: str = "weights",
    allowed: bool = False,
) -> np.ndarray:
    """Means [L, H, S] of the STATISTICS over every real row of every sequence (`weighting`, see
    the module docstring) of `reading`'s attention, streamed by batch. A statistic that is not
    finite stops the run (`finite.check_finite`, `allowed` its) unless its head's norm-weighted
    attention is undefined (NaN, with a warning)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    run = _attention_fn(model, _surface_reduce, reading, weighting)
    # 0-d starts, broadcast to the first batch's shape.
    total_sums, total_counts, silent = np.zeros(()), np.zeros(()), np.zeros((), bool)
    for arrays in key_flag_batches(seqs, batch_size, max_length, punct_ids, "surface"):
        (sums, counts), batch_silent = run(arrays)
        total_sums = total_sums + np.asarray(sums, np.float64)
        total_counts = total_counts + np.asarray(counts, np.float64)
        silent = silent | np.asarray(batch_silent).any(axis=1)
    means = total_sums / np.maximum(total_counts, 1.0)
    check_finite(np.moveaxis(means, -1, 0), "a surface statistic", "surface", silent, allowed)
    warn_undefined(silent, "surface", "their statistics are")
    return means


def head_js_divergence(
    model: Model,
    seqs: Sequence[EncodedSequence],
    batch_size: int,
    max_length: int,
    reading: str = "weights",
    allowed: bool = False,
) -> np.ndarray:
    """[L·H, L·H] JS divergence between heads' `reading` rows (nats), averaged over every real row
    of `seqs` (NaN for a pair with a head whose attention is undefined; `allowed` as
    `surface_statistics`')."""
    run = _attention_fn(model, _js_reduce, reading)
    total, rows, silent = np.zeros(()), 0.0, np.zeros((), bool)
    for arrays in key_flag_batches(seqs, batch_size, max_length, (), "head distances"):
        sums, batch_silent = run(arrays)
        total = total + np.asarray(sums, np.float64)
        rows += float(arrays["real"].sum())
        silent = silent | np.asarray(batch_silent).any(axis=1)
    js = total / rows
    # A pair is undefined when either head is: [L·H, L, H], the second head last.
    pairs = np.asarray(silent).reshape(-1)[:, None, None] | silent
    check_finite(js.reshape(pairs.shape), "the JS divergence", "head distances", pairs, allowed)
    warn_undefined(silent, "head distances", "their divergences are")
    return js
