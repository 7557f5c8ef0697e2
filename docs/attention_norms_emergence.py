"""The training-run table of docs/attention-norms.md: along a pre-training run's checkpoints, the
heads holding each role on the weights, on the norm-weighted attention (Kobayashi et al. 2020) and
on both: do the [CLS]/[SEP] heads of the unigram plateau pass anything on?

    python docs/attention_norms_emergence.py WORKDIR NAME [OUT]

runs `python -m analysis.track --run WORKDIR` twice, `--attention weights` and `--attention norms`,
on the first 200 MRPC dev pairs at max length 64 (the emergence recipe's sequence length; τ = 3,
the one-sided t-test, α = 0.05, every role, GLUE from $BERTJAX_DATA/glue), into OUT (default
runs/norms-NAME, with a scores cache beside each), then writes the counts per step and role to
docs/emergence/norms/NAME.csv and prints the page's steps (220 to 2414, then 4394 and 8000) as its
Markdown table. With
OUT already written, pass `--counts-only` to recount it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
READINGS = ("weights", "norms")
# The page's columns: every step from the first role's onset (before it, no head holds any role)
# to the positional heads' arrival, then only the later log-spaced checkpoints (the CSV has all).
FIRST_PAGE_STEP = 220
LAST_DENSE_PAGE_STEP = 2414
LATER_PAGE_STEPS = (4394, 8000)
ROLES = ("cls", "sep", "delimiter", "local", "prev", "next", "block", "syntactic")


def run_tracks(workdir: Path, out: Path) -> None:
    from analysis import track
    from bertjax import cli

    data = Path(os.environ.get("BERTJAX_DATA", HERE.parents[1] / "shared" / "data"))
    for reading in READINGS:
        cli.run(track.main, ["--run", str(workdir), "--task", "mrpc", "--glue-dir", str(data / "glue"), "--n", "200",
                             "--max-length", "64", "--tau", "3", "--attention", reading, "--figures", "none",
                             "--out", str(out / reading), "--overwrite"])  # fmt: skip


def counts(out: Path) -> pd.DataFrame:
    """Per step and role: heads holding it on each reading and on both (a head holds a role on a
    reading when its one-sided test rejects at that step: the `assigned` column of track.csv)."""
    keys = ["step", "task", "layer", "head", "role"]
    held = [
        pd.read_csv(out / reading / "track.csv", usecols=[*keys, "assigned"]).rename(columns={"assigned": reading})
        for reading in READINGS
    ]
    both = held[0].merge(held[1], on=keys, how="inner", validate="one_to_one")
    if len(both) != len(held[0]) or len(both) != len(held[1]):
        raise SystemExit(f"{out}: the two tracks did not score the same steps, heads and roles")
    both["both"] = both["weights"] & both["norms"]
    table = both.groupby(["step", "role"], sort=False)[["weights", "norms", "both"]].sum().reset_index()
    return table[table["role"].isin(ROLES)].sort_values(["step", "role"], key=_role_order).reset_index(drop=True)


def _role_order(column: pd.Series) -> pd.Series:
    return column.map(ROLES.index) if column.name == "role" else column


def page_steps(table: pd.DataFrame) -> list[int]:
    steps = [int(s) for s in sorted(table["step"].unique())]
    return [s for s in steps if FIRST_PAGE_STEP <= s <= LAST_DENSE_PAGE_STEP or s in LATER_PAGE_STEPS]


def markdown(table: pd.DataFrame, steps: list[int]) -> str:
    """One row per role, one column per step, each cell `weights / norms / both`."""
    lines = ["| role | " + " | ".join(f"step {s}" for s in steps) + " |", "| --- |" + " --- |" * len(steps)]
    cells = {(r.step, r.role): f"{r.weights} / {r.norms} / {r.both}" for r in table.itertuples(index=False)}
    for role in ROLES:
        lines.append(f"| {role} | " + " | ".join(cells.get((s, role), "—") for s in steps) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--counts-only"]
    if len(args) < 2:
        raise SystemExit(__doc__)
    workdir, name = Path(args[0]), args[1]
    out = Path(args[2] if len(args) > 2 else f"runs/norms-{name}")
    if "--counts-only" not in sys.argv:
        run_tracks(workdir, out)
    table = counts(out)
    target = HERE / "emergence" / "norms" / f"{name}.csv"
    target.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(target, index=False)
    print(markdown(table, page_steps(table)))
