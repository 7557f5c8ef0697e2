"""Whether a headline relation of a track survives other reasonable definitions (`robustness.csv`).

A headline relation is a role group's earliest head (per task: local, syntactic, block, delimiter,
as `analysis.heads.summary.DEFAULT_COARSE` groups the roles) against the reference curve: before,
overlapping or after. It is recomputed

- as the paper's threshold reading (`onset`: the earliest onset at τ against the curve's
  changepoint interval, as onset.csv's `vs_loss`) under τ ∈ {2, 3, 5, 8}, both held-out curves
  (the MLM loss, the reference, and the accuracy) and changepoint segment caps 3–6;
- as event times (`rise_start`, `rise_50`: the earliest event of the group's heads against the
  curve's same event, by the interval of their difference, `analysis.heads.events`) under both
  curves and, since which heads belong to a group is read from the last step's test, each τ.

The point tests at each τ are recomputed from track.csv's mean, SD and n (the t or z tail the run
used, its correction per step); the changepoint and event intervals are the run's own resampling.
The score (β or share) is the run's: a second score needs a second track.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import special

from analysis.common import changepoint
from analysis.heads import events, onset
from analysis.heads.intervals import onset_index
from sieves import stats

ROBUSTNESS_CSV = "robustness.csv"
TAUS = (2.0, 3.0, 5.0, 8.0)
CAPS = (3, 4, 5, 6)
EVENT_READINGS = ("rise_start", "rise_50")
COLUMNS = ["task", "group", "reading", "tau", "curve", "cap", "step", "relation"]


def held_at(track: pd.DataFrame, tau: float, alpha: float, correction: str, test: str) -> np.ndarray:
    """Whether each row of `track` holds its role at `tau`, from its mean, SD and n: the one-sided
    test's tail (Student's t, or the normal with `test` z), corrected per step."""
    n = track["n"].to_numpy(np.float64)
    std = track["std"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (track["mean"].to_numpy(np.float64) - tau) / (std / np.sqrt(n))
        p = special.ndtr(-t) if test == "z" else special.stdtr(n - 1, -t)
    p = np.where((n < 2) | ~(std > 0), np.nan, p)
    adjusted = np.empty_like(p)
    for _, index in track.groupby("step", sort=False).indices.items():
        adjusted[index] = stats.adjust_pvalues(p[index], correction)
    return stats.assign(adjusted, alpha)


def robustness(track: pd.DataFrame, heads: events.Trajectories, heldout: pd.DataFrame | None,
               heldout_reps: dict[str, np.ndarray], persistence: int, alpha: float, correction: str, test: str,
               replicates: int, seed: int, groups: dict[str, str]) -> pd.DataFrame:  # fmt: skip
    """`robustness.csv`: one row per task, group, reading and variant (the module doc); empty
    without held-out metrics."""
    if heldout is None:
        return pd.DataFrame(columns=COLUMNS)
    ordered = track.sort_values("step", kind="stable")
    steps = sorted(pd.unique(ordered["step"]))
    key = ["task", "layer", "head", "role"]
    curves = events.heldout_curves(heldout, heldout_reps, steps)
    changepoints = {}
    for name, falling in events.HELDOUT_CURVES:
        if name in heldout:
            present = heldout[name].notna().to_numpy()
            reps = heldout_reps.get(name)
            for cap in CAPS:
                changepoints[(name, cap)] = changepoint.curve_changepoint(
                    heldout.index[present], heldout[name][present], falling, replicates if reps is None else 0, seed,
                    None if reps is None else reps[:, present], max_segments=cap,
                )  # fmt: skip
    rows = []
    for tau in TAUS:
        held = ordered.assign(held=held_at(ordered, tau, alpha, correction, test))
        flags = held.pivot_table(index=key, columns="step", values="held", aggfunc="first", sort=False)
        flags = flags[steps].fillna(False).astype(bool)
        index, _ = onset_index(flags.to_numpy(), persistence)
        onset_step = pd.Series(np.append(steps, np.nan)[index], index=flags.index)
        last = flags[steps[-1]]
        group_of = flags.index.get_level_values("role").map(groups)
        for (task, group), part in onset_step.groupby([flags.index.get_level_values("task"), group_of]):
            first = part.min()
            for (name, cap), found in changepoints.items():
                relation = ""
                if found is not None and found.low is not None and not pd.isna(first):
                    x = heldout.index[heldout[name].notna().to_numpy()]
                    low = x[found.low] if found.low >= 0 else x[0]
                    high = x[found.high] if found.high is not None and found.high >= 0 else np.nan
                    relation = onset.relation(onset.step_before(first, steps), first, low, high)
                rows.append((task, group, "onset", tau, name, cap, first, relation))
        members_index = pd.MultiIndex.from_frame(heads.rows[key])
        members = last.reindex(members_index).fillna(False).to_numpy(bool) & (heads.status != "no_rise")
        found = events.group_earliest(heads, members, groups)
        for name, curve in curves.items():
            table = events.lead_lag(found, events.curve_steps(curve), name)
            for r in table[table["event"].isin(EVENT_READINGS)].itertuples():
                rows.append((r.task, r.group, r.event, tau, name, pd.NA, r.earliest_step, r.relation))
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table.astype({"cap": "Int64", "step": "Int64"})


def summary_lines(table: pd.DataFrame) -> list[str]:
    """Per task, group and reading: the relation when every variant agrees, else how they split."""
    lines = []
    for (task, group, reading), part in table.groupby(["task", "group", "reading"], sort=False):
        counts = part["relation"].replace("", "none").value_counts()
        if len(counts) == 1:
            lines.append(f"  {task} {group} {reading}: {counts.index[0]} under all {len(part)} variants")
        else:
            split = ", ".join(f"{rel} {n}" for rel, n in counts.items())
            lines.append(f"  {task} {group} {reading}: not robust ({split} of {len(part)} variants)")
    return lines
