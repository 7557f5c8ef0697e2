"""One-sided tests of per-sequence sieve bias scores, τ selection, multiple-test corrections.

Everything is vectorised over the axes other than the sample axis, so one call tests every
(layer, head) of a role at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from bertjax.errors import UserError
from sieves.choices import TESTS, Correction, Test

CI_LEVEL = 0.95
# Replicates of the bootstrap-t test and of the onset intervals (docs/roles.md, docs/tracking.md).
BOOTSTRAP_REPLICATES = 1000


@dataclass(frozen=True)
class TestResult:
    """Per-test arrays (the input's shape without the sample axis).

    `std` has ddof=1; `ci_low`/`ci_high` bound a two-sided 95% interval of the mean; `lower_bound`
    is the one-sided (1 − α) lower confidence bound that matches the test: without a correction
    the test rejects H0 (p < α) exactly when `lower_bound` > τ, which the two-sided interval does
    not say (it is a 97.5% one-sided bound). `statistic` is t (or z) and `p_value` the one-sided p
    of H1: mean > τ.
    """

    __test__ = False  # not a pytest test class, despite the name

    n: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    statistic: np.ndarray
    p_value: np.ndarray
    lower_bound: np.ndarray


def one_sided_test(
    x: np.ndarray,
    tau: float,
    axis: int = 0,
    test: Test = "t",
    alpha: float = 0.05,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = 0,
) -> TestResult:
    """Test H0: mean ≤ τ against H1: mean > τ along `axis` of `x` (NaN-free samples).

    The t-test equals `scipy.stats.ttest_1samp(x, tau, alternative="greater")`; the z-test uses the
    normal tail with the sample SD; `bootstrap` is the bootstrap-t test (`bootstrap_t_test`), which
    does not lean on normality. A sample with n < 2 or zero variance gets statistic and p NaN.
    """
    if test not in TESTS:
        raise ValueError(f"test must be one of {', '.join(TESTS)}, got {test!r}")
    if test == "bootstrap":
        return bootstrap_t_test(x, tau, axis=axis, alpha=alpha, replicates=replicates, seed=seed)
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, 0)
    n = x.shape[0]
    shape = x.shape[1:]
    if n < 2:
        nan = [np.full(shape, np.nan) for _ in range(6)]
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
        quantile, one_sided = stats.t.ppf([0.5 + CI_LEVEL / 2, 1 - alpha], n - 1)
    else:
        p_value = special.ndtr(-statistic)
        quantile, one_sided = stats.norm.ppf([0.5 + CI_LEVEL / 2, 1 - alpha])
    return TestResult(
        n=np.full(shape, n),
        mean=mean,
        std=std,
        ci_low=mean - quantile * se,
        ci_high=mean + quantile * se,
        statistic=statistic,
        p_value=p_value,
        lower_bound=mean - one_sided * se,
    )


def resample_weights(n: int, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """[replicates, n] counts of each of n items in a bootstrap resample of size n (a multinomial
    draw, the same distribution as n draws with replacement)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(np.float64)


def weighted_moments(weights: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per resample (rows of `weights`, [B, n]) of the samples x [n, K]: the size [B], the mean and
    the SD with ddof 1 [B, K]. Computed about the sample's own mean, so the sums of squares keep
    their precision when the scores are far from 0."""
    k = x.shape[1]
    centre = x.mean(axis=0) if x.shape[0] else np.zeros(k)
    xc = x - centre
    # One product for the counts, the sums and the sums of squares.
    sums = weights @ np.concatenate([np.ones((x.shape[0], 1)), xc, xc * xc], axis=1)
    size = sums[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_c = sums[:, 1 : 1 + k] / size[:, None]
        var = (sums[:, 1 + k :] - size[:, None] * mean_c**2) / (size[:, None] - 1)
    return size, centre + mean_c, np.sqrt(np.maximum(var, 0.0))


def bootstrap_t_test(
    x: np.ndarray,
    tau: float,
    axis: int = 0,
    alpha: float = 0.05,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = 0,
) -> TestResult:
    """The bootstrap-t test of H0: mean ≤ τ (Efron & Tibshirani 1993, ch. 12 and 16).

    The t statistic's null distribution is read from B resamples of the sample itself,
    t*_b = (mean*_b − mean) / se*_b, instead of Student's t: p = (1 + #{t*_b ≥ t}) / (B + 1),
    the lower bound mean − q* · se with q* the order statistic of t* at which p crosses α, and the
    two-sided 95% interval mean − q*_{0.975} · se,
    mean − q*_{0.025} · se. One set of resamples (seeded) serves every test along the other axes, so
    heads are compared on the same resamples. n, mean, SD and t are the t-test's.
    """
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, 0)
    plain = one_sided_test(x, tau, axis=0, test="t", alpha=alpha)
    n, shape = x.shape[0], x.shape[1:]
    if n < 2:
        return plain
    flat = x.reshape(n, -1)
    weights = resample_weights(n, replicates, np.random.default_rng(seed))
    size, mean, std = weighted_moments(weights, flat)
    se = plain.std.reshape(-1) / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = (mean - plain.mean.reshape(-1)) / (std / np.sqrt(size[:, None]))
    # A resample of one repeated value has no t: it counts as not exceeding t.
    t_star = np.where(np.isfinite(t_star), t_star, -np.inf)
    t = plain.statistic.reshape(-1)
    exceed = (t_star >= t[None, :]).sum(axis=0)
    p_value = np.where(np.isnan(t), np.nan, (1.0 + exceed) / (replicates + 1.0))
    q_low, q_high = np.quantile(t_star, [0.5 - CI_LEVEL / 2, 0.5 + CI_LEVEL / 2], axis=0)
    # The bound's quantile is the order statistic of the p-value's rule, so that p < α exactly
    # when the bound exceeds τ: p < α ⟺ #{t* ≥ t} ≤ k ⟺ t > the (k + 1)-th largest t*.
    k = math.ceil(alpha * (replicates + 1) - 1) - 1
    descending = -np.sort(-t_star, axis=0)
    q_one = descending[k] if k >= 0 else np.full(t_star.shape[1], np.inf)
    untestable = np.isnan(t)
    centre = plain.mean.reshape(-1)

    def bound(values: np.ndarray) -> np.ndarray:
        return np.where(untestable, np.nan, values).reshape(shape)

    return TestResult(
        n=plain.n,
        mean=plain.mean,
        std=plain.std,
        ci_low=bound(centre - q_high * se),
        ci_high=bound(centre - q_low * se),
        statistic=plain.statistic,
        p_value=p_value.reshape(shape),
        lower_bound=bound(centre - q_one * se),
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


def adjust_pvalues(p: np.ndarray, method: Correction) -> np.ndarray:
    """Holm or Benjamini–Hochberg adjusted p-values over all entries of `p` as one family.

    NaN p-values (untestable heads) are left out of the family and stay NaN.
    """
    p = np.asarray(p, dtype=np.float64)
    return adjust_pvalue_rows(p.reshape(1, -1), method).reshape(p.shape)


def adjust_pvalue_rows(p: np.ndarray, method: Correction) -> np.ndarray:
    """`adjust_pvalues` of each row of p [R, m] as its own family, at once (the onset intervals
    adjust every bootstrap replicate's p-values). NaNs stay NaN and are out of their row's family."""
    p = np.asarray(p, dtype=np.float64)
    if method == "none":
        return p.copy()
    if method not in ("holm", "bh"):
        raise ValueError(f"method must be 'none', 'holm' or 'bh', got {method!r}")
    untested = np.isnan(p)
    m = (~untested).sum(axis=1, keepdims=True)
    # NaNs sort last (as +inf), so the first m of each row are its family in ascending order.
    order = np.argsort(np.where(untested, np.inf, p), axis=1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=1)
    rank = np.arange(1, p.shape[1] + 1)[None, :]
    in_family = rank <= m
    if method == "holm":
        scaled = np.where(in_family, np.minimum(1.0, (m - rank + 1) * ranked), 0.0)
        adjusted = np.maximum.accumulate(scaled, axis=1)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.where(in_family, np.minimum(1.0, m / rank * ranked), np.inf)
        adjusted = np.minimum.accumulate(scaled[:, ::-1], axis=1)[:, ::-1]
    adjusted = np.where(in_family, adjusted, np.nan)
    out = np.empty_like(p)
    np.put_along_axis(out, order, adjusted, axis=1)
    return out


def assign(p: np.ndarray, alpha: float) -> np.ndarray:
    """Which tests assign the role: p < α; a NaN p never does."""
    return np.asarray(p, dtype=np.float64) < alpha
