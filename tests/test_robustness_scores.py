"""The robustness table under both scores (analysis.heads.robustness): the other score derived from
the same attention equals the kernel's own (analysis.heads.scoring.convert_score), and a planted
series whose threshold reading flips under one score only is reported as such, while the event
readings, which no rescaling moves, hold under both."""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd

from analysis.heads import events, robustness, scoring
from analysis.heads.summary import DEFAULT_COARSE
from sieves.kernel import REFERENCE_LENGTH, sieve_scores


def _kernel_inputs(rng, batch=6, length=20, roles=3, layers=2, heads=3):
    lengths = rng.integers(5, length + 1, batch)
    real = np.arange(length)[None, :] < lengths[:, None]
    logits = rng.normal(size=(layers, batch, heads, length, length))
    logits = np.where(real[None, :, None, None, :], logits, -np.inf)
    attention = np.exp(logits - logits.max(-1, keepdims=True))
    attention /= attention.sum(-1, keepdims=True)
    rows = rng.random((roles, batch, length)) < 0.6
    sieves = rng.random((roles, batch, length, length)) < 0.3
    sieves[..., 0] = True  # every row's sieve non-empty
    rows &= real[None]
    sieves &= real[None, :, None, :]
    return attention, real, rows, sieves, lengths


def test_the_other_score_derived_per_sequence_equals_the_kernels_own():
    rng = np.random.default_rng(0)
    attention, real, rows, sieves, lengths = _kernel_inputs(rng)
    weights = rng.random(attention.shape[:-1])  # key weights: the norm-weighted reading too
    with jax.enable_x64(True):
        for key_weights in (None, weights):
            beta = np.asarray(sieve_scores(attention, real, rows, sieves, key_weights=key_weights)[0])
            share, _ = sieve_scores(attention, real, rows, sieves, key_weights=key_weights,
                                    reference_length=REFERENCE_LENGTH)  # fmt: skip
            share = np.asarray(share)
            index = np.arange(len(lengths))
            result = {"t": scoring.TaskScores({"r": beta[0]}, {"r": index}, [], len(index))}
            derived = scoring.convert_score(result, {"t": lengths}, "share")["t"].scores["r"]
            # float64 throughout: the two differ by rounding of one division per row.
            np.testing.assert_allclose(derived, share[0], rtol=1e-12)
            back = scoring.convert_score({"t": scoring.TaskScores({"r": share[0]}, {"r": index}, [], len(index))},
                                         {"t": lengths}, "beta")["t"].scores["r"]  # fmt: skip
            np.testing.assert_allclose(back, beta[0], rtol=1e-12)
    # The example indices pick each sequence's length: a sequence scored out of order keeps its own.
    order = np.array([2, 0, 1])
    shuffled = {"t": scoring.TaskScores({"r": beta[0][order]}, {"r": order}, [], 3)}
    derived = scoring.convert_score(shuffled, {"t": lengths}, "share")["t"].scores["r"]
    np.testing.assert_allclose(derived, share[0][order], rtol=1e-12)


STEPS = [1, 3, 10, 31, 96, 300, 1000]
# β of one prev head: low until step 96, then 9; its share at n = 16 is β · 128 / 16 = 8 β.
BETA = np.array([1.5, 1.5, 1.6, 1.7, 2.0, 9.0, 9.0])
FACTOR = REFERENCE_LENGTH / 16


def _scored(means: np.ndarray, rng) -> robustness.Scored:
    track = pd.DataFrame({"step": STEPS, "task": "mrpc", "layer": 0, "head": 0, "role": "prev", "n": 200,
                          "mean": means, "std": 0.1 * means})  # fmt: skip
    rows = track[["task", "layer", "head", "role"]].iloc[:1]
    replicates = means[None, :, None] * (1 + 0.005 * rng.standard_normal((100, 1, 1)))
    return robustness.Scored(track, events.trajectories(rows, STEPS, means[:, None], replicates))


def _heldout():
    """A loss falling fast around step 30 at 40 evaluations, with small noise."""
    steps = np.unique(np.round(np.geomspace(1, 1000, 40))).astype(int)
    x = np.log1p(steps)
    loss = 9 - 5 / (1 + np.exp(-(x - 3.4) / 0.15)) + 0.01 * np.random.default_rng(1).standard_normal(x.size)
    return pd.DataFrame({"heldout_mlm_loss": loss}, index=pd.Index(steps, name="step"))


def test_a_threshold_reading_that_flips_under_one_score_is_not_robust():
    rng = np.random.default_rng(2)
    scored = {"beta": _scored(BETA, rng), "share": _scored(FACTOR * BETA, rng)}
    table = robustness.robustness(scored, _heldout(), {}, 2, 0.05, "none", "t", 200, 0, dict(DEFAULT_COARSE))
    assert list(table.columns) == robustness.COLUMNS
    onset = table[table["reading"] == "onset"]
    # β passes every τ only at step 300, after the loss's drop; 8 β passes them all from step 1.
    assert set(onset.loc[onset["score"] == "beta", "relation"]) == {"after"}
    assert set(onset.loc[onset["score"] == "share", "relation"]) == {"before"}
    assert len(onset[onset["score"] == "beta"]) == len(onset[onset["score"] == "share"]) == 4 * 4
    # The rise is the same shape under both: its events, and their relation, do not move.
    rise = table[table["reading"] == "rise_50"]
    assert set(rise["relation"]) == {"after"} and set(rise["score"]) == {"beta", "share"}
    lines = robustness.summary_lines(table)
    assert "  mrpc local onset: not robust (after 16, before 16 of 32 variants) (beta: after under all 16 " \
           "variants; share: before under all 16 variants)" in lines  # fmt: skip
    assert "  mrpc local rise_50: after under all 8 variants" in lines
    # One score alone: its relation holds under all of its variants, as before the score column.
    alone = robustness.robustness({"beta": scored["beta"]}, _heldout(), {}, 2, 0.05, "none", "t", 200, 0,
                                  dict(DEFAULT_COARSE))  # fmt: skip
    assert "  mrpc local onset: after under all 16 variants" in robustness.summary_lines(alone)
    pd.testing.assert_frame_equal(alone.reset_index(drop=True),
                                  table[table["score"] == "beta"].reset_index(drop=True))  # fmt: skip
