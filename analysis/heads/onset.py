"""When each head takes on each role during training, read against how well the model has learnt.

A head's *onset* for a role is the first analysed step from which it holds the role at every later
analysed step: a role that flickers on and off dates from when it last came on, and a role lost by
the last step has no onset. Learning is read from the held-out metrics a bertjax pre-training run
writes into `metrics.jsonl` at every checkpoint (`heldout.corpora` in the pre-training config).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.common.figures import save_figure, step_axis
from analysis.heads.figures import role_colours
from analysis.heads.summary import ordered_roles
from bertjax.errors import UserError

ONSET_CSV = "onset.csv"
ONSET_COLUMNS = ["task", "layer", "head", "role", "onset_step", "mean_at_onset", "held_at_last_step"]
HELDOUT_METRICS = ("heldout_mlm_accuracy", "heldout_mlm_loss", "heldout_nsp_accuracy", "heldout_nsp_loss")


def role_onsets(track: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, layer, head, role) of `track` (the `track.csv` table): `onset_step` is
    the first step from which `assigned` holds at every later step (NaN if it does not hold at the
    last step), `mean_at_onset` the head's mean β at that step. An untested step is not held."""
    rows = track.sort_values("step")
    out = []
    for (task, layer, head, role), part in rows.groupby(["task", "layer", "head", "role"], sort=False):
        held = part["assigned"].fillna(False).astype(bool).to_numpy()
        # The onset is the step after the last step the role was not held (the first step if never lost).
        lost = np.flatnonzero(~held)
        start = 0 if lost.size == 0 else lost[-1] + 1
        if start < held.size:
            onset_step, mean = int(part["step"].iloc[start]), float(part["mean"].iloc[start])
        else:
            onset_step, mean = np.nan, np.nan
        out.append((task, layer, head, role, onset_step, mean, bool(held[-1])))
    table = pd.DataFrame(out, columns=ONSET_COLUMNS).astype({"onset_step": "Int64"})
    order = {role: i for i, role in enumerate(ordered_roles(table["role"]))}
    return table.sort_values(["task", "role", "layer", "head"], key=lambda c: c.map(order) if c.name == "role" else c)


def read_heldout(workdir: Path) -> pd.DataFrame | None:
    """The held-out metrics a bertjax pre-training run recorded, indexed by step (the last record
    of a step wins: a resumed run re-evaluates the step it resumed from); None if it recorded none."""
    path = workdir / "metrics.jsonl"
    if not path.is_file():
        return None
    records = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(
                f"{path}:{lineno}: not a JSON row (a write cut short?); delete that line and rerun"
            ) from None
        if isinstance(row, dict) and "heldout_mlm_accuracy" in row:
            records[int(row["step"])] = {k: row.get(k, np.nan) for k in HELDOUT_METRICS}
    if not records:
        return None
    return pd.DataFrame.from_dict(records, orient="index").rename_axis("step").sort_index()


def heads_holding(track: pd.DataFrame, task: str) -> pd.DataFrame:
    """Steps × roles: how many heads hold each role at each step."""
    rows = track[track["task"] == task]
    counts = rows.assign(held=rows["assigned"].fillna(False).astype(bool)).pivot_table(
        index="step", columns="role", values="held", aggfunc="sum"
    )
    return counts[ordered_roles(counts.columns)].astype(int)


def format_onsets(track: pd.DataFrame, onsets: pd.DataFrame) -> str:
    """Per task and role: the first step any head holds it, the earliest onset (held from then on)
    and the heads holding it at the last step."""
    lines = []
    for task in pd.unique(track["task"]):
        counts = heads_holding(track, task)
        task_onsets = onsets[onsets["task"] == task]
        earliest = task_onsets.groupby("role")["onset_step"].min()
        table = pd.DataFrame(
            {
                "first held": [_step_text(_first_step(counts[role])) for role in counts.columns],
                "held from (earliest onset)": [_step_text(earliest.get(role)) for role in counts.columns],
                "heads at last step": [int(counts[role].iloc[-1]) for role in counts.columns],
            },
            index=pd.Index(counts.columns, name="role"),
        )
        lines.append(f"{task}: when each role appears (steps; heads out of {track_heads(track, task)})")
        lines.append(table.to_string())
    return "\n".join(lines)


def track_heads(track: pd.DataFrame, task: str) -> int:
    rows = track[track["task"] == task]
    return int(rows[["layer", "head"]].drop_duplicates().shape[0])


def _step_text(step) -> str:
    return "never" if step is None or pd.isna(step) else str(int(step))


def _first_step(held_counts: pd.Series) -> int | None:
    steps = held_counts.index[held_counts.to_numpy() > 0]
    return int(steps[0]) if len(steps) else None


def plot_onset(
    track: pd.DataFrame, task: str, out_dir: Path, stem: str, heldout: pd.DataFrame | None = None
) -> list[Path]:
    """Per role, the number of heads holding it against step; the held-out MLM accuracy of the
    run (when it recorded one) on a second axis."""
    counts = heads_holding(track, task)
    steps = counts.index.to_numpy()
    colours = role_colours(list(counts.columns))
    fig = Figure(figsize=(7.2, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for role in counts.columns:
        ax.plot(steps, counts[role], marker="o", markersize=3, color=colours[role], label=role)
    step_axis(ax, steps)
    ax.set_ylabel(f"heads holding the role (of {track_heads(track, task)})")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.3, max(1, int(counts.to_numpy().max())) + 0.3)
    handles, labels = ax.get_legend_handles_labels()
    if heldout is not None:
        shown = heldout.loc[heldout.index.isin(steps), "heldout_mlm_accuracy"].dropna()
        if not shown.empty:
            twin = ax.twinx()
            (line,) = twin.plot(shown.index, shown.to_numpy(), color="black", linestyle="--", linewidth=1.2)
            twin.set_ylabel("held-out MLM accuracy")
            twin.set_ylim(0, max(0.05, 1.1 * float(shown.max())))
            handles, labels = [*handles, line], [*labels, "held-out MLM accuracy"]
    ax.legend(
        handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.2 if heldout is not None else 1.02, 0.5)
    )
    ax.set_title(f"{task}: heads holding each role during training")
    return save_figure(fig, out_dir, stem)
