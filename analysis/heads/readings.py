"""`analysis.roles --attention both`: the second reading's files beside the first's, and their
decisions side by side (docs/attention-norms.md).

The first reading (the weights) writes roles.csv, scores.npz, summary.csv and the figures exactly
as a run of it alone would; the second (the norm-weighted attention of Kobayashi et al. 2020)
writes roles_norms.csv, scores_norms.npz and summary_norms.csv, tested on its own (its τ under
`--tau auto`, its own family under `--correction`), and readings.csv holds, per task, layer,
head and role, the mean β and the decision under each reading.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.heads import summary
from analysis.heads.config import RolesConfig
from analysis.heads.scoring import TaskScores, score_arrays, test_roles
from sieves.builders import ROLES

COMPARISON = "readings.csv"
KEYS = ["task", "layer", "head", "role"]


@dataclasses.dataclass(eq=False)
class Reading:
    """The second reading of a `both` run, held in memory: its roles table and τ (tested on its
    own), its per-sequence scores and the decisions side by side with the first reading's."""

    name: str
    table: pd.DataFrame
    tau: float
    results: dict[str, TaskScores]
    comparison: pd.DataFrame


def compute(first: str, first_table: pd.DataFrame, reading: str, results: dict[str, TaskScores],
            config: RolesConfig) -> Reading:  # fmt: skip
    table, tau = test_roles(results, config)
    return Reading(reading, table, tau, results, side_by_side(first_table, first, table, reading))


def write(directory: Path, reading: Reading) -> dict:
    """Writes `reading`'s tables and the comparison into `directory`; returns run.json's record."""
    name = reading.name
    files = {"roles": f"roles_{name}.csv", "scores": f"scores_{name}.npz", "summary": f"summary_{name}.csv"}
    reading.table.to_csv(directory / files["roles"], index=False)
    # Numbers only: np.load reads it unpickled.
    np.savez(directory / files["scores"], allow_pickle=False, **score_arrays(reading.results))
    coarse = {role_name: role.coarse for role_name, role in ROLES.items()}
    summary.summarize(reading.table, coarse=coarse).to_csv(directory / files["summary"], index=False)
    reading.comparison.to_csv(directory / COMPARISON, index=False)
    return {"tau": reading.tau, **files, "comparison": COMPARISON}


def side_by_side(first: pd.DataFrame, first_name: str, second: pd.DataFrame, second_name: str) -> pd.DataFrame:
    """One row per (task, layer, head, role): `mean_<reading>` and `assigned_<reading>` of each."""
    columns = ("mean", "assigned")

    def named(table: pd.DataFrame, name: str) -> pd.DataFrame:
        return table[KEYS + list(columns)].rename(columns={c: f"{c}_{name}" for c in columns})

    merged = named(first, first_name).merge(named(second, second_name), on=KEYS, how="left", validate="1:1")
    return merged[KEYS + [f"{c}_{n}" for c in columns for n in (first_name, second_name)]]


def held_counts(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per task and role: the heads holding it on each reading, and on both."""
    names = [c.removeprefix("assigned_") for c in comparison.columns if c.startswith("assigned_")]
    held = comparison.assign(both=comparison[[f"assigned_{n}" for n in names]].all(axis=1))
    counts = held.groupby(["task", "role"], sort=False)[[f"assigned_{n}" for n in names] + ["both"]].sum()
    return counts.rename(columns={f"assigned_{n}": n for n in names}).reset_index()


def format_counts(comparison: pd.DataFrame) -> str:
    """The end-of-run lines of a `both` run: per task and role, heads held on each reading."""
    counts = held_counts(comparison)
    columns = list(counts.columns[2:])
    # A reading no head of a role has a mean on (every head undefined) is not a count of 0.
    means = [c for c in comparison.columns if c.startswith("mean_")]
    tested = comparison.groupby(["task", "role"], sort=False)[means].agg(lambda c: c.notna().any()).reset_index()
    tested = tested.rename(columns={c: c.removeprefix("mean_") for c in means}).assign(both=tested[means].all(axis=1))

    def count(row: pd.Series, done: pd.Series, column: str) -> str:
        return str(int(row[column])) if done[column] else "untested"

    lines = [f"heads holding each role on the {' / '.join(columns)}:"]
    for task, rows in counts.groupby("task", sort=False):
        held = (
            f"{row['role']} {' / '.join(count(row, done, c) for c in columns)}"
            for (_, row), (_, done) in zip(rows.iterrows(), tested[tested["task"] == task].iterrows(), strict=True)
        )
        lines.append(f"  {task}: " + "; ".join(held))
    return "\n".join(lines)
