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

**The smooth model beside it.** A change that is gradual in log step is described by four
numbers, not by 3k − 1: the logistic y = a + d·σ((x − m)/w) (σ the logistic function; a falling
curve read negated, as above), fitted by least squares (Levenberg–Marquardt). Its width w is at
least the median spacing of the evaluations on x, so that its 10–90% rise (2·ln 9·w ≈ 4.4·w)
spans several of them: a sharper rise is a step, which the grid does not resolve and the
piecewise fit describes (unbounded, the logistic fits a step as well as two segments do, with
fewer parameters, and would always win). Its 10%, 50%
and 90% times are where it has covered that share of its rise d from the lower asymptote a:
x_p = m + w·ln(p / (1 − p)); a fit that does not rise (d ≤ 0) has none, and a time outside the
evaluations' span is not reported (the model's extrapolation, not the data). It fits better than
the piecewise fit when its BIC, n·ln(RSS/n) + 4·ln n, is below the piecewise fit's. Its intervals
come from the same replicates as the changepoint's (the curve's own resampled sequences, or the
wild bootstrap with the same signs on the smooth fit's residuals), each refitted: the 5% and 95%
quantiles of each time, a replicate without a rise counting as later than any step.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from scipy import special

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
    # The smooth model (the module doc): its fit, and whether BIC prefers it to the piecewise one.
    smooth: SmoothFit | None = None
    smooth_better: bool | None = None


@dataclasses.dataclass(frozen=True)
class SmoothFit:
    """The logistic fit of one curve: its 10/50/90% times in steps [3] (NaN: no rise, or outside the
    evaluations), their interval bounds [3] over replicates (NaN: none, or below the first / past the
    last evaluation, or without replicates), the parameters (a, d, m, θ) on x, w = `floor` + e^θ,
    and the RSS."""

    steps: np.ndarray
    low: np.ndarray
    high: np.ndarray
    parameters: np.ndarray
    rss: float
    floor: float


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
    bic = information_criterion(rss, y[:, None, :], 3 * k - 1)
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


def information_criterion(rss: np.ndarray | float, y: np.ndarray, parameters: np.ndarray | int) -> np.ndarray:
    """BIC, n·ln(RSS/n) + parameters·ln n, of fits with residual sums `rss` to curves y [..., n]
    (+inf where the RSS is not finite)."""
    n = y.shape[-1]
    # A perfect fit (RSS 0, e.g. a step count fitted exactly) must not win by ln 0 = −inf alone:
    # the floor is rounding's, relative to the curve's spread.
    floor = 1e-12 * np.maximum(np.var(y, axis=-1) * n, 1e-300)
    with np.errstate(divide="ignore"):
        bic = n * np.log(np.maximum(rss, floor) / n) + np.asarray(parameters) * np.log(n)
    return np.where(np.isfinite(rss), bic, np.inf)


SMOOTH_LEVELS = (0.1, 0.5, 0.9)
SMOOTH_PARAMETERS = 4
# Levenberg–Marquardt, every curve at once: a fixed budget of steps, each accepted only where it
# lowers that curve's RSS (ending where none does for any curve).
LM_ITERATIONS = 200


def logistic(x: np.ndarray, parameters: np.ndarray, floor: float) -> np.ndarray:
    """a + d·σ((x − m)/w), w = floor + e^θ, at x [n] for parameters [R, 4] (a, d, m, θ): [R, n]."""
    a, d, m, theta = (parameters[:, i : i + 1] for i in range(SMOOTH_PARAMETERS))
    return a + d * special.expit((x[None, :] - m) / (floor + np.exp(theta)))


def _jacobian(x: np.ndarray, parameters: np.ndarray, floor: float) -> np.ndarray:
    d, m, theta = parameters[:, 1:2], parameters[:, 2:3], parameters[:, 3:4]
    width = floor + np.exp(theta)
    z = (x[None, :] - m) / width
    s = special.expit(z)
    slope = d * s * (1 - s)
    return np.stack([np.ones_like(s), s, -slope / width, -slope * z * np.exp(theta) / width], axis=-1)  # [R, n, 4]


def width_floor(x: np.ndarray) -> float:
    """The smallest width of the smooth model on evaluations at x: their median spacing."""
    return float(np.median(np.diff(x)))


def fit_logistic(x: np.ndarray, y: np.ndarray, start: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares logistic fits (width at least `floor`) of curves y [R, n] on x [n] from
    `start` [R, 4]: (parameters [R, 4], RSS [R])."""
    params = np.array(start, dtype=np.float64)
    residual = logistic(x, params, floor) - y
    rss = np.sum(residual * residual, axis=1)
    damping = np.full(len(y), 1e-3)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for _ in range(LM_ITERATIONS):
            jac = _jacobian(x, params, floor)
            normal = np.einsum("rni,rnj->rij", jac, jac)
            gradient = np.einsum("rni,rn->ri", jac, residual)
            # Marquardt's scaling by the normal matrix's diagonal, with a floor so that a flat curve
            # (d = 0: no information on m and w) still gives a solvable system.
            diagonal = np.einsum("rii->ri", normal)
            scale = damping[:, None] * np.maximum(diagonal, 1e-12 * (1 + diagonal.max(axis=1, keepdims=True)))
            system = normal + scale[:, :, None] * np.eye(SMOOTH_PARAMETERS)[None]
            step = -np.linalg.solve(system, gradient[..., None])[..., 0]
            trial = params + step
            trial_residual = logistic(x, trial, floor) - y
            trial_rss = np.sum(trial_residual * trial_residual, axis=1)
            better = np.isfinite(trial_rss) & (trial_rss < rss)
            if not better.any():
                break
            params = np.where(better[:, None], trial, params)
            residual = np.where(better[:, None], trial_residual, residual)
            rss = np.where(better, trial_rss, rss)
            damping = np.where(better, damping / 3, damping * 4)
    return params, rss


def logistic_starts(x: np.ndarray, y: np.ndarray, floor: float) -> np.ndarray:
    """Starting points for one rising curve y [n]: its range as the rise, the midpoint at each of
    several places along x, a width of an eighth of the span (at least twice `floor`): [starts, 4]."""
    low, high = float(np.min(y)), float(np.max(y))
    span = float(x[-1] - x[0])
    middles = np.linspace(x[0] + span / 8, x[-1] - span / 8, 7)
    theta = np.log(max(span / 8 - floor, floor))
    return np.array([[low, high - low, m, theta] for m in middles])


def level_positions(parameters: np.ndarray, floor: float) -> np.ndarray:
    """The 10/50/90% positions on x [R, 3] of logistic fits [R, 4]; NaN where d ≤ 0 (no rise)."""
    logit = np.log(np.array(SMOOTH_LEVELS) / (1 - np.array(SMOOTH_LEVELS)))
    positions = parameters[:, 2:3] + (floor + np.exp(parameters[:, 3:4])) * logit[None, :]
    return np.where(parameters[:, 1:2] > 0, positions, np.nan)


def quantile_interval(replicates: np.ndarray, interval=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, none_share) over the replicates (axis 0) of event values, at the quantiles
    `interval` (default `INTERVAL`): NaN, a replicate without the event, counts as later than any
    value, so `high` is NaN when more than 1 − interval[1] of them have none; `low` is NaN only when
    none has it."""
    lower, upper = INTERVAL if interval is None else interval
    none = np.isnan(replicates)
    ordered = np.where(none, np.inf, replicates)
    low = np.quantile(ordered, lower, axis=0, method="inverted_cdf")
    high = np.quantile(ordered, upper, axis=0, method="inverted_cdf")
    return np.where(np.isinf(low), np.nan, low), np.where(np.isinf(high), np.nan, high), none.mean(axis=0)


def _inside(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Positions on x as steps, NaN outside the evaluations' span."""
    return np.where((positions >= x[0]) & (positions <= x[-1]), np.expm1(positions), np.nan)


def smooth_fit(x: np.ndarray, y: np.ndarray, falling: bool) -> SmoothFit:
    """The smooth model of the module doc on one curve y [n] at x [n], without intervals."""
    v = -y if falling else y
    floor = width_floor(x)
    starts = logistic_starts(x, v, floor)
    params, rss = fit_logistic(x, np.broadcast_to(v, (len(starts), v.size)), starts, floor)
    best = int(np.argmin(np.where(np.isfinite(rss), rss, np.inf)))
    none = np.full(len(SMOOTH_LEVELS), np.nan)
    positions = level_positions(params[best : best + 1], floor)[0]
    return SmoothFit(_inside(x, positions), none, none, params[best], float(rss[best]), floor)


def smooth_interval(x: np.ndarray, found: SmoothFit, curve_replicates: np.ndarray, falling: bool) -> SmoothFit:
    """`found` with the interval of its times from the curve's replicates [R, n], each refitted
    from `found`'s parameters."""
    reps = np.asarray(curve_replicates, np.float64)
    start = np.broadcast_to(found.parameters, (len(reps), SMOOTH_PARAMETERS))
    fitted, _ = fit_logistic(x, -reps if falling else reps, start, found.floor)
    low, high, _ = quantile_interval(level_positions(fitted, found.floor))
    return dataclasses.replace(found, low=_inside(x, low), high=_inside(x, high))


def smooth_values(x: np.ndarray, found: SmoothFit, falling: bool) -> np.ndarray:
    """The smooth fit's values at x, in the curve's own sign."""
    values = logistic(x, found.parameters[None], found.floor)[0]
    return -values if falling else values


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
    smooth: bool = True,
) -> Changepoint | None:
    """The rule on one curve, with the wild-bootstrap interval (or one from `curve_replicates`
    [R, n], the curve under resampling of its own data), and the smooth model beside it unless
    `smooth` is False; None with under 2·MIN_POINTS points."""
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
    found = smooth_fit(x, y[0], falling) if smooth else None
    smooth_replicates = curve_replicates
    if curve_replicates is None and replicates > 0:
        signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(replicates, y.shape[1]))
        curve_replicates = fitted[None, :] + signs * residual[None, :]
        if found is not None:
            smooth_fitted = smooth_values(x, found, falling)
            smooth_replicates = smooth_fitted[None, :] + signs * (y[0] - smooth_fitted)[None, :]
    if found is not None:
        if smooth_replicates is not None:
            found = smooth_interval(x, found, smooth_replicates, falling)
        piecewise_bic = information_criterion(np.sum(residual * residual), y[0], 3 * point.segments - 1)
        point = dataclasses.replace(
            point, smooth=found,
            smooth_better=bool(information_criterion(found.rss, y[0], SMOOTH_PARAMETERS) < piecewise_bic),
        )  # fmt: skip
    if curve_replicates is None:
        return point
    rep_first, rep_before, _, _ = changepoints(x, np.asarray(curve_replicates, np.float64), falling, max_segments)
    low, high, share = interval(rep_first, rep_before)
    return dataclasses.replace(point, low=low, high=high, no_change_share=share)
