"""Per-task head tables and the end-of-run summary: how many heads hold each coarse role.

The tables here (heads × roles, one task at a time) are shared with `analysis.heads.figures`, so every
figure and the printed summary count heads the same way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

FINE_ROLES: tuple[str, ...] = (
    "local", "prev", "next", "block", "cls", "sep", "delimiter",
    "nsubj", "dobj", "amod", "advmod", "syntactic",
)  # fmt: skip
COARSE_ROLES: tuple[str, ...] = ("local", "syntactic", "block", "delimiter")
DEFAULT_COARSE: Mapping[str, str] = MappingProxyType(
    {
        "local": "local", "prev": "local", "next": "local",
        "nsubj": "syntactic", "dobj": "syntactic", "amod": "syntactic", "advmod": "syntactic",
        "syntactic": "syntactic",
        "block": "block",
        "cls": "delimiter", "sep": "delimiter", "delimiter": "delimiter",
    }
)  # fmt: skip


class Correlation(NamedTuple):
    """Spearman's ρ between two per-head quantities, its two-sided p and the heads it used."""

    rho: float
    p_value: float
    n_heads: int


def ordered_roles(names: Iterable[str]) -> list[str]:
    """The known fine roles in canonical order, then user-defined roles in order of appearance."""
    present = list(dict.fromkeys(names))
    return [r for r in FINE_ROLES if r in present] + [r for r in present if r not in FINE_ROLES]


def ordered_coarse(coarse: Mapping[str, str]) -> list[str]:
    """The standard coarse roles first, then any others the mapping introduces."""
    extra = [c for c in dict.fromkeys(coarse.values()) if c not in COARSE_ROLES]
    return list(COARSE_ROLES) + extra


def task_rows(roles: pd.DataFrame, task: str) -> pd.DataFrame:
    """The rows of one task; a task with no rows is a caller bug, not an empty result."""
    rows = roles[roles["task"] == task]
    if rows.empty:
        raise ValueError(f"no rows for task {task!r}")
    return rows


def head_table(roles: pd.DataFrame, task: str, column: str) -> pd.DataFrame:
    """One column of one task as a (layer, head) × role table over the full L × H grid.

    L and H are one past the largest layer and head index of the task; a head with no row for a
    role gets NaN.
    """
    rows = task_rows(roles, task)
    grid = pd.MultiIndex.from_product(
        [range(int(rows["layer"].max()) + 1), range(int(rows["head"].max()) + 1)],
        names=["layer", "head"],
    )
    wide = rows.set_index(["layer", "head", "role"])[column].unstack("role")
    return wide.reindex(index=grid, columns=ordered_roles(rows["role"]))


def held_table(roles: pd.DataFrame, task: str) -> pd.DataFrame:
    """Which fine roles each head of a task holds (bool, full grid; a missing row is not held)."""
    return head_table(roles, task, "assigned").astype("boolean").fillna(False).astype(bool)


def coarse_held_table(held: pd.DataFrame, coarse: Mapping[str, str]) -> pd.DataFrame:
    """Which coarse roles each head holds: any of its fine roles held.

    Only coarse roles with at least one fine role tested for the task appear (SST-2 has no
    block); fine roles the mapping does not name count towards no coarse role.
    """
    mapped = [r for r in held.columns if r in coarse]
    by_coarse = held[mapped].T.groupby(pd.Series(dict(coarse))[mapped]).any().T
    present = [c for c in ordered_coarse(coarse) if c in by_coarse.columns]
    return by_coarse[present]


# Up to this many heads Spearman's p is exact (`exact_spearman_p`): scipy's t approximation gave
# p = 0 for 4 heads in perfect order (exact: 0.083) and missed the exact p by up to 30% at 6 and
# 8 heads (p < 0.2). The bound is the enumeration's cost: 10! = 3.6 million pairings take ~0.2 s
# on a laptop-class CPU, and each head more multiplies it (11: ~2.5 s); beyond it, the t
# approximation, whose error shrinks as the heads grow (a 12-layer model has 144).
EXACT_SPEARMAN_MAX_N = 10
# Pairings held in memory at once: those of the last 8 points (8! = 40320), one prefix at a time.
_ENUMERATED_TAIL = 8


def exact_spearman_p(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's two-sided exact p: the share of the n! pairings of y's ranks with x's whose |ρ|
    reaches the observed one (every pairing equally likely under independence; tied values keep
    their average ranks, so this is the exact test conditional on the ties). ρ of a pairing is
    Σ a_i b_π(i) up to a factor every pairing shares, with a and b the ranks doubled and centred:
    integers, so equal values of ρ compare equal."""
    a, b = (np.rint(2 * stats.rankdata(v) - (len(v) + 1)).astype(np.int64) for v in (x, y))
    n = len(a)
    observed = abs(int(a @ b))
    fixed = max(0, n - _ENUMERATED_TAIL)  # positions enumerated one prefix at a time
    tail = np.array(list(itertools.permutations(range(n - fixed))), dtype=np.int64).reshape(-1, n - fixed)
    reaching = 0
    for prefix in itertools.permutations(range(n), fixed):
        rest = b[np.setdiff1d(np.arange(n), prefix)]
        sums = int(a[:fixed] @ b[list(prefix)]) + rest[tail] @ a[fixed:]
        reaching += int(np.count_nonzero(np.abs(sums) >= observed))
    return reaching / math.factorial(n)


def spearman(x: np.ndarray, y: np.ndarray) -> Correlation:
    """Spearman's ρ over the pairs where both are finite; NaN when undefined (constant or < 3). Its
    p is exact up to `EXACT_SPEARMAN_MAX_N` pairs, scipy's t approximation beyond."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    both = np.isfinite(x) & np.isfinite(y)
    x, y = x[both], y[both]
    n = int(both.sum())
    # scipy warns and returns NaN on constant input; check first so a degenerate task stays quiet.
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return Correlation(math.nan, math.nan, n)
    result = stats.spearmanr(x, y)
    p = exact_spearman_p(x, y) if n <= EXACT_SPEARMAN_MAX_N else float(result.pvalue)
    return Correlation(float(result.statistic), p, n)


def local_syntactic_spearman(roles: pd.DataFrame, task: str) -> Correlation | None:
    """ρ between the heads' mean local and mean syntactic β, or None if either role is absent."""
    means = head_table(roles, task, "mean")
    if not {"local", "syntactic"} <= set(means.columns):
        return None
    return spearman(means["local"].to_numpy(), means["syntactic"].to_numpy())


def summarize(roles: pd.DataFrame, coarse: Mapping[str, str] = DEFAULT_COARSE) -> pd.DataFrame:
    """One row per task (in order of appearance), percentages in 0–100.

    Columns: `task`, `n_heads`; `pct_<coarse role>` (NaN when none of its fine roles was tested:
    a fine role is tested when at least one head has a p-value, so not where n < 2 everywhere);
    `pct_unskilled` (heads holding no role at all, fine roles outside `coarse` included; NaN when
    no role was tested);
    `pct_syntactic_also_local` (NaN without syntactic heads); `spearman_rho`, `spearman_p`,
    `spearman_n` over the heads' mean local and syntactic β (NaN if either role is absent).
    """
    records = []
    for task in pd.unique(roles["task"]):
        held = held_table(roles, task)
        tested = head_table(roles, task, "p_value").notna().any(axis=0)
        held = held.loc[:, tested[held.columns].to_numpy()]
        by_coarse = coarse_held_table(held, coarse)
        record: dict[str, object] = {"task": task, "n_heads": len(held)}
        for name in ordered_coarse(coarse):
            record[f"pct_{name}"] = 100.0 * by_coarse[name].mean() if name in by_coarse.columns else math.nan
        record["pct_unskilled"] = 100.0 * (~held.any(axis=1)).mean() if held.columns.size else math.nan
        if {"syntactic", "local"} <= set(by_coarse.columns) and by_coarse["syntactic"].any():
            syntactic = by_coarse["syntactic"]
            record["pct_syntactic_also_local"] = 100.0 * by_coarse["local"][syntactic].mean()
        else:
            record["pct_syntactic_also_local"] = math.nan
        corr = local_syntactic_spearman(roles, task)
        record["spearman_rho"] = corr.rho if corr else math.nan
        record["spearman_p"] = corr.p_value if corr else math.nan
        record["spearman_n"] = corr.n_heads if corr else 0
        records.append(record)
    return pd.DataFrame.from_records(records)


def _pct(value: float) -> str:
    return "not tested" if math.isnan(value) else f"{value:.1f}%"


def format_summary(df: pd.DataFrame, sequences: Mapping[str, int] | None = None) -> str:
    """A few lines per task of `summarize`'s table, for the end of a CLI run; `sequences`, the
    number of sequences each task scored, is printed as N."""
    coarse_cols = [
        c for c in df.columns if c.startswith("pct_") and c not in ("pct_unskilled", "pct_syntactic_also_local")
    ]
    blocks = []
    for _, row in df.iterrows():
        task = row["task"]
        shares = ", ".join(f"{c.removeprefix('pct_')} {_pct(row[c])}" for c in coarse_cols)
        also_local = row["pct_syntactic_also_local"]
        lines = [
            f"{task}: "
            + (f"N = {sequences[task]} sequences, " if sequences and task in sequences else "")
            + f"{int(row['n_heads'])} heads",
            f"  heads holding: {shares}; unskilled {_pct(row['pct_unskilled'])}",
            "  syntactic heads also local: "
            + ("n/a (no syntactic heads)" if math.isnan(also_local) else f"{also_local:.1f}%"),
        ]
        rho, n_corr = row["spearman_rho"], int(row["spearman_n"])
        if n_corr == 0:
            corr = "n/a (no head has both a local and a syntactic score)"
        elif math.isnan(rho):
            corr = f"undefined ({n_corr} heads)"
        else:
            corr = f"{rho:+.3f} (p = {row['spearman_p']:.2g}, {n_corr} heads)"
        lines.append(f"  Spearman rho(local, syntactic mean beta): {corr}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


GROUP_NAMES = {3: ("initial", "middle", "final"), 2: ("initial", "final"), 1: ("all",)}


def layer_groups(n_layers: int) -> list[tuple[str, np.ndarray]]:
    """The initial, middle and final third of the layers (`np.array_split`: earlier groups take
    the remainder, e.g. 2/1/1 for 4 layers); 2 layers make an initial and a final group, 1 one."""
    parts = np.array_split(np.arange(n_layers), min(3, n_layers))
    return list(zip(GROUP_NAMES[len(parts)], parts, strict=True))
