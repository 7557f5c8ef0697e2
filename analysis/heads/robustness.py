"""Whether a headline relation of a track survives other reasonable definitions (`robustness.csv`).

A headline relation is a role group's earliest head (per task: local, syntactic, block, delimiter,
as `analysis.heads.summary.DEFAULT_COARSE` groups the roles) against the reference curve: before,
overlapping or after. It is recomputed

- as the paper's threshold reading (`onset`: the earliest onset at τ against the curve's
  changepoint interval, as onset.csv's `vs_loss`) under τ ∈ {2, 3, 5, 8}, both held-out curves
  (the MLM loss, the reference, and the accuracy) and changepoint segment caps 3–6;
- as event times (`rise_start`, `rise_50`: the earliest event of the group's heads against the
  curve's same event, by the interval of their difference, `analysis.heads.events`) under both
  curves and, since which heads belong to a group is read from the last step's test, each τ;
- each of these under every score it is given (`score`: beta, share), one `Scored` per score: the
  run's own, and the other where its per-sequence scores are derived from the same attention
  (`analysis.heads.scoring.convert_score`: a sequence's share score is its β times N / n).

The point tests at each τ are recomputed from each score's track table (mean, SD and n: the t or z
tail the run used, its correction per step); the changepoint and event intervals are the run's own
resampling, the same replicates under every score.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd
from scipy import special

from analysis.common import changepoint
from analysis.heads import events, onset, scoring
from analysis.heads.config import RolesConfig
from analysis.heads.intervals import PairedResampler, onset_index
from analysis.heads.scoring import TaskScores
from sieves import stats
from sieves.align import encode_batch
from sieves.choices import Correction, Test

ROBUSTNESS_CSV = "robustness.csv"
TAUS = (2.0, 3.0, 5.0, 8.0)
CAPS = (3, 4, 5, 6)
EVENT_READINGS = ("rise_start", "rise_50")
COLUMNS = ["task", "group", "reading", "score", "tau", "curve", "cap", "step", "relation"]


@dataclasses.dataclass(frozen=True)
class Scored:
    """A run read under one score: its track table (track.csv's columns) and its heads' events."""

    track: pd.DataFrame
    heads: events.Trajectories


def held_at(track: pd.DataFrame, tau: float, alpha: float, correction: Correction, test: Test) -> np.ndarray:
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


def robustness(scored: dict[str, Scored], heldout: pd.DataFrame | None, heldout_reps: dict[str, np.ndarray],
               persistence: int, alpha: float, correction: Correction, test: Test, replicates: int, seed: int,
               groups: dict[str, str]) -> pd.DataFrame:  # fmt: skip
    """`robustness.csv`: one row per task, group, reading and variant (the module doc), the scores
    in `scored`'s order; empty without held-out metrics."""
    if heldout is None:
        return pd.DataFrame(columns=COLUMNS)
    steps = sorted(pd.unique(next(iter(scored.values())).track["step"]))
    curves = events.heldout_curves(heldout, heldout_reps, steps)
    changepoints = {}
    for name, falling in events.HELDOUT_CURVES:
        if name in heldout:
            present = heldout[name].notna().to_numpy()
            reps = heldout_reps.get(name)
            for cap in CAPS:
                changepoints[(name, cap)] = changepoint.curve_changepoint(
                    heldout.index[present], heldout[name][present], falling, replicates if reps is None else 0, seed,
                    None if reps is None else reps[:, present], max_segments=cap, smooth=False,
                )  # fmt: skip
    rows = []
    for score, reading in scored.items():
        rows += _score_rows(score, reading, steps, heldout, curves, changepoints, persistence, alpha, correction,
                            test, groups)  # fmt: skip
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table.astype({"cap": "Int64", "step": "Int64"})


def _score_rows(score: str, scored: Scored, steps: list, heldout: pd.DataFrame, curves: dict, changepoints: dict,
                persistence: int, alpha: float, correction: Correction, test: Test, groups: dict[str, str]) -> list[tuple]:  # fmt: skip
    """The rows of one score: every τ, curve and cap."""
    key = ["task", "layer", "head", "role"]
    ordered, heads = scored.track.sort_values("step", kind="stable"), scored.heads
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
                rows.append((task, group, "onset", score, tau, name, cap, first, relation))
        members_index = pd.MultiIndex.from_frame(heads.rows[key])
        members = last.reindex(members_index).fillna(False).to_numpy(bool) & (heads.status != "no_rise")
        found = events.group_earliest(heads, members, groups)
        for name, curve in curves.items():
            table = events.lead_lag(found, events.curve_steps(curve), name)
            for r in table[table["event"].isin(EVENT_READINGS)].itertuples():
                rows.append((r.task, r.group, r.event, score, tau, name, pd.NA, r.earliest_step, r.relation))
    return rows


def sequence_lengths(tokenizer, inputs) -> dict[str, np.ndarray]:
    """Each task's real-token count per example (indexed by example index) as the run encodes its
    examples (`analysis.common.examples.Inputs`, all of them: every process's share); the words
    are not needed for a length, so nothing is parsed."""
    lengths = {}
    for task, data in inputs.data.items():
        encoded = encode_batch(tokenizer, data.segments, None, inputs.config.max_length, data.indices)
        lengths[task] = np.zeros(max(data.indices, default=-1) + 1, np.int64)
        lengths[task][[s.index for s in encoded]] = [s.length for s in encoded]
    return lengths


def other_score(score: str, steps: list, rows: pd.DataFrame, scores_at: Callable[[int], dict[str, TaskScores]],
                lengths: dict[str, np.ndarray], config: RolesConfig, resampler: PairedResampler) -> Scored:  # fmt: skip
    """The run read under the other score `score`: each step's per-sequence scores (`scores_at`,
    under the run's score) converted (`scoring.convert_score`) and summarised as track.csv's are
    (`scoring.test_roles` under `config`), and the heads' events over the steps (`rows`: track.csv's
    heads in order), their replicates drawn by `resampler` as the run's are (the same resamples:
    both scores' intervals come from one draw)."""
    tables, means, replicates = [], [], []
    for step in steps:
        converted = scoring.convert_score(scores_at(step), lengths, score)
        table, _ = scoring.test_roles(converted, config)
        tables.append(table.assign(step=step))
        means.append(table["mean"].to_numpy(np.float64))
        replicates.append(resampler.means(converted))
    heads = events.trajectories(rows, steps, np.stack(means), np.stack(replicates, axis=1))
    return Scored(pd.concat(tables, ignore_index=True), heads)


def summary_lines(table: pd.DataFrame) -> list[str]:
    """Per task, group and reading: the relation when every variant agrees, else how they split
    (and, with more than one score, how each score's variants split; a table written before the
    `score` column holds one)."""
    lines = []
    for (task, group, reading), part in table.groupby(["task", "group", "reading"], sort=False):
        line = f"  {task} {group} {reading}: {_split(part)}"
        if "score" in part and part["score"].nunique() > 1 and part["relation"].nunique() > 1:
            scores = part.groupby("score", sort=False)
            line += " (" + "; ".join(f"{score}: {_split(own)}" for score, own in scores) + ")"
        lines.append(line)
    return lines


def _split(part: pd.DataFrame) -> str:
    counts = part["relation"].replace("", "none").value_counts()
    if len(counts) == 1:
        return f"{counts.index[0]} under all {len(part)} variants"
    return f"not robust ({', '.join(f'{rel} {n}' for rel, n in counts.items())} of {len(part)} variants)"
