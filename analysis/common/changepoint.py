"""Where a training curve changes fastest: segmented least squares in log step, with intervals.

A curve (held-out MLM loss, SAS, a role's count of heads) is read at its evaluation steps s_i, on
x_i = ln(1 + s_i): evaluations are log-spaced early in a run, and a change per e-fold of steps is
what is comparable between the start and the end of a run.

**The rule** (fixed before any result was read; docs/tracking.md):

1. Fit y by k straight segments, each over ≥ `MIN_POINTS` consecutive evaluations, for every
   k = 1 … `MAX_SEGMENTS`, each by exact least squares (dynamic programming over the segment
   boundaries, as in Bellman 1961 / Jackson et al. 2005's segmented regression); keep the k of the
   smallest BIC, n·ln(RSS/n) + (3k − 1)·ln n (two coefficients per segment and k − 1 boundaries).
2. The changepoint is the start of the segment whose slope improves the curve fastest (the most
   negative slope for a falling curve such as the loss, the most positive for a rising one): its
   first evaluation (`first`) and the evaluation before it (`before`). The change began after
   `before` and by `first`. One segment (no change) or a best segment that does not improve has
   no changepoint.

**Intervals.** The fit's residuals r_i are resampled by the wild bootstrap (y*_i = ŷ_i + v_i·r_i,
v_i = ±1 with equal probability: Wu 1986, Liu 1988), which keeps each evaluation's own noise level;
every replicate is refitted by the whole rule, k included. The interval is [5% quantile of
`before`, 95% quantile of `first`] over the replicates with a changepoint, and the share without
one is reported. A curve that comes with its own replicates (a role count under the paired
resampling of sequences, `analysis.heads.intervals`) is refitted replicate by replicate instead.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

MAX_SEGMENTS = 4
MIN_POINTS = 3
INTERVAL = (0.05, 0.95)
# Replicates fitted at once: the segment costs are a [chunk, n, n] array.
CHUNK = 128


@dataclasses.dataclass(frozen=True)
class Changepoint:
    """One curve's changepoint (indices into its steps; -1: none) and, over replicates, its interval."""

    first: int  # the first evaluation of the steepest segment
    before: int  # the evaluation before it (-1 when the steepest segment starts the curve)
    segments: int
    slope: float  # the steepest segment's slope per e-fold of (1 + step), in the curve's units
    low: int | None = None  # the interval: indices; None without replicates, -1 when unbounded
    high: int | None = None
    no_change_share: float | None = None
    # The whole fit: each segment's first evaluation (index) and slope per e-fold, in order.
    fit: tuple[tuple[int, float], ...] = ()
    # Misfit: the lag-1 autocorrelation of the fit's residuals (near 0 for a model that fits; a
    # residual bootstrap is then sound) and whether BIC chose the most segments allowed (the cap,
    # not the data, decided how many).
    residual_lag1: float = float("nan")
    cap_bound: bool = False


def log_steps(steps) -> np.ndarray:
    return np.log1p(np.asarray(steps, dtype=np.float64))


def segment_costs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For curves y [R, n] on x [n]: the residual sum of squares [R, n, n] of the least-squares
    line through points i..j (inclusive) at [:, i, j], and its slope; +inf where j − i + 1 <
    MIN_POINTS. From cumulative sums, each about the segment's own means (no cancellation worth
    the name at the curves' sizes: n ≤ a few hundred points)."""
    r, n = y.shape
    zero = np.zeros((r, 1))

    def cum(v: np.ndarray) -> np.ndarray:
        return np.concatenate([zero, np.cumsum(v, axis=1)], axis=1)

    xs = np.broadcast_to(x, y.shape)
    s1, sx, sxx = cum(np.ones_like(y)), cum(xs), cum(xs * xs)
    sy, sxy, syy = cum(y), cum(xs * y), cum(y * y)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]

    def seg(c: np.ndarray) -> np.ndarray:  # Σ over i..j of the summed quantity, [R, n, n]
        return c[:, None, 1:] - c[:, :-1, None]

    count, mx, my = seg(s1), seg(sx), seg(sy)
    with np.errstate(divide="ignore", invalid="ignore"):
        vxx = seg(sxx) - mx * mx / count
        vxy = seg(sxy) - mx * my / count
        vyy = seg(syy) - my * my / count
        slope = vxy / vxx
        rss = np.maximum(vyy - vxy * slope, 0.0)
    valid = np.broadcast_to(j - i + 1 >= MIN_POINTS, rss.shape)
    return np.where(valid, rss, np.inf), np.where(valid, slope, np.nan)


def best_segmentation(x: np.ndarray, y: np.ndarray, max_segments: int = MAX_SEGMENTS, costs=None):
    """Per curve of y [R, n]: the BIC-best number of segments k [R] and the start index of each
    segment [R, max_segments] (-1 past k), by exact dynamic programming (`costs`: the curves'
    `segment_costs`, when already computed)."""
    r, n = y.shape
    costs = segment_costs(x, y)[0] if costs is None else costs
    kmax = max(1, min(max_segments, n // MIN_POINTS))
    # best[k][:, j]: the least RSS of points 0..j in k + 1 segments; arg: the last segment's start.
    best = [costs[:, 0, :]]
    arg = [np.zeros((r, n), dtype=np.int64)]
    for _ in range(1, kmax):
        # Last segment i..j after the best split of 0..i−1: prev[:, i − 1] + costs[:, i, j].
        prev = np.concatenate([np.full((r, 1), np.inf), best[-1][:, :-1]], axis=1)  # [R, i]
        total = prev[:, :, None] + costs  # [R, i, j]
        arg.append(np.argmin(total, axis=1))
        best.append(np.min(total, axis=1))
    rss = np.stack([b[:, -1] for b in best], axis=1)  # [R, kmax]
    k = np.arange(1, kmax + 1)
    # A perfect fit (RSS 0, e.g. a step count fitted exactly) must not win by ln 0 = −inf alone:
    # the floor is rounding's, relative to the curve's spread.
    floor = 1e-12 * np.maximum(np.var(y, axis=1, keepdims=True) * n, 1e-300)
    with np.errstate(divide="ignore"):
        bic = n * np.log(np.maximum(rss, floor) / n) + (3 * k - 1) * np.log(n)
    bic = np.where(np.isfinite(rss), bic, np.inf)
    chosen = np.argmin(bic, axis=1) + 1  # the fewest segments on a tie
    # Back from the last point, every curve at once: segment `level` starts where the best split
    # of level + 1 segments ending at `end` put it.
    starts = np.full((r, max_segments), -1, dtype=np.int64)
    rows, end = np.arange(r), np.full(r, n - 1)
    for level in range(kmax - 1, -1, -1):
        active = chosen > level
        start = arg[level][rows, end] if level else np.zeros(r, dtype=np.int64)
        starts[active, level] = start[active]
        end = np.where(active, start - 1, end)
    return chosen, starts


def changepoints(x: np.ndarray, y: np.ndarray, falling: bool, max_segments: int = MAX_SEGMENTS):
    """Per curve of y [R, n]: (first, before, segments, slope) arrays [R] of the rule above
    (first = -1: no changepoint)."""
    y = -y if falling else y
    r, n = y.shape
    first = np.full(r, -1, dtype=np.int64)
    slopes = np.full(r, np.nan)
    segments = np.zeros(r, dtype=np.int64)
    for lo in range(0, r, CHUNK):
        part = y[lo : lo + CHUNK]
        costs, slope = segment_costs(x, part)
        chosen, starts = best_segmentation(x, part, max_segments, costs)
        rows = np.arange(part.shape[0])[:, None]
        valid = starts >= 0
        ends = np.where(np.roll(valid, -1, axis=1) & (np.arange(max_segments) < max_segments - 1),
                        np.roll(starts, -1, axis=1) - 1, n - 1)  # fmt: skip
        rates = np.where(valid, slope[rows, np.maximum(starts, 0), ends], -np.inf)
        best = np.argmax(rates, axis=1)
        best_rate = rates[rows[:, 0], best]
        found = (chosen > 1) & (best_rate > 0)
        segments[lo : lo + len(part)] = chosen
        first[lo : lo + len(part)] = np.where(found, starts[rows[:, 0], best], -1)
        slopes[lo : lo + len(part)] = np.where(found, -best_rate if falling else best_rate, np.nan)
    before = np.where(first > 0, first - 1, -1)
    return first, before, segments, slopes


def fitted_values(x: np.ndarray, y: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The segmented fit of one curve y [n] with segments starting at `starts`."""
    out = np.empty_like(y)
    bounds = [*starts, len(y)]
    for a, b in itertools.pairwise(bounds):
        slope, intercept = np.polyfit(x[a:b], y[a:b], 1)
        out[a:b] = intercept + slope * x[a:b]
    return out


def lag1_autocorrelation(residual: np.ndarray) -> float:
    """Σ r_i r_(i+1) / Σ r_i² of residuals in evaluation order (NaN for a perfect fit)."""
    total = float(np.sum(residual * residual))
    if total <= 0:
        return float("nan")
    return float(np.sum(residual[1:] * residual[:-1]) / total)


def interval(first: np.ndarray, before: np.ndarray) -> tuple[int, int, float]:
    """(low, high, no_change_share) over replicates: low the 5% quantile of `before` (-1: the
    change may precede the first evaluation), high the 95% quantile of `first`; both -1 when no
    replicate has a changepoint. A replicate without one counts as "later than any step" for high
    (so high is -1, unbounded, when more than 5% have none)."""
    has = first >= 0
    share = float(1.0 - has.mean())
    if not has.any():
        return -1, -1, share
    big = np.iinfo(np.int64).max
    low = int(np.quantile(before[has], INTERVAL[0], method="inverted_cdf"))
    ordered = np.where(has, first, big)
    high = int(np.quantile(ordered, INTERVAL[1], method="inverted_cdf"))
    return low, (-1 if high == big else high), share


def curve_changepoint(
    steps,
    values,
    falling: bool,
    replicates: int,
    seed: int,
    curve_replicates: np.ndarray | None = None,
    max_segments: int = MAX_SEGMENTS,
) -> Changepoint | None:
    """The rule on one curve, with the wild-bootstrap interval (or one from `curve_replicates`
    [R, n], the curve under resampling of its own data); None with under 2·MIN_POINTS points."""
    x = log_steps(steps)
    y = np.asarray(values, dtype=np.float64)[None, :]
    if y.shape[1] < 2 * MIN_POINTS or not np.all(np.isfinite(y)):
        return None
    first, before, segments, slope = changepoints(x, y, falling, max_segments)
    chosen, starts = best_segmentation(x, -y if falling else y, max_segments)
    begins = starts[0, : chosen[0]]
    _, slopes = segment_costs(x, y)
    ends = np.append(begins[1:] - 1, y.shape[1] - 1)
    fit = tuple((int(b), float(slopes[0, b, e])) for b, e in zip(begins, ends, strict=True))
    fitted = fitted_values(x, y[0], begins)
    residual = y[0] - fitted
    kmax = max(1, min(max_segments, y.shape[1] // MIN_POINTS))
    point = Changepoint(
        int(first[0]),
        int(before[0]),
        int(segments[0]),
        float(slope[0]),
        fit=fit,
        residual_lag1=lag1_autocorrelation(residual),
        cap_bound=bool(segments[0] == kmax > 1),
    )
    if curve_replicates is None and replicates > 0:
        fit = fitted
        signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(replicates, y.shape[1]))
        curve_replicates = fit[None, :] + signs * residual[None, :]
    if curve_replicates is None:
        return point
    rep_first, rep_before, _, _ = changepoints(x, np.asarray(curve_replicates, np.float64), falling, max_segments)
    low, high, share = interval(rep_first, rep_before)
    return dataclasses.replace(point, low=low, high=high, no_change_share=share)
