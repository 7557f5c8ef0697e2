"""When each head takes on each role during training, read against how well the model has learnt.

A head's *onset* for a role is the first analysed step from which it holds the role at every later
analysed step: a role that flickers on and off dates from when it last came on, and a role lost by
the last step has no onset. Learning is read from the held-out metrics a bertjax pre-training run
writes into `metrics.jsonl` at every checkpoint (`heldout.corpora` in the pre-training config).

Curves get onsets too (`curve_onsets`, docs/tracking.md): the held-out MLM loss, the SAS
(`analysis.attention.sas`) and each role's count of heads holding it. Two readings per curve, both
on the analysed steps in linear step units and in the curve's improving direction (the loss falls,
the others rise):

- the *steepest change*: the consecutive analysed steps (a, b) over which the curve improves fastest
  per e-fold of steps, (y_b − y_a) / ln((1 + b) / (1 + a)) for a rising curve. Per e-fold, not per
  step, because tracked checkpoints are log-spaced: per step, the first few checkpoints (1, 2, 4,
  …), where any curve moves off its initial value, would always win over a later, larger drop (on
  the synthetic language, 4 → 16 instead of the drop that comes with the heads, 251 → 1000);
- the *onset* (break point): the curve is fit by least squares with a ramp
  y = p + q · clip(s − b, 0, e − b), flat up to b, straight from b to e, flat after, for every pair
  of analysed steps b < e; the onset is the b of the smallest residual sum of squares (the earliest
  on a tie), and there is none when that ramp does not rise (q ≤ 0) or the curve has under three
  points. A monotone curve without plateau is fit by e = its last step, a hinge.
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
CURVE_ONSETS_CSV = "curve_onsets.csv"
CURVE_COLUMNS = ["curve", "task", "onset_step", "steepest_from", "steepest_to", "steepest_rate"]
LOSS_CURVE = "heldout_mlm_loss"
ACCURACY_CURVE = "heldout_mlm_accuracy"
SAS_CURVE = "sas"


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


def steepest_change(steps: np.ndarray, values: np.ndarray) -> tuple[int, int, float] | None:
    """(a, b, rate): the consecutive steps over which a rising curve rises fastest per e-fold of
    (1 + step) (the first such pair on a tie); None with fewer than two points or no rise."""
    steps, values = np.asarray(steps, np.float64), np.asarray(values, np.float64)
    if steps.size < 2:
        return None
    rates = np.diff(values) / np.diff(np.log1p(steps))
    best = int(np.argmax(rates))
    if not rates[best] > 0:
        return None
    return int(steps[best]), int(steps[best + 1]), float(rates[best])


def ramp_onset(steps: np.ndarray, values: np.ndarray) -> int | None:
    """The break of a rising curve: the b of the least-squares ramp p + q · clip(s − b, 0, e − b)
    (flat, a straight rise from b to e, flat) over every pair of analysed steps b < e, the earliest
    b (then e) on a tie; None when the best ramp does not rise (q ≤ 0) or there are under 3 points."""
    steps, values = np.asarray(steps, np.float64), np.asarray(values, np.float64)
    if steps.size < 3:
        return None
    best = (np.inf, None)
    # Residuals of equally good fits differ by rounding (~ n·eps·Σy²): those count as ties.
    tolerance = 64 * steps.size * np.finfo(float).eps * max(1.0, float(np.sum(values**2)))
    for i, b in enumerate(steps[:-1]):
        ends = steps[i + 1 :, None]
        x = np.clip(steps[None, :] - b, 0.0, ends - b)  # [ends, points]
        xc = x - x.mean(axis=1, keepdims=True)
        q = (xc @ (values - values.mean())) / np.sum(xc**2, axis=1)
        residual = np.sum((values - values.mean() - q[:, None] * xc) ** 2, axis=1)
        k = int(np.argmin(residual))
        if residual[k] < best[0] - tolerance:
            best = (float(residual[k]), (int(b), float(q[k])))
    b, q = best[1]
    return b if q > 0 else None


def curve_onset_row(curve: str, task: str, steps, values, falling: bool = False) -> dict:
    """One row of `curve_onsets.csv`: a falling curve (the loss) is read as its negation."""
    values = -np.asarray(values, np.float64) if falling else np.asarray(values, np.float64)
    steepest = steepest_change(steps, values)
    start, end, rate = (None, None, np.nan) if steepest is None else steepest
    onset_step = ramp_onset(steps, values)
    return {"curve": curve, "task": task, "onset_step": onset_step, "steepest_from": start, "steepest_to": end,
            "steepest_rate": -rate if falling else rate}  # fmt: skip


def curve_onsets(track: pd.DataFrame, heldout: pd.DataFrame | None, sas: pd.Series | None) -> pd.DataFrame:
    """The onsets of the held-out MLM loss and accuracy (at the analysed steps they were recorded), of the SAS and
    of each task's role counts; `steepest_rate` is per e-fold of (1 + step), negative for the loss."""
    rows = []
    steps = np.sort(pd.unique(track["step"]))
    # Both held-out curves: the loss's steepest drop is often its first descent, from the initial
    # guess to the unigram plateau, which leaves the accuracy near zero; the accuracy rises fastest
    # when the model starts to read context (the real-text run in docs/emergence.md: 36 → 66 for
    # the loss, 1326 → 2414 for the accuracy, where the positional heads form).
    for curve, falling in ((LOSS_CURVE, True), (ACCURACY_CURVE, False)):
        if heldout is not None and curve in heldout:
            values = heldout.loc[heldout.index.isin(steps), curve].dropna()
            rows.append(curve_onset_row(curve, "", values.index.to_numpy(), values.to_numpy(), falling=falling))
    if sas is not None:
        rows.append(curve_onset_row(SAS_CURVE, "", sas.index.to_numpy(), sas.to_numpy()))
    for task in pd.unique(track["task"]):
        counts = heads_holding(track, task)
        for role in counts.columns:
            rows.append(curve_onset_row(f"heads:{role}", task, counts.index.to_numpy(), counts[role].to_numpy()))
    return pd.DataFrame(rows, columns=CURVE_COLUMNS).astype(
        {"onset_step": "Int64", "steepest_from": "Int64", "steepest_to": "Int64"}
    )


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
    track: pd.DataFrame,
    task: str,
    out_dir: Path,
    stem: str,
    heldout: pd.DataFrame | None = None,
    sas: pd.DataFrame | None = None,
) -> list[Path]:
    """On one step axis, top to bottom: the run's held-out MLM loss (when it recorded one), the SAS
    with its best offset baseline (when tracked; `sas` is the `sas.csv` table), and per role the
    number of heads holding it. The loss's steepest drop is shaded and the SAS onset dashed."""
    counts = heads_holding(track, task)
    steps = counts.index.to_numpy()
    loss = (
        None
        if heldout is None or LOSS_CURVE not in heldout
        else heldout.loc[heldout.index.isin(steps), LOSS_CURVE].dropna()
    )
    overall = None if sas is None else sas[sas["relation"] == "all"].set_index("step").sort_index()
    panels = ["loss"] * (loss is not None and not loss.empty) + ["sas"] * (overall is not None) + ["roles"]
    fig = Figure(figsize=(7.2, 2.0 + 1.6 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, height_ratios=[1] * (len(panels) - 1) + [1.6])[:, 0]
    drop = None if "loss" not in panels else steepest_change(loss.index.to_numpy(), -loss.to_numpy())
    sas_onset = None if overall is None else ramp_onset(overall.index.to_numpy(), overall["uas"].to_numpy())
    for ax, panel in zip(axes, panels, strict=True):
        if panel == "loss":
            ax.plot(loss.index, loss.to_numpy(), color="black", marker="o", markersize=3)
            ax.set_ylabel("held-out\nMLM loss")
        elif panel == "sas":
            ax.plot(overall.index, overall["uas"], color="#1f77b4", marker="o", markersize=3, label="SAS (best head)")
            ax.plot(overall.index, overall["baseline_uas"], color="grey", linestyle=":", label="best offset")
            ax.set_ylabel("UAS, all words")
            ax.legend(fontsize=7, loc="upper left")
        else:
            colours = role_colours(list(counts.columns))
            for role in counts.columns:
                ax.plot(steps, counts[role], marker="o", markersize=3, color=colours[role], label=role)
            ax.set_ylabel(f"heads holding the role\n(of {track_heads(track, task)})")
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(-0.3, max(1, int(counts.to_numpy().max())) + 0.3)
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        if drop is not None:
            ax.axvspan(drop[0], drop[1], color="#ff7f0e", alpha=0.15, linewidth=0)
        if sas_onset is not None:
            ax.axvline(sas_onset, color="#1f77b4", linestyle="--", linewidth=1)
    step_axis(axes[-1], steps)
    notes = []
    if drop is not None:
        notes.append(f"; steepest loss drop {drop[0]}–{drop[1]} (shaded)")
    if sas_onset is not None:
        notes.append(f"; SAS onset {sas_onset} (dashed)")
    axes[0].set_title(
        f"{task}: loss, syntactic attention and head roles during training" + "".join(notes),
        fontsize=9,
    )
    return save_figure(fig, out_dir, stem)
