"""docs/emergence.md's blocks that read the committed runs with the threshold-free tools of
`analysis.heads.events` and `analysis.heads.robustness` (docs/tracking.md, "Event times").

The rules were fixed in the code and docs/tracking.md before these blocks were first generated:
the events of a trajectory (its 10% and 50% points between its first and last analysed step), the
heads that count for a group's earliest event (those holding a role of it at the last step, with a
rise), the held-out loss as the reference curve, τ ∈ {2, 3, 5, 8} and segment caps 3–6.

The seeds' scores caches are not committed, so their event times are points: their intervals
would need the per-sequence scores. Their threshold readings' intervals are the changepoint's, as
on the rest of the page (the wild bootstrap of the committed metrics.jsonl).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
from emergence_seeds import RECIPES, SEEDS, TASKS

from analysis.heads import events, onset, robustness, seeds
from analysis.heads.summary import DEFAULT_COARSE

KEY = ["task", "layer", "head", "role"]
# The group the page's headline reads: the positional roles (local, prev, next).
GROUP = "local"
EVENT_READINGS = ("rise_10", "rise_50")


def trajectories(track: pd.DataFrame) -> events.Trajectories:
    """The events of every (task, layer, head, role) of a committed track.csv, without intervals."""
    means = track.pivot_table(index="step", columns=KEY, values="mean", sort=True)
    rows = means.columns.to_frame(index=False)
    return events.trajectories(rows, means.index.to_numpy(), means.to_numpy(np.float64), None)


@functools.cache
def seed_readings(name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(robustness.csv's table, the group events against the loss's) of one committed seed."""
    track, _, _ = seeds.read_track(SEEDS / name / "track")
    run = pd.read_json(SEEDS / name / "track" / "run.json", typ="series")
    config = run["config"]
    heads = trajectories(track)
    heldout = onset.read_heldout(SEEDS / name)
    last = track[track["step"] == track["step"].max()].set_index(KEY)["assigned"].fillna(False).astype(bool)
    held = last.reindex(pd.MultiIndex.from_frame(heads.rows)).fillna(False).to_numpy(bool)
    members = held & (heads.status != "no_rise")
    curve = events.heldout_curves(heldout, {}, sorted(pd.unique(track["step"])))[onset.REFERENCE_CURVE]
    found = events.group_earliest(heads, members, dict(DEFAULT_COARSE))
    lead = events.lead_lag(found, events.curve_steps(curve), onset.REFERENCE_CURVE)
    roles = config["roles"]
    table = robustness.robustness(track, heads, heldout, {}, config["persistence"], roles["alpha"],
                                  roles["correction"], roles["test"], roles["bootstrap"], roles["bootstrap_seed"],
                                  dict(DEFAULT_COARSE))  # fmt: skip
    return table, lead


def _bao(relations: list[str]) -> str:
    return " / ".join(str(sum(r == kind for r in relations)) for kind in ("before", "overlapping", "after"))


def tau_table() -> str:
    """Per recipe and task: the earliest positional onset against the loss changepoint interval, as
    b / o / a counts over the seeds, at each τ (segment cap 4, the page's), then at τ = 3 under
    each cap and against the accuracy's changepoint."""
    header = ["recipe", "task", *[f"τ = {t:g}" for t in robustness.TAUS],
              *[f"cap {c}" for c in robustness.CAPS if c != 4], "vs accuracy"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for recipe, names in RECIPES.items():
        for task in TASKS:

            def pick(tau, cap, curve, task=task, names=names):
                out = []
                for name in names:
                    table, _ = seed_readings(name)
                    row = table[(table["task"] == task) & (table["group"] == GROUP) & (table["reading"] == "onset")
                                & (table["tau"] == tau) & (table["cap"] == cap) & (table["curve"] == curve)]  # fmt: skip
                    out.append(row["relation"].iloc[0] if len(row) else "")
                return _bao(out)

            cells = [pick(t, 4, onset.LOSS_CURVE) for t in robustness.TAUS]
            cells += [pick(3.0, c, onset.LOSS_CURVE) for c in robustness.CAPS if c != 4]
            cells.append(pick(3.0, 4, onset.ACCURACY_CURVE))
            lines.append(f"| {recipe} | {task.upper() if task != 'sst2' else 'SST-2'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def events_table() -> str:
    """Per recipe and task: the earliest positional head's 10% and 50% points minus the held-out
    loss's, in steps (median [min, max] over the seeds; negative: the heads first)."""
    header = ["recipe", "task", "heads' 10% − loss's 10%", "heads' 50% − loss's 50%", "loss's 10% / 50% (median)"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for recipe, names in RECIPES.items():
        for task in TASKS:
            cells, loss = [], {}
            for event in EVENT_READINGS:
                values = []
                for name in names:
                    _, lead = seed_readings(name)
                    row = lead[(lead["task"] == task) & (lead["group"] == GROUP) & (lead["event"] == event)]
                    if len(row):
                        values.append(int(row["difference"].iloc[0]))
                        loss.setdefault(event, []).append(int(row["curve_step"].iloc[0]))
                cells.append(_median_range(values))
            steps = " / ".join(str(int(np.median(loss[e]))) if e in loss else "–" for e in EVENT_READINGS)
            lines.append(
                f"| {recipe} | {task.upper() if task != 'sst2' else 'SST-2'} | " + " | ".join(cells) + f" | {steps} |"
            )
    return "\n".join(lines)


def _median_range(values: list[int]) -> str:
    if not values:
        return "–"
    return f"{int(np.median(values)):+d} [{min(values):+d}, {max(values):+d}]"
