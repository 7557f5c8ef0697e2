"""Onsets across the seeds of one recipe: `analysis.track --run A --run B ...`.

Each run is tracked on its own (its outputs in `<out>/<run name>/`, as a one-run track writes
them); the summary reads those outputs back, so it can also be made from committed track
directories alone (`summarize`). Per (task, role):

- `seeds_onsets.csv`: per seed, the number of heads with an onset, the earliest onset and its
  interval, the heads holding the role at the last step, and the loss changepoint with its
  interval; then the across-seed median and range of the earliest onset and of the heads at the
  last step, and how many seeds place the earliest onset before / overlapping / after their own
  loss changepoint;
- `<task>_seeds.png`: the number of heads holding each role against step, the median over seeds
  as a line and the range as a band.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.common.figures import save_figure, step_axis
from analysis.heads import onset
from analysis.heads.config import TRACK_CSV
from analysis.heads.figures import role_colours
from analysis.heads.summary import ordered_roles
from bertjax.errors import UserError


def read_track(directory: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(track.csv, onset.csv, curve_onsets.csv) of a track output directory."""
    tables = []
    for name in (TRACK_CSV, onset.ONSET_CSV, onset.CURVE_ONSETS_CSV):
        path = directory / name
        # A committed track keeps its large table compressed.
        path = path if path.is_file() else path.with_name(name + ".gz")
        if not path.is_file():
            raise UserError(f"{directory}: no {name} (not the output of analysis.track)")
        tables.append(pd.read_csv(path))
    return tables[0], tables[1], tables[2]


def per_seed(name: str, track: pd.DataFrame, onsets: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, role) of one seed."""
    loss = curves[curves["curve"] == onset.REFERENCE_CURVE]
    ref = loss.iloc[0] if not loss.empty else None
    steps = sorted(pd.unique(track["step"]))
    rows = []
    for (task, role), part in onsets.groupby(["task", "role"], sort=False):
        held = part[part["status"] == "onset"]
        first = held.sort_values(["onset_step", "onset_low"]).head(1)
        earliest = first["onset_step"].iloc[0] if len(first) else np.nan
        low = first["onset_low"].iloc[0] if len(first) else np.nan
        high = first["onset_high"].iloc[0] if len(first) else np.nan
        last = track[(track["task"] == task) & (track["role"] == role)]
        at_last = int(last[last["step"] == last["step"].max()]["assigned"].fillna(False).astype(bool).sum())
        rows.append({
            "seed": name, "task": task, "role": role, "onsets": len(held),
            "end_only": int((part["status"] == "end_only").sum()), "heads_at_last_step": at_last,
            "earliest_onset": earliest, "earliest_onset_low": low, "earliest_onset_high": high,
            "loss_changepoint": np.nan if ref is None else ref["changepoint_step"],
            "loss_changepoint_low": np.nan if ref is None else ref["changepoint_low"],
            "loss_changepoint_high": np.nan if ref is None else ref["changepoint_high"],
            "vs_loss": "" if ref is None or not len(first) else onset.relation(
                onset.step_before(low, steps), high, ref["changepoint_low"], ref["changepoint_high"]),
        })  # fmt: skip
    return pd.DataFrame(rows)


def summarize(directories: dict[str, Path]) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """(the seeds table: each seed's rows and the across-seed rows, seed "all"; per seed its track)."""
    if len(directories) < 2:
        raise UserError("an across-seed summary needs at least two tracked runs")
    seeds, tracks = [], {}
    for name, directory in directories.items():
        track, onsets, curves = read_track(directory)
        tracks[name] = track
        seeds.append(per_seed(name, track, onsets, curves))
    table = pd.concat(seeds, ignore_index=True)
    across = []
    for (task, role), part in table.groupby(["task", "role"], sort=False):
        onset_steps = part["earliest_onset"].dropna()
        across.append({
            "seed": "all", "task": task, "role": role, "seeds": len(part),
            "seeds_with_onset": int(onset_steps.size),
            "earliest_onset_median": onset_steps.median() if onset_steps.size else np.nan,
            "earliest_onset_min": onset_steps.min() if onset_steps.size else np.nan,
            "earliest_onset_max": onset_steps.max() if onset_steps.size else np.nan,
            "heads_at_last_step_median": part["heads_at_last_step"].median(),
            "heads_at_last_step_min": part["heads_at_last_step"].min(),
            "heads_at_last_step_max": part["heads_at_last_step"].max(),
            "before_loss": int((part["vs_loss"] == "before").sum()),
            "overlapping_loss": int((part["vs_loss"] == "overlapping").sum()),
            "after_loss": int((part["vs_loss"] == "after").sum()),
        })  # fmt: skip
    out = pd.concat([table, pd.DataFrame(across)], ignore_index=True)
    order = {role: i for i, role in enumerate(ordered_roles(out["role"]))}
    out = out.sort_values(["task", "role", "seed"], key=lambda c: c.map(order) if c.name == "role" else c,
                          kind="stable")  # fmt: skip
    return out, tracks


def plot_seeds(tracks: dict[str, pd.DataFrame], task: str, out_dir: Path, stem: str) -> list[Path]:
    """Heads holding each role against step: the median over seeds, the range as a band. Steps
    are those every seed analysed."""
    counts = {name: onset.heads_holding(track, task) for name, track in tracks.items()}
    steps = sorted(set.intersection(*(set(c.index) for c in counts.values())))
    roles = ordered_roles(set.intersection(*(set(c.columns) for c in counts.values())))
    fig = Figure(figsize=(7.2, 3.6), layout="constrained")
    ax = fig.subplots()
    colours = role_colours(roles)
    for role in roles:
        stacked = np.stack([c.loc[steps, role].to_numpy() for c in counts.values()])
        ax.fill_between(steps, stacked.min(0), stacked.max(0), color=colours[role], alpha=0.2, linewidth=0)
        ax.plot(steps, np.median(stacked, 0), marker="o", markersize=2, color=colours[role], label=role)
    heads = onset.track_heads(next(iter(tracks.values())), task)
    ax.set_ylabel(f"heads holding the role (of {heads})")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    step_axis(ax, np.asarray(steps))
    ax.set_title(f"{task}: heads holding each role over {len(tracks)} seeds (median, range shaded)", fontsize=9)
    return save_figure(fig, out_dir, stem)


def contrast(first: pd.DataFrame, second: pd.DataFrame) -> dict:
    """One quantity in steps (a changepoint, an earliest onset) compared between two recipes across
    their seeds. Each frame has one row per seed with `step` and its interval `low`, `high` (NA
    step: that seed never reached it). Seeds are independent, so every pair (a seed of `second`, a
    seed of `first`) where both reached it is one comparison: its difference second − first, and
    whether second's interval lies after, overlaps or lies before first's (`onset.relation`).
    Returns the pairs' median, min and max difference and those three counts."""
    pairs = [(b, a) for b in second.itertuples() for a in first.itertuples() if pd.notna(b.step) and pd.notna(a.step)]
    differences = np.array([float(b.step) - float(a.step) for b, a in pairs])
    relations = [onset.relation(b.low, b.high, a.low, a.high) for b, a in pairs]
    return {
        "seeds_first": int(first["step"].notna().sum()), "seeds_second": int(second["step"].notna().sum()),
        "pairs": len(pairs),
        "difference_median": float(np.median(differences)) if pairs else np.nan,
        "difference_min": float(differences.min()) if pairs else np.nan,
        "difference_max": float(differences.max()) if pairs else np.nan,
        "after": relations.count("after"), "overlapping": relations.count("overlapping"),
        "before": relations.count("before"),
    }  # fmt: skip
