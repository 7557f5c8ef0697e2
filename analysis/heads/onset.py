"""When each head takes on each role during training, read against how well the model has learnt.

A head's *onset* for a role is the first analysed step from which it holds the role at every later
analysed step, provided that is at least K consecutive analysed steps (`--persistence`, default 2):
a role held only at the last step (fewer than K steps) is reported as `end_only`, not as an onset;
a role lost by the last step has none (`not_held`). K = 1 is the rule before K existed.
Uncertainty comes from resampling the sequences (`analysis.heads.intervals`): every replicate
redoes every step's tests, giving an interval for the onset step, the share of replicates with no
onset and the share holding the role at the last step.

Learning is read from the held-out metrics a bertjax pre-training run writes into `metrics.jsonl`,
at every evaluation recorded (`heldout.every` adds evaluations between checkpoints). Curves (the
held-out MLM loss, the reference fixed in advance; the accuracy; the SAS; each role's count of
heads) get a changepoint with an interval (`analysis.common.changepoint`). A role's onset
*coincides* with the loss's changepoint only when their intervals overlap; `onset.csv` and
`curve_onsets.csv` say before / overlapping / after.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.common import changepoint
from analysis.common.figures import save_figure, step_axis
from analysis.heads.config import PERSISTENCE
from analysis.heads.figures import role_colours
from analysis.heads.intervals import onset_index
from analysis.heads.summary import ordered_roles
from bertjax.errors import UserError

ONSET_CSV = "onset.csv"
ONSET_COLUMNS = ["task", "layer", "head", "role", "onset_step", "status", "mean_at_onset", "held_at_last_step",
                 "onset_low", "onset_high", "no_onset_share", "held_at_last_share", "vs_loss"]  # fmt: skip
CURVE_ONSETS_CSV = "curve_onsets.csv"
# The smooth model's 10/50/90% times with their intervals, and whether BIC prefers it to the
# piecewise fit (`analysis.common.changepoint`).
SMOOTH_COLUMNS = [f"smooth_{round(100 * p)}{end}" for p in changepoint.SMOOTH_LEVELS for end in ("", "_low", "_high")]
CURVE_COLUMNS = ["curve", "task", "reference", "points", "segments", "changepoint_step", "changepoint_low",
                 "changepoint_high", "no_change_share", "slope_per_efold", "vs_loss", "fit", "interval_from",
                 "residual_lag1", "cap_bound", *SMOOTH_COLUMNS, "smooth_better"]  # fmt: skip
LOSS_CURVE = "heldout_mlm_loss"
ACCURACY_CURVE = "heldout_mlm_accuracy"
SAS_CURVE = "sas"
# The reference curve, fixed before any run was read: the held-out MLM loss.
REFERENCE_CURVE = LOSS_CURVE
INTERVAL_COLUMNS = ["onset_low", "onset_high", "no_onset_share", "held_at_last_share"]


def role_onsets(
    track: pd.DataFrame, persistence: int = PERSISTENCE, intervals: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per (task, layer, head, role) of `track` (the `track.csv` table): `onset_step` as in
    the module doc (NaN without one), `status` onset | end_only | not_held, `mean_at_onset` the
    head's mean β at the onset, and the interval columns from `intervals`
    (`intervals.onset_interval_table`; empty without). An untested step is not held."""
    rows = track.sort_values("step", kind="stable")
    out = []
    for (task, layer, head, role), part in rows.groupby(["task", "layer", "head", "role"], sort=False):
        held = part["assigned"].fillna(False).astype(bool).to_numpy()
        index, trailing = (int(v) for v in onset_index(held, persistence))
        onset_step: float  # a step, or NaN without an onset
        if index < held.size:
            onset_step, mean, status = int(part["step"].iloc[index]), float(part["mean"].iloc[index]), "onset"
        else:
            onset_step, mean, status = np.nan, np.nan, "end_only" if trailing else "not_held"
        out.append((task, layer, head, role, onset_step, status, mean, bool(held[-1])))
    table = pd.DataFrame(out, columns=ONSET_COLUMNS[:8]).astype({"onset_step": "Int64"})
    if intervals is not None:
        table = table.merge(intervals, on=["task", "layer", "head", "role"], how="left")
    else:
        table = table.assign(
            onset_low=pd.array([pd.NA] * len(table), dtype="Int64"),
            onset_high=pd.array([pd.NA] * len(table), dtype="Int64"),
            no_onset_share=np.nan,
            held_at_last_share=np.nan,
        )
    table["vs_loss"] = ""
    order = {role: i for i, role in enumerate(ordered_roles(table["role"]))}
    return table[ONSET_COLUMNS].sort_values(
        ["task", "role", "layer", "head"], key=lambda c: c.map(order) if c.name == "role" else c
    )


def relation(low, high, ref_low, ref_high) -> str:
    """before / overlapping / after of an interval [low, high] against the reference's; NA bounds:
    a missing high is "no onset" (later than any step), a missing low "before the first step"."""
    if pd.isna(ref_low) and pd.isna(ref_high):
        return ""
    if pd.isna(low) and pd.isna(high):
        return ""
    lo = -np.inf if pd.isna(low) else float(low)
    hi = np.inf if pd.isna(high) else float(high)
    ref_lo = -np.inf if pd.isna(ref_low) else float(ref_low)
    ref_hi = np.inf if pd.isna(ref_high) else float(ref_high)
    if hi < ref_lo:
        return "before"
    if lo > ref_hi:
        return "after"
    return "overlapping"


def curve_row(curve: str, task: str, steps, values, falling: bool, replicates: int, seed: int,
              curve_replicates: np.ndarray | None = None) -> dict:  # fmt: skip
    """One row of `curve_onsets.csv` (steps in the step units of the run)."""
    steps = np.asarray(steps)
    found = changepoint.curve_changepoint(steps, values, falling, replicates, seed, curve_replicates)
    row = {"curve": curve, "task": task, "reference": curve == REFERENCE_CURVE, "points": int(steps.size),
           "segments": pd.NA, "changepoint_step": pd.NA, "changepoint_low": pd.NA, "changepoint_high": pd.NA,
           "no_change_share": np.nan, "slope_per_efold": np.nan, "vs_loss": "", "fit": "", "interval_from": "",
           "residual_lag1": np.nan, "cap_bound": pd.NA, "smooth_better": pd.NA}  # fmt: skip
    row |= dict.fromkeys(SMOOTH_COLUMNS, pd.NA)
    if found is None:
        return row
    assert found.smooth is not None  # curve_changepoint fits the smooth model unless told not to
    times = np.stack([found.smooth.steps, found.smooth.low, found.smooth.high], axis=1).ravel()
    row |= {c: pd.NA if np.isnan(t) else round(float(t)) for c, t in zip(SMOOTH_COLUMNS, times, strict=True)}
    row["smooth_better"] = found.smooth_better
    row["segments"] = found.segments
    row["residual_lag1"], row["cap_bound"] = found.residual_lag1, found.cap_bound
    if replicates > 0 or curve_replicates is not None:
        # Where the interval's replicates come from: resampled sequences (the data), or the fit's
        # own residuals (a model that misfits when residual_lag1 is far from 0).
        row["interval_from"] = "sequences" if curve_replicates is not None else "residuals"
    # Every segment of the fit, "first step: slope per e-fold": where the other changes are.
    row["fit"] = "; ".join(f"{int(steps[b])}: {rate:+.4g}" for b, rate in found.fit)
    if found.first >= 0:
        row["changepoint_step"] = int(steps[found.first])
        row["slope_per_efold"] = found.slope
    if found.low is not None:
        assert found.no_change_share is not None  # set with the interval's bounds
        row["no_change_share"] = found.no_change_share
        if found.high is not None and (found.first >= 0 or found.no_change_share < 1):
            row["changepoint_low"] = int(steps[found.low]) if found.low >= 0 else int(steps[0])
            row["changepoint_high"] = int(steps[found.high]) if found.high >= 0 else pd.NA
    return row


def curve_onsets(
    track: pd.DataFrame,
    heldout: pd.DataFrame | None,
    sas: pd.Series | None,
    replicates: int = 0,
    seed: int = 0,
    count_replicates: dict[tuple[str, str], np.ndarray] | None = None,
    heldout_replicates: dict[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """The changepoints of the held-out MLM loss (the reference) and accuracy at every evaluation
    recorded, of the SAS and of each task's role counts, each with its interval and its relation
    to the loss's (`count_replicates`: the counts under the paired resampling of sequences;
    `heldout_replicates`: the held-out curves at every evaluation under resampling of the held-out
    sequences, `analysis.heads.events.heldout_replicates`, which replace the residual bootstrap)."""
    rows = []
    for curve, falling in ((LOSS_CURVE, True), (ACCURACY_CURVE, False)):
        if heldout is not None and curve in heldout:
            present = heldout[curve].notna().to_numpy()
            values = heldout[curve][present]
            reps = (heldout_replicates or {}).get(curve)
            rows.append(curve_row(curve, "", values.index.to_numpy(), values.to_numpy(), falling,
                                  replicates if reps is None else 0, seed, None if reps is None else reps[:, present]))  # fmt: skip
    if sas is not None:
        rows.append(curve_row(SAS_CURVE, "", sas.index.to_numpy(), sas.to_numpy(), False, replicates, seed))
    for task in pd.unique(track["task"]):
        counts = heads_holding(track, task)
        for role in counts.columns:
            reps = None if count_replicates is None else count_replicates.get((task, role))
            rows.append(curve_row(f"heads:{role}", task, counts.index.to_numpy(), counts[role].to_numpy(), False,
                                  replicates if reps is None else 0, seed, reps))  # fmt: skip
    table = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    reference = table[table["curve"] == REFERENCE_CURVE]
    if not reference.empty:
        ref = reference.iloc[0]
        table["vs_loss"] = [
            "" if r.curve == REFERENCE_CURVE else relation(r.changepoint_low, r.changepoint_high,
                                                           ref.changepoint_low, ref.changepoint_high)
            for r in table.itertuples()
        ]  # fmt: skip
    integers = ("segments", "changepoint_step", "changepoint_low", "changepoint_high", *SMOOTH_COLUMNS)
    return table.astype({c: "Int64" for c in integers})


def step_before(step, steps) -> float:
    """The analysed step before `step` (NA stays NA; the first step has none before it: itself)."""
    if pd.isna(step):
        return np.nan
    earlier = [s for s in steps if s < step]
    return float(max(earlier)) if earlier else float(step)


def relate_onsets(onsets: pd.DataFrame, curves: pd.DataFrame, steps) -> pd.DataFrame:
    """`onsets` with `vs_loss`: each onset's window before / overlapping / after the loss's
    changepoint interval (empty without an onset, an interval or a loss curve). An onset at an
    analysed step means the role came on after the analysed step before it, so the window is
    (the step before `onset_low`, `onset_high`], as a changepoint's is (the evaluation before,
    the first of the steep segment]: `steps` are the analysed steps."""
    reference = curves[curves["curve"] == REFERENCE_CURVE]
    if reference.empty:
        return onsets
    ref = reference.iloc[0]
    steps = sorted(steps)
    vs = [
        relation(step_before(r.onset_low, steps), r.onset_high, ref.changepoint_low, ref.changepoint_high)
        if r.status == "onset" and not (pd.isna(r.onset_low) and pd.isna(r.onset_high)) else ""
        for r in onsets.itertuples()
    ]  # fmt: skip
    return onsets.assign(vs_loss=vs)


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
            # The MLM metrics and the pair task's, under its name (nsp, sop; none when MLM only).
            records[int(row["step"])] = {
                k: v for k, v in row.items() if k.startswith("heldout_") and k != "heldout_sequences"
            }
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
    """Per task and role: the first step any head holds it, the earliest onset (held from then on,
    for at least the persistence), the heads with an onset, those holding it at the last steps only
    (end_only) and the heads holding it at the last step."""
    lines = []
    for task in pd.unique(track["task"]):
        counts = heads_holding(track, task)
        task_onsets = onsets[onsets["task"] == task]
        earliest = task_onsets.groupby("role")["onset_step"].min()
        status = task_onsets.groupby("role")["status"]
        table = pd.DataFrame(
            {
                "first held": [_step_text(_first_step(counts[role])) for role in counts.columns],
                "earliest onset": [_step_text(earliest.get(role)) for role in counts.columns],
                "onsets": [int((status.get_group(r) == "onset").sum()) for r in counts.columns],
                "end only": [int((status.get_group(r) == "end_only").sum()) for r in counts.columns],
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
    track: pd.DataFrame,
    task: str,
    out_dir: Path,
    stem: str,
    heldout: pd.DataFrame | None = None,
    sas: pd.DataFrame | None = None,
    curves: pd.DataFrame | None = None,
    onsets: pd.DataFrame | None = None,
    *,
    about: str = "",
) -> list[Path]:
    """On one step axis, top to bottom: the run's held-out MLM loss at every evaluation (when it
    recorded one), the SAS with its best offset baseline (when tracked; `sas` is the `sas.csv`
    table), per role the number of heads holding it, and each head's onset with its interval (when
    `onsets` has intervals). The loss's changepoint interval (`curves`) is shaded on every panel.
    `about`: the model · N · τ line under the title."""
    counts = heads_holding(track, task)
    steps = counts.index.to_numpy()
    loss = None if heldout is None or LOSS_CURVE not in heldout else heldout[LOSS_CURVE].dropna()
    overall = None if sas is None else sas[sas["relation"] == "all"].set_index("step").sort_index()
    task_onsets = None if onsets is None else onsets[(onsets["task"] == task) & (onsets["status"] == "onset")]
    with_intervals = bool(task_onsets is not None and not task_onsets.empty and task_onsets["onset_low"].notna().any())
    panels = (["loss"] * (loss is not None and not loss.empty) + ["sas"] * (overall is not None) + ["roles"]
              + ["onsets"] * with_intervals)  # fmt: skip
    heights = {
        "loss": 1.0,
        "sas": 1.0,
        "roles": 1.6,
        "onsets": 0.5 + 0.12 * (len(task_onsets) if with_intervals and task_onsets is not None else 0),
    }
    fig = Figure(figsize=(7.2, 1.2 + sum(heights[p] for p in panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, height_ratios=[heights[p] for p in panels])[:, 0]
    shade = _changepoint(curves, LOSS_CURVE, "")
    sas_point = _changepoint(curves, SAS_CURVE, "")
    colours = role_colours(list(counts.columns))
    for ax, panel in zip(axes, panels, strict=True):
        if panel == "loss":
            assert loss is not None  # the panel is drawn only with a loss curve
            ax.plot(loss.index, loss.to_numpy(), color="black", marker="o", markersize=2)
            ax.set_ylabel("held-out\nMLM loss")
        elif panel == "sas":
            assert overall is not None  # the panel is drawn only with the SAS
            ax.plot(overall.index, overall["uas"], color="#1f77b4", marker="o", markersize=3, label="SAS (best head)")
            ax.plot(overall.index, overall["baseline_uas"], color="grey", linestyle=":", label="best offset")
            ax.set_ylabel("UAS, all words")
            ax.legend(fontsize=7, loc="upper left")
            if sas_point is not None and sas_point[0] is not None:
                ax.axvline(sas_point[0], color="#1f77b4", linestyle="--", linewidth=1)
        elif panel == "roles":
            offsets = equal_curve_offsets(counts)
            for i, role in enumerate(counts.columns):
                ax.plot(steps, counts[role] + offsets[role], marker=MARKERS[i % len(MARKERS)], markersize=4,
                        markerfacecolor="none", color=colours[role], label=role)  # fmt: skip
            ax.set_ylabel(f"heads holding the role\n(of {track_heads(track, task)})")
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            spread = max(abs(v) for v in offsets.values())
            ax.set_ylim(-0.3 - spread, max(1, int(counts.to_numpy().max())) + 0.3 + spread)
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        else:
            _plot_onset_intervals(ax, task_onsets, steps, colours)
        if shade is not None and shade[1] is not None:
            ax.axvspan(
                shade[1], shade[2] if shade[2] is not None else steps.max(), color="#ff7f0e", alpha=0.15, linewidth=0
            )
    step_axis(axes[-1], steps)
    n = int(track[track["task"] == task]["n"].max()) if "n" in track else None
    notes = [f"N ≤ {n}" if n is not None else ""]
    if shade is not None and shade[0] is not None:
        notes.append(
            f"loss changepoint {shade[0]}, 90% interval {_step_text(shade[1])}–{_step_text(shade[2])} (shaded)"
        )
    if sas_point is not None and sas_point[0] is not None:
        notes.append(f"SAS changepoint {sas_point[0]} (dashed)")
    what = ", ".join(
        ["held-out loss"] * ("loss" in panels) + ["syntactic attention"] * ("sas" in panels) + ["head roles"]
    )
    if any(offsets.values()):
        notes.append("equal counts drawn apart")
    # A figure title, not the top panel's: constrained layout keeps it and the y labels inside the
    # figure, where a long axes title ran past both edges.
    fig.suptitle(f"{task}: {what} during training\n" + (f"{about}\n" if about else "")
                 + "; ".join(x for x in notes if x), fontsize=9)  # fmt: skip
    return save_figure(fig, out_dir, stem)


# Markers of the role curves, so that curves on the same counts stay told apart.
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "p", "h", "*")
# How far apart curves of equal counts are drawn, in heads.
EQUAL_OFFSET = 0.06


def equal_curve_offsets(counts: pd.DataFrame) -> dict[str, float]:
    """Per role, a small vertical offset that spreads the curves of equal counts around their value
    (0 for a curve no other one equals): drawn exactly, they hid each other."""
    offsets = dict.fromkeys(counts.columns, 0.0)
    groups: dict[tuple, list[str]] = {}
    for role in counts.columns:
        groups.setdefault(tuple(counts[role].tolist()), []).append(role)
    for roles in groups.values():
        for j, role in enumerate(roles):
            offsets[role] = (j - (len(roles) - 1) / 2) * EQUAL_OFFSET if len(roles) > 1 else 0.0
    return offsets


def _changepoint(curves: pd.DataFrame | None, curve: str, task: str):
    """(step, low, high) of a curve's changepoint in `curves`, None when it has no row."""
    if curves is None:
        return None
    rows = curves[(curves["curve"] == curve) & (curves["task"].fillna("") == task)]
    if rows.empty:
        return None
    row = rows.iloc[0]

    def step(v):
        return None if pd.isna(v) else int(v)

    return step(row["changepoint_step"]), step(row["changepoint_low"]), step(row["changepoint_high"])


def _plot_onset_intervals(ax, onsets: pd.DataFrame, steps: np.ndarray, colours: dict) -> None:
    """One line per head with an onset: its 90% interval (an arrow to the last step when the
    interval reaches "no onset"), a thin line back to the analysed step before it, and the onset
    step as a dot."""
    ordered = onsets.sort_values(["role", "onset_step", "layer", "head"], key=lambda c: c.map(
        {r: i for i, r in enumerate(colours)}) if c.name == "role" else c)  # fmt: skip
    for y, row in enumerate(ordered.itertuples()):
        colour = colours.get(row.role, "black")
        low = steps.min() if pd.isna(row.onset_low) else row.onset_low
        high = steps.max() if pd.isna(row.onset_high) else row.onset_high
        # Thin: from the analysed step before the interval, after which the role came on.
        ax.plot([step_before(low, steps), low], [y, y], color=colour, linewidth=0.6)
        ax.plot([low, high], [y, y], color=colour, linewidth=1.5, solid_capstyle="butt")
        if pd.isna(row.onset_high):
            ax.plot([high], [y], marker=">", color=colour, markersize=4)
        ax.plot([row.onset_step], [y], marker="o", color=colour, markersize=3)
    ax.set_yticks(range(len(ordered)))
    # Each onset's relation to the loss changepoint, as onset.csv's vs_loss says it.
    relation = {"before": " (before)", "overlapping": " (with loss)", "after": " (after)"}
    ax.set_yticklabels([f"{r.role} {r.layer}-{r.head}{relation.get(getattr(r, 'vs_loss', ''), '')}"
                        for r in ordered.itertuples()], fontsize=6)  # fmt: skip
    ax.set_ylim(-0.7, len(ordered) - 0.3)
    ax.invert_yaxis()
    ax.set_ylabel("onsets\n(90%)", fontsize=8)
