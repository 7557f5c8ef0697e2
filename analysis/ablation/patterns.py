"""Kovaleva et al. §4.1: each attention map classified by fixed rules as vertical, diagonal,
vertical+diagonal, block or heterogeneous, and the share of each class over heads × examples.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from bertjax import glue

PATTERNS = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")

PATTERN_COLOURS = ("#a50f15", "#08519c", "#6a51a3", "#31a354", "#969696")


@dataclasses.dataclass(frozen=True)
class PatternThresholds:
    """The rules' thresholds, on per-map quantities averaged over the word (non-special) query rows:
    v, the mass on [CLS] and [SEP]; d, the mass on the word keys at t − 1, t and t + 1; b, the share
    of the mass on words that stays in the query's own segment, corrected for chance (0: as much
    as uniform attention over the words keeps there, 1: all of it)."""

    structured: float = 0.5  # v + d at least this: vertical, diagonal or vertical+diagonal
    minor_share: float = 0.25  # the smaller of v, d under this share of v + d: the pure class
    block: float = 0.6  # b at least this (two-segment inputs only): block; a raw share of 0.8 on equal segments


DEFAULT_THRESHOLDS = PatternThresholds()


def pattern_quantities(attn, real, special, segment):
    """(v, d, b) of every map, each [..., B, H], from attention [..., B, H, T, T].

    `real`, `special` [B, T] bool and `segment` [B, T] int (token type). Query rows are the real
    non-special tokens; keys outside `real` carry no mass. Works on numpy and jax arrays alike.

    d counts t itself: a head that attends to its own token draws the main diagonal (without it,
    such a head had v = d = 0 and a raw in-segment share of 1, and was called block). b is
    chance-corrected, (share − share₀) / (1 − share₀) with share₀ = Σ_seg |seg|² / |words|², the
    share uniform attention over the words keeps in-segment: on a pair of 5 and 45 words share₀ is
    0.82, so a uniform head passed a raw threshold of 0.8 as block.
    """
    xp = jnp if isinstance(attn, jax.Array) else np
    length = attn.shape[-1]
    words = real & ~special
    word_keys = words[:, None, None, :]
    v_rows = (attn * (real & special)[:, None, None, :]).sum(-1)
    positions = xp.arange(length)
    neighbours = xp.abs(positions[:, None] - positions[None, :]) <= 1
    d_rows = (attn * (neighbours & word_keys)).sum(-1)
    same_segment = segment[:, :, None] == segment[:, None, :]
    w_rows = (attn * (same_segment[:, None] & word_keys)).sum(-1)
    u_rows = (attn * word_keys).sum(-1)
    rows = words[:, None, :]
    count = xp.maximum(rows.sum(-1), 1)
    mean = lambda x: (x * rows).sum(-1) / count
    word_mass = mean(u_rows)
    share = xp.where(word_mass > 0, mean(w_rows) / xp.where(word_mass > 0, word_mass, 1.0), 0.0)
    n_words = xp.maximum(words.sum(-1), 1)
    own_words = (same_segment & words[:, None, :]).sum(-1) / n_words[:, None]  # [B, T]
    chance = ((own_words * words).sum(-1) / n_words)[:, None]  # [B, 1]: one segment gives 1
    split = chance < 1
    corrected = xp.where(split, (share - chance) / xp.where(split, 1 - chance, 1.0), 0.0)
    return mean(v_rows), mean(d_rows), corrected


def classify_patterns(v, d, b, paired, t: PatternThresholds = PatternThresholds()) -> np.ndarray:
    """Pattern index (into PATTERNS) of every map from its (v, d, b); arrays of any one shape, and
    `paired` (two-segment input) a bool broadcastable to it.

    1. v + d ≥ structured: vertical if d < minor_share·(v + d), diagonal if v < minor_share·(v + d),
       otherwise vertical+diagonal;
    2. else, for two-segment inputs, block if b (chance-corrected) ≥ block;
    3. else heterogeneous. Block is not defined for single-segment inputs (SST-2).
    """
    v, d, b = (np.asarray(x, float) for x in (v, d, b))
    structured = v + d
    codes = np.full(v.shape, PATTERNS.index("heterogeneous"))
    codes[np.broadcast_to(paired, v.shape) & (b >= t.block)] = PATTERNS.index("block")
    mixed = structured >= t.structured
    codes[mixed] = PATTERNS.index("vertical+diagonal")
    codes[mixed & (v < t.minor_share * structured)] = PATTERNS.index("diagonal")
    codes[mixed & (d < t.minor_share * structured)] = PATTERNS.index("vertical")
    return codes


def column_mass(attn, real):
    """[..., B, H, T]: the attention each key receives from all real query rows, over n."""
    rows = real[:, None, :, None]
    n = real.sum(-1)[:, None, None]
    return (attn * rows).sum(-2) / n


def pattern_shares(counts: dict[str, np.ndarray]) -> pd.DataFrame:
    """Per task, the share of each class over all heads × examples; block's is NaN (undefined, not
    0%) for single-sentence tasks."""
    rows = []
    for task, per_head in counts.items():
        totals = per_head.sum(axis=(0, 1))
        paired = glue.task_spec(task).text_b is not None
        for pattern, maps in zip(PATTERNS, totals, strict=True):
            share = maps / totals.sum() if paired or pattern != "block" else np.nan
            rows.append({"task": task, "pattern": pattern, "maps": int(maps), "share": share})
    return pd.DataFrame(rows)
