"""When a trajectory rises, read from the trajectory itself: event times that need no threshold.

A head's mean score for a role along the analysed steps (or a training curve along its
evaluations) is read on x = ln(1 + step), as the changepoints are (`analysis.common.changepoint`).

**The rule** (fixed before any run was read with it; docs/tracking.md):

- The *early level* E is the trajectory's value at the first step of the window, the *final level*
  F its value at the last; the rise is F − E (for a falling curve such as the loss, the fall: the
  curve is read negated).
- `rise_10`, `rise_50`, `rise_90`: the step from which the trajectory stays at or above
  E + p·(F − E) (p = 0.1, 0.5, 0.9) to the end, interpolated linearly in x between the analysed
  step below that level and the first one at or above it. "Stays" makes a brief early excursion
  above the level no event; the trajectory ends at F, so each level is reached.
- `rise_start`: where the straight line in x through the 10% and 90% points meets the early
  level, x₁₀ − (x₉₀ − x₁₀)/8: the knot of a flat-then-rising description of the rise (the "lag
  time" of growth curves), no earlier than the window's first step.
- A trajectory with F ≤ E has no rise (`no_rise`, no event); one whose peak P lies further above
  F than half its rise above E, P − F > (P − E)/2, has lost most of what it gained (`falls_back`):
  its events are still those of its rise to F, and `peak_step` says where the peak was.

Every event is a smooth function of the trajectory's values where the crossings are unique, so
resampling the sequences behind those values (paired across steps: `analysis.heads.intervals`)
gives its interval: the 5% and 95% quantiles over the replicates, a replicate without a rise
counting as later than any step (`high` is then empty when more than 5% have none). None of it
depends on τ, α or the test.

**Lead and lag.** A role event against a curve event is the difference of the two in each jointly
drawn replicate (the analysis sequences and the held-out sequences resampled together: replicate b
of each), in steps; before / overlapping / after by whether that difference's interval lies below
zero, contains it or lies above it. The earliest event over a set of heads is the minimum over
the heads in each replicate.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pandas as pd

from analysis.common import changepoint
from analysis.common import heldout as heldout_io
from analysis.common.changepoint import INTERVAL
from analysis.heads.onset import ACCURACY_CURVE, LOSS_CURVE
from sieves import stats

EVENTS = ("rise_start", "rise_10", "rise_50", "rise_90")
LEVELS = (0.1, 0.5, 0.9)
EVENTS_CSV = "events.csv"
EVENT_COLUMNS = ["task", "layer", "head", "role", "event", "step", "low", "high", "status", "early", "final",
                 "peak_step", "no_rise_share"]  # fmt: skip
STATUS = ("rises", "falls_back", "no_rise")
CURVE_EVENTS_CSV = "curve_events.csv"
# The held-out curves read for events, and whether each falls as the model learns.
HELDOUT_CURVES = ((LOSS_CURVE, True), (ACCURACY_CURVE, False))


def log_steps(steps) -> np.ndarray:
    return np.log1p(np.asarray(steps, dtype=np.float64))


def event_positions(x: np.ndarray, y: np.ndarray, falling: bool = False) -> np.ndarray:
    """The events of each trajectory y [..., S] on x [S] (ln(1 + step), increasing), as positions on
    x [..., 4] in the order of `EVENTS`; NaN where the trajectory does not rise (F ≤ E or a
    non-finite value)."""
    v = -np.asarray(y, np.float64) if falling else np.asarray(y, np.float64)
    early, final = v[..., :1], v[..., -1:]
    rise = final - early
    usable = (rise[..., 0] > 0) & np.isfinite(v).all(axis=-1)
    size = v.shape[-1]
    out = np.full((*v.shape[:-1], len(EVENTS)), np.nan)
    crossings = []
    for p in LEVELS:
        level = early + p * rise
        above = v >= level
        # The first index from which every later value is at or above the level.
        trailing = np.argmin(above[..., ::-1], axis=-1)
        trailing = np.where(above.all(axis=-1), size, trailing)
        j = np.clip(size - trailing, 1, size - 1)
        lo = np.take_along_axis(v, (j - 1)[..., None], axis=-1)[..., 0]
        hi = np.take_along_axis(v, j[..., None], axis=-1)[..., 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.clip((level[..., 0] - lo) / (hi - lo), 0.0, 1.0)
        crossings.append(x[j - 1] + share * (x[j] - x[j - 1]))
    x10, _, x90 = crossings
    start = np.maximum(x10 - (x90 - x10) / 8, x[0])
    for i, value in enumerate((start, *crossings)):
        out[..., i] = np.where(usable, value, np.nan)
    return out


def statuses(y: np.ndarray, falling: bool = False) -> np.ndarray:
    """`STATUS` of each trajectory y [..., S] (the module doc's rule)."""
    v = -np.asarray(y, np.float64) if falling else np.asarray(y, np.float64)
    early, final, peak = v[..., 0], v[..., -1], v.max(axis=-1)
    rises = (final > early) & np.isfinite(v).all(axis=-1)
    falls_back = rises & (peak - final > (peak - early) / 2)
    return np.where(falls_back, "falls_back", np.where(rises, "rises", "no_rise"))


def to_steps(position: np.ndarray) -> np.ndarray:
    """Positions on x back to steps."""
    return np.expm1(position)


def quantile_interval(replicates: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`changepoint.quantile_interval` at this module's `INTERVAL`."""
    return changepoint.quantile_interval(replicates, INTERVAL)


@dataclasses.dataclass(frozen=True)
class Trajectories:
    """The events of m trajectories (`rows`: task, layer, head, role; or one curve): positions on
    x [m, 4] and, with replicates, [B, m, 4]; each trajectory's status, early and final level and
    the step of its peak."""

    rows: pd.DataFrame
    point: np.ndarray
    replicates: np.ndarray | None
    status: np.ndarray
    early: np.ndarray
    final: np.ndarray
    peak_step: np.ndarray


def trajectories(rows: pd.DataFrame, steps, means: np.ndarray, replicates: np.ndarray | None,
                 falling: bool = False) -> Trajectories:  # fmt: skip
    """The events of the trajectories `means` [S, m] at `steps`, and of their replicates
    [B, S, m] (None: no intervals)."""
    steps = np.asarray(steps)
    x = log_steps(steps)
    trajectory = means.T
    reps = None if replicates is None else event_positions(x, np.moveaxis(replicates, 1, 2), falling)
    shown = -trajectory if falling else trajectory
    peak = steps[np.argmax(np.where(np.isfinite(shown), shown, -np.inf), axis=1)]
    return Trajectories(rows.reset_index(drop=True), event_positions(x, trajectory, falling), reps,
                        statuses(trajectory, falling), trajectory[:, 0], trajectory[:, -1], peak)  # fmt: skip


def events_table(found: Trajectories) -> pd.DataFrame:
    """`events.csv` (or a curve's rows: `found.rows` names what each trajectory is): one row per
    trajectory and event, steps rounded to whole steps."""
    m = len(found.rows)
    low = high = np.full((m, len(EVENTS)), np.nan)
    none_share = np.full(m, np.nan)
    if found.replicates is not None:
        low, high, none = quantile_interval(found.replicates)
        none_share = none[:, 0]
    tiled = np.tile(np.arange(m), len(EVENTS))
    table = pd.concat(
        [found.rows.assign(event=event, step=to_steps(found.point[:, i]), low=to_steps(low[:, i]),
                           high=to_steps(high[:, i])) for i, event in enumerate(EVENTS)], ignore_index=True,
    ).assign(status=found.status[tiled], early=found.early[tiled], final=found.final[tiled],
             peak_step=found.peak_step[tiled], no_rise_share=none_share[tiled])  # fmt: skip
    for column in ("step", "low", "high"):
        table[column] = pd.array(np.round(table[column].to_numpy()), dtype="Int64")
    order = {e: i for i, e in enumerate(EVENTS)}
    keys = [c for c in ("curve", "task", "role", "layer", "head") if c in table] + ["event"]
    columns = [c for c in found.rows.columns] + [c for c in EVENT_COLUMNS if c not in ("task", "layer", "head", "role")]
    return table.sort_values(keys, kind="stable", key=lambda c: c.map(order) if c.name == "event" else c)[columns]


def relation_of_difference(low: float, high: float) -> str:
    """before / overlapping / after of a difference's interval (role event − curve event) against
    zero; empty when either bound is missing (an event some replicates lack)."""
    if pd.isna(low) or pd.isna(high):
        return ""
    if high < 0:
        return "before"
    if low > 0:
        return "after"
    return "overlapping"


def difference(role_steps: np.ndarray, curve_steps: np.ndarray) -> tuple[float, float, float]:
    """(median, low, high) of role − curve over jointly drawn replicates [B] (in steps; NaN where a
    replicate lacks either event, and then the bounds follow `quantile_interval`: a missing role
    event is later than any)."""
    diff = role_steps - curve_steps
    diff = np.where(np.isnan(curve_steps), np.nan, diff)
    low, high, _ = quantile_interval(diff[:, None])
    middle = np.nanmedian(diff) if np.isfinite(diff).any() else np.nan
    return float(middle), float(low[0]), float(high[0])


def earliest(replicates: np.ndarray) -> np.ndarray:
    """The earliest event over a set of heads in each replicate: replicates [B, h] → [B] (NaN
    where no head of the set has the event)."""
    filled = np.where(np.isnan(replicates), np.inf, replicates)
    first = filled.min(axis=1) if filled.shape[1] else np.full(filled.shape[0], np.inf)
    return np.where(np.isinf(first), np.nan, first)


LEAD_LAG_CSV = "lead_lag.csv"
LEAD_LAG_COLUMNS = ["task", "group", "event", "heads", "earliest_step", "earliest_low", "earliest_high", "curve",
                    "curve_step", "difference", "low", "high", "relation", "joint"]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Earliest:
    """A role group's earliest head on one task: how many heads count, the earliest of their point
    events [4] and, over the replicates, the earliest in each [B, 4] (steps; NaN: no head rose)."""

    heads: int
    point: np.ndarray
    replicates: np.ndarray | None


def group_earliest(heads: Trajectories, members: np.ndarray, groups: dict[str, str]) -> dict[tuple[str, str], Earliest]:
    """(task, group) → the earliest event over the group's member heads (`members` [m] bool: which
    trajectories count; `groups`: role → group), in each replicate the minimum over the heads."""
    rows = heads.rows.assign(group=heads.rows["role"].map(groups))
    found = {}
    for key, part in rows[members & rows["group"].notna().to_numpy()].groupby(["task", "group"], sort=False):
        index = part.index.to_numpy()
        point = to_steps(np.stack([earliest(heads.point[None, index, e])[0] for e in range(len(EVENTS))]))
        reps = None
        if heads.replicates is not None:
            reps = to_steps(np.stack([earliest(heads.replicates[:, index, e]) for e in range(len(EVENTS))], axis=1))
        found[key] = Earliest(len(index), point, reps)
    return found


def curve_steps(curve: Trajectories) -> Earliest:
    """One curve's events in steps, as an `Earliest` of one trajectory."""
    reps = None if curve.replicates is None else to_steps(curve.replicates[:, 0, :])
    return Earliest(1, to_steps(curve.point[0]), reps)


def lead_lag(found: dict[tuple[str, str], Earliest], curve: Earliest, curve_name: str) -> pd.DataFrame:
    """Per task, group and event: the group's earliest event against the same event of `curve`, in
    each jointly drawn replicate: the difference's point and interval and its relation. Without the
    curve's replicates its point event stands in for every replicate (`joint` False: the interval
    then holds the heads' uncertainty only)."""
    out = []
    for (task, group), first in found.items():
        for e, event in enumerate(EVENTS):
            row = {"task": task, "group": group, "event": event, "heads": first.heads,
                   "earliest_step": first.point[e], "earliest_low": np.nan, "earliest_high": np.nan,
                   "curve": curve_name, "curve_step": curve.point[e], "difference": first.point[e] - curve.point[e],
                   "low": np.nan, "high": np.nan, "relation": "", "joint": curve.replicates is not None}  # fmt: skip
            if first.replicates is not None:
                low, high, _ = quantile_interval(first.replicates[:, e : e + 1])
                against = (np.full(first.replicates.shape[0], curve.point[e]) if curve.replicates is None
                           else curve.replicates[:, e])  # fmt: skip
                _, d_low, d_high = difference(first.replicates[:, e], against)
                row |= {"earliest_low": low[0], "earliest_high": high[0], "low": d_low, "high": d_high,
                        "relation": relation_of_difference(d_low, d_high)}  # fmt: skip
            out.append(row)
    table = pd.DataFrame(out, columns=LEAD_LAG_COLUMNS)
    for column in ("earliest_step", "earliest_low", "earliest_high", "curve_step", "difference", "low", "high"):
        table[column] = pd.array(np.round(table[column].to_numpy(np.float64)), dtype="Int64")
    return table


# What lead_lag.csv's intervals are computed from, kept beside it so that they regenerate without
# the scores cache: each group's earliest events and the reference curve's, per replicate.
LEAD_LAG_REPLICATES = "lead_lag_replicates.npz"


def save_lead_lag_replicates(path, found: dict[tuple[str, str], Earliest], curve: Earliest) -> None:
    arrays = {"curve/point": curve.point}
    if curve.replicates is not None:
        arrays["curve/replicates"] = curve.replicates.astype(np.float32)
    for (task, group), first in found.items():
        arrays[f"{task}/{group}/point"] = first.point
        arrays[f"{task}/{group}/heads"] = np.array(first.heads)
        if first.replicates is not None:
            arrays[f"{task}/{group}/replicates"] = first.replicates.astype(np.float32)
    np.savez_compressed(path, allow_pickle=False, **arrays)  # read back without pickle, as every npz here


def load_lead_lag_replicates(path) -> tuple[dict[tuple[str, str], Earliest], Earliest]:
    """What `save_lead_lag_replicates` stored (replicates as float32: whole steps up to 2²⁴ exact
    enough for intervals read to whole steps)."""
    with np.load(path, allow_pickle=False) as stored:
        arrays = {k: stored[k] for k in stored.files}
    curve = Earliest(1, arrays["curve/point"], arrays.get("curve/replicates"))
    found = {}
    for key in arrays:
        if key.endswith("/point") and key != "curve/point":
            task, group, _ = key.split("/")
            reps = arrays.get(f"{task}/{group}/replicates")
            found[(task, group)] = Earliest(int(arrays[f"{task}/{group}/heads"]), arrays[key],
                                            None if reps is None else reps.astype(np.float64))  # fmt: skip
    return found, Earliest(1, curve.point, None if curve.replicates is None else curve.replicates.astype(np.float64))


def heldout_replicates(heldout: pd.DataFrame | None, sequences: heldout_io.HeldOutSequences | None,
                       replicates: int, seed: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Each held-out curve [B, E] at every evaluation of `heldout` (metrics.jsonl's) under B resamples
    of the held-out sequences, the same resample at every evaluation, from the per-sequence sums the
    run recorded; drawn from a seed stream of their own, so that replicate b stands beside the
    analysis's replicate b as a joint draw. Empty when the run recorded no sums at some evaluation."""
    if heldout is None or sequences is None or replicates <= 0 or not np.isin(heldout.index, sequences.steps).all():
        return {}
    rng = np.random.default_rng([seed, zlib.crc32(b"heldout")])
    weights = stats.resample_weights(sequences.loss.shape[1], replicates, rng)
    at = np.searchsorted(sequences.steps, heldout.index.to_numpy())
    loss, accuracy = heldout_io.resampled_curves(sequences, weights)
    return {LOSS_CURVE: loss[:, at], ACCURACY_CURVE: accuracy[:, at]}


def heldout_curves(heldout: pd.DataFrame | None, resampled: dict[str, np.ndarray], steps) -> dict[str, Trajectories]:
    """The held-out curves' events over the analysed steps' window (their first to their last), by
    name: the point from metrics.jsonl (`heldout`), the replicates from `heldout_replicates`."""
    if heldout is None:
        return {}
    inside = (heldout.index >= min(steps)) & (heldout.index <= max(steps))
    window = heldout[inside]
    found = {}
    for name, falling in HELDOUT_CURVES:
        if name not in window or window[name].isna().any() or len(window) < 2:
            continue
        reps = resampled.get(name)
        found[name] = trajectories(pd.DataFrame({"curve": [name]}), window.index.to_numpy(),
                                   window[name].to_numpy(np.float64)[:, None],
                                   None if reps is None else reps[:, inside, None], falling)  # fmt: skip
    return found
