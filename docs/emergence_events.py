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
    scored = {roles.get("score", "beta"): robustness.Scored(track, heads)}
    table = robustness.robustness(scored, heldout, {}, config["persistence"], roles["alpha"],
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


# A run tracked with the event tools from the start (this CPU, the emergence recipe, MLM only):
# its held-out sequences recorded, so that every interval below is a joint one.
EVENTS_RUN = SEEDS.parent / "events" / "mlm-s0"
RUN_EVENTS = ("rise_start", "rise_10", "rise_50")


def run_lead_lag() -> pd.DataFrame:
    """The run's lead_lag.csv, its intervals computed again from the replicates stored beside it
    (checked equal to the file: the page's intervals regenerate from committed files)."""
    track = EVENTS_RUN / "track"
    table = pd.read_csv(track / events.LEAD_LAG_CSV, keep_default_na=False, na_values=[""])
    found, curve = events.load_lead_lag_replicates(track / events.LEAD_LAG_REPLICATES)
    again = events.lead_lag(found, curve, onset.REFERENCE_CURVE)
    for column in ("earliest_low", "earliest_high", "low", "high"):
        if not again[column].astype("Float64").equals(table[column].astype("Float64")):
            raise SystemExit(f"{track / events.LEAD_LAG_CSV}: {column} differs from its replicates")
    return table


def run_events() -> str:
    """Per task and role group of the run: each event of the earliest head against the held-out
    loss's, the difference's 90% interval (jointly drawn replicates) and its relation."""
    table = run_lead_lag()
    header = ["task", "group", "heads", *[f"{e}: heads − loss [90%]" for e in RUN_EVENTS]]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for (task, group), part in table.groupby(["task", "group"], sort=False):
        part = part.set_index("event")
        cells = []
        for event in RUN_EVENTS:
            r = part.loc[event]
            if pd.isna(r["difference"]):
                cells.append("–")
                continue
            bounds = "–" if pd.isna(r["low"]) or pd.isna(r["high"]) else f"{int(r['low']):+d}, {int(r['high']):+d}"
            cells.append(f"{int(r['difference']):+d} [{bounds}] {r['relation'] or 'open'}")
        lines.append(f"| {task} | {group} | {int(part['heads'].iloc[0])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_curves() -> str:
    """The run's held-out loss: its events (intervals from resampling held-out sequences) and its
    changepoint with the model's misfit."""
    track = EVENTS_RUN / "track"
    curve_events = pd.read_csv(track / events.CURVE_EVENTS_CSV)
    loss = curve_events[curve_events["curve"] == onset.REFERENCE_CURVE].set_index("event")
    cells = [f"{e} {int(loss.loc[e, 'step'])} [{int(loss.loc[e, 'low'])}–{int(loss.loc[e, 'high'])}]"
             for e in events.EVENTS]  # fmt: skip
    changes = pd.read_csv(track / onset.CURVE_ONSETS_CSV)
    ref = changes[changes["curve"] == onset.REFERENCE_CURVE].iloc[0]
    return (
        f"- held-out loss events: {'; '.join(cells)} (steps, 90% intervals from {ref['interval_from']} resampled)\n"
        f"- its changepoint: {int(ref['changepoint_step'])} [{int(ref['changepoint_low'])}–{int(ref['changepoint_high'])}], "
        f"{int(ref['segments'])} segments (the cap bound: {str(bool(ref['cap_bound'])).lower()}), residual lag-1 "
        f"autocorrelation {ref['residual_lag1']:+.2f}"
    )


def run_robustness() -> str:
    """The run's printed robustness lines (robustness.csv)."""
    table = pd.read_csv(EVENTS_RUN / "track" / robustness.ROBUSTNESS_CSV, keep_default_na=False, na_values=[""])
    table["relation"] = table["relation"].fillna("")
    keep = table[table["group"].isin(["local", "syntactic", "delimiter"])]
    return "\n".join(f"- {line.strip()}" for line in robustness.summary_lines(keep))
