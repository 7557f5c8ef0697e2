"""The sieve bias kernel: per-sequence mean β for every role, layer and head in one jnp computation.

Pure and jit-able, so the analysis can fuse it with the model forward in one jit and attention
never leaves the device.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

# The length whose uniform share the length-invariant score (`--score share`) takes as chance:
# BERT's pre-training length. β's chance level |S(t)| / n shrinks as n grows, so for a sieve of fixed
# size (prev, next, cls...) the same attention share scores n / |S(t)| times its share; against
# |S(t)| / REFERENCE_LENGTH the score is the same at every length, and equals β at n = 128.
REFERENCE_LENGTH = 128


@partial(jax.jit, static_argnames=("entropy_roles", "reference_length"))
def sieve_scores(
    attentions: jax.Array,
    real: jax.Array,
    rows: jax.Array,
    sieves: jax.Array,
    row_weights: jax.Array | None = None,
    entropy_roles: tuple[bool, ...] = (),
    key_weights: jax.Array | None = None,
    reference_length: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Mean sieve bias score over each sequence's scored rows.

    attentions: float[L, B, H, T, T] probabilities, query on axis -2, key on axis -1, padding keys 0.
    real: bool[B, T]; rows: bool[R, B, T] scored rows; sieves: bool[R, B, T, T], sieves[r, b, t]
    marks S(t), non-empty on every scored row.

    β(t) = (Σ_{s∈S(t)} α(t,s) / |S(t)|) / (Σ_{s real} α(t,s) / n_b); the score is its mean over
    the scored rows. Returns scores[R, B, L, H] (NaN where a sequence has no scored row) and
    counts int32[R, B]. The reduction runs in float32 (float64 when given float64), even for bf16.

    The authors' variants (docs/fidelity.md), both off by default:
    - `row_weights` float[R, B, T], positive on the scored rows: a weighted mean of β over the
      rows, Σ_t w(t) β(t) / Σ_t w(t), instead of the plain mean (per-arc averaging of the
      syntactic roles gives each row 1 / its word's piece count);
    - `entropy_roles[r]` True: role r scores β(t) · H(t), H(t) = −Σ_s p log p of row t's attention
      over the real keys (nats), as the released notebook's `block_score` does.

    `key_weights` float[L, B, H, T], ≥ 0: score the rows α(t,s)·k(s) (each row of a head weighted
    by that head's key weights: Kobayashi et al.'s norm-weighted attention, with
    `bertjax.readings.value_norms` as k) as if each were divided by its sum first. Both sums of β run
    over the same row, so that division cancels and is never made: no renormalised tensor, and
    the same passes over the attention as without key weights. A row whose weighted sum is 0 scores
    NaN, as its renormalised row (0: `bertjax.readings.norm_weighted`) does.

    `reference_length` N (`REFERENCE_LENGTH` for `--score share`): the row mass is divided by N
    instead of n_b, so each row scores share(t) · N / |S(t)|, share(t) = Σ_{s∈S(t)} α(t,s) /
    Σ_{s real} α(t,s): its share on the sieve against the chance level |S(t)| / N, which does not
    depend on the sequence (β = share(t) · n_b / |S(t)|). The entropy factor still comes from the
    row renormalised over its real keys.
    """
    dtype = jnp.promote_types(attentions.dtype, jnp.float32)
    attentions = attentions.astype(dtype)
    real_f = real.astype(dtype)
    n = real_f.sum(-1)
    if key_weights is None:
        # A reduction, not an einsum with `real`: XLA made that einsum a dot that first copied the
        # whole attention tensor into another layout (BERT-base shapes on 2 Xeon cores: 205 → 163 ms).
        row_mass = (attentions * real_f[None, :, None, None, :]).sum(-1)
    else:
        # Here a dot, one weight vector per (layer, sequence, head), the batch axes leading as they
        # lie: XLA wrote the product out in full before a reduction of it (MiniLM on 2 EPYC cores:
        # +85 MB a batch), and the dot reads the weights as they are.
        keys = key_weights.astype(dtype) * real_f[None, :, None, :]
        row_mass = jnp.einsum("lbhts,lbhs->lbht", attentions, keys, precision=jax.lax.Precision.HIGHEST)
        attentions = attentions * key_weights.astype(dtype)[..., None, :]
    if reference_length is not None and reference_length < 1:
        raise ValueError(f"reference_length must be a positive length, got {reference_length}")
    # β's uniform share 1 / n_b, or the fixed chance level's 1 / N.
    scale = n if reference_length is None else jnp.full_like(n, reference_length)
    row_mass = row_mass / scale[None, :, None, None]
    # Padding query rows are never scored; giving them a unit mass keeps their 0/0 out of the sum,
    # while a real row with zero mass still yields an honest inf/NaN.
    row_mass = jnp.where(real[None, :, None, :], row_mass, 1)
    relative = attentions / row_mass[..., None]

    sieve_size = sieves.sum(-1).astype(dtype)
    counts = rows.sum(-1).astype(jnp.int32)
    if row_weights is None:
        row_weight = jnp.where(rows, 1 / jnp.where(rows, sieve_size, 1), 0)
        row_weight = row_weight / jnp.maximum(counts, 1)[..., None].astype(dtype)
    else:
        given = jnp.where(rows, row_weights.astype(dtype), 0)
        total = given.sum(-1, keepdims=True)
        row_weight = given / jnp.where(total > 0, total, 1) / jnp.where(rows, sieve_size, 1)
    # Folding 1/|S(t)| and 1/count into one weight lets a single contraction over (t, s) do the
    # whole mean. Best of 7 at BERT-base shapes on 2 CPU cores (L=H=12, B=32, T=128, R=12, f32):
    # 230 ms, against 291 ms for contracting s then t, and 316 / 446 ms for vmap over roles of
    # those two forms (AMD EPYC). Looping over layers, or over chunks of the batch, was no faster
    # (Xeon). HIGHEST keeps GPUs and TPUs from running it in TF32 / bf16 passes.
    weights = sieves.astype(dtype) * row_weight[..., None]
    contract = lambda w, rel: jnp.einsum("rbts,lbhts->rblh", w, rel, precision=jax.lax.Precision.HIGHEST)
    if any(entropy_roles):
        if len(entropy_roles) != rows.shape[0]:
            raise ValueError(f"entropy_roles has {len(entropy_roles)} entries for {rows.shape[0]} roles")
        # relative / scale is the row's attention renormalised over the real keys (scipy's
        # `entropy` normalises the same way); padding keys hold 0 and add 0 · log 0 = 0.
        p = relative / jnp.maximum(scale, 1)[None, :, None, None, None]
        entropy = -jax.scipy.special.xlogy(p, p).sum(-1)
        plain = [r for r, e in enumerate(entropy_roles) if not e]
        weighted = [r for r, e in enumerate(entropy_roles) if e]
        parts = [contract(weights[jnp.array(weighted)], relative * entropy[..., None])]
        if plain:
            parts.insert(0, contract(weights[jnp.array(plain)], relative))
        order = jnp.argsort(jnp.array(plain + weighted))
        scores = jnp.concatenate(parts)[order]
    else:
        scores = contract(weights, relative)
    return jnp.where(counts[..., None, None] > 0, scores, jnp.nan), counts
