"""One-sided tests of per-sequence sieve bias scores, τ selection, multiple-test corrections.

Everything is vectorised over the axes other than the sample axis, so one call tests every
(layer, head) of a role at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import special, stats

from bertjax.errors import UserError

CI_LEVEL = 0.95


@dataclass(frozen=True)
class TestResult:
    """Per-test arrays (the input's shape without the sample axis).

    `std` has ddof=1; `ci_low`/`ci_high` bound a two-sided 95% interval of the mean; `statistic`
    is t (or z) and `p_value` the one-sided p of H1: mean > τ.
    """

    __test__ = False  # not a pytest test class, despite the name

    n: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    statistic: np.ndarray
    p_value: np.ndarray


def one_sided_test(x: np.ndarray, tau: float, axis: int = 0, test: Literal["t", "z"] = "t") -> TestResult:
    """Test H0: mean ≤ τ against H1: mean > τ along `axis` of `x` (NaN-free samples).

    The t-test equals `scipy.stats.ttest_1samp(x, tau, alternative="greater")`; the z-test uses the
    normal tail with the sample SD. A sample with n < 2 or zero variance gets statistic and p NaN.
    """
    if test not in ("t", "z"):
        raise ValueError(f"test must be 't' or 'z', got {test!r}")
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, 0)
    n = x.shape[0]
    shape = x.shape[1:]
    if n < 2:
        nan = [np.full(shape, np.nan) for _ in range(5)]
        mean = x[0].copy() if n else np.full(shape, np.nan)
        return TestResult(np.full(shape, n), mean, *nan)
    mean = x.mean(axis=0)
    # Exact constancy, not a variance threshold: rounding in the mean makes the variance of a
    # constant sample tiny but non-zero, which would give an absurd t.
    constant = np.all(x == x[:1], axis=0)
    std = np.where(constant, 0.0, x.std(axis=0, ddof=1))
    se = std / math.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        statistic = np.where(constant, np.nan, (mean - tau) / se)
    if test == "t":
        p_value = special.stdtr(n - 1, -statistic)
        quantile = stats.t.ppf(0.5 + CI_LEVEL / 2, n - 1)
    else:
        p_value = special.ndtr(-statistic)
        quantile = stats.norm.ppf(0.5 + CI_LEVEL / 2)
    return TestResult(
        n=np.full(shape, n),
        mean=mean,
        std=std,
        ci_low=mean - quantile * se,
        ci_high=mean + quantile * se,
        statistic=statistic,
        p_value=p_value,
    )


def tau_auto(all_scores: Iterable[np.ndarray]) -> int:
    """The paper's τ: the smallest integer strictly greater than the pooled mean of all scores.

    Every per-sequence score of every head and role counts once; NaNs are ignored.
    """
    total = 0.0
    count = 0
    for scores in all_scores:
        scores = np.asarray(scores, dtype=np.float64)
        finite = ~np.isnan(scores)
        total += float(scores[finite].sum())
        count += int(finite.sum())
    if count == 0:
        raise UserError("--tau auto: there are no per-sequence scores to take the mean of")
    grand_mean = total / count
    if not math.isfinite(grand_mean):
        raise UserError(f"--tau auto: the mean of the per-sequence scores is {grand_mean}")
    return math.floor(grand_mean) + 1


def adjust_pvalues(p: np.ndarray, method: Literal["none", "holm", "bh"]) -> np.ndarray:
    """Holm or Benjamini–Hochberg adjusted p-values over all entries of `p` as one family.

    NaN p-values (untestable heads) are left out of the family and stay NaN.
    """
    p = np.asarray(p, dtype=np.float64)
    if method == "none":
        return p.copy()
    if method not in ("holm", "bh"):
        raise ValueError(f"method must be 'none', 'holm' or 'bh', got {method!r}")
    flat = p.ravel()
    tested = np.flatnonzero(~np.isnan(flat))
    m = tested.size
    order = tested[np.argsort(flat[tested], kind="stable")]
    ranked = flat[order]
    rank = np.arange(1, m + 1)
    if method == "holm":
        adjusted = np.maximum.accumulate(np.minimum(1.0, (m - rank + 1) * ranked))
    else:
        adjusted = np.minimum.accumulate(np.minimum(1.0, m / rank * ranked)[::-1])[::-1]
    out = np.full(flat.shape, np.nan)
    out[order] = adjusted
    return out.reshape(p.shape)


def assign(p: np.ndarray, alpha: float) -> np.ndarray:
    """Which tests assign the role: p < α; a NaN p never does."""
    return np.asarray(p, dtype=np.float64) < alpha
