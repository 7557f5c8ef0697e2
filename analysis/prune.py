"""`python -m analysis.prune`: Michel et al. 2019, "Are Sixteen Heads Really Better than One?".

Head importance I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1, where ξ [L, H] multiplies every head's attention
and L is the cross-entropy with the gold label, each layer's vector then scaled to unit L2 norm;
iterative pruning (mask the least important remaining heads in steps of a fixed fraction of all
heads, re-evaluating the metric on --split at each step, optionally re-estimating importance under
the current mask), against random pruning orders.

By default importance is estimated on the very examples the curve is measured on (in-sample, as
HF's run_bertology does); `--importance-split train --importance-n N` keeps them apart.

Outputs are written into a temporary sibling of `--out` and renamed at the end.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from analysis.ablation.options import SPLITS
from analysis.common.flags import add_device_arguments, add_length_arguments, add_nonfinite_argument, add_out_arguments
from bertjax import cli, glue

if TYPE_CHECKING:
    from analysis.ablation.michel import MichelConfig


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.prune", __doc__)
    p.add_argument("--ckpt", required=True, help="fine-tuned classifier: bertjax run workdir, HF directory or hub id")
    p.add_argument("--step", type=int, help="checkpoint step of a bertjax run (default: latest)")
    p.add_argument(
        "--task", default="mrpc", choices=list(glue.TASKS), help="the GLUE task the classifier was fine-tuned on"
    )
    p.add_argument("--glue-dir", help="local GLUE directory (glue_data/<TASK>/<split>.tsv); default: the hub")
    p.add_argument("--split", default="dev", choices=SPLITS, help="split of the metric")
    p.add_argument("--n", type=int, help="first N examples of --split (default: all)")
    p.add_argument(
        "--importance-split", default="dev", choices=SPLITS, help="split of the examples importance is estimated on"
    )
    p.add_argument("--importance-n", type=int, help="first N examples of --importance-split (default: --n)")
    add_length_arguments(p)
    p.add_argument("--metric", help="metric of the pruning curve (default: the task's first, accuracy)")
    p.add_argument("--prune-step", type=float, default=0.1, help="fraction of all heads pruned per step (0.1; 0.05)")
    p.add_argument("--reestimate", action="store_true", help="re-estimate importance under the mask after each step")
    p.add_argument("--random-seeds", type=int, default=3, help="random pruning orders to average")
    add_out_arguments(p, "prune_out")
    p.add_argument("--figure-format", default="png", help="comma-separated subset of png,svg,pdf (default: png)")
    add_device_arguments(p, distributed=False)
    add_nonfinite_argument(p)
    return p


def parse_args(argv: list[str] | None) -> MichelConfig:
    a = build_parser().parse_args(argv)
    from analysis.ablation.michel import MichelConfig  # after parsing: --help and flag errors need no JAX

    return MichelConfig(
        ckpt=a.ckpt, task=a.task, step=a.step, glue_dir=a.glue_dir, split=a.split, n=a.n,
        importance_split=a.importance_split, importance_n=a.importance_n, max_length=a.max_length,
        batch_size=a.batch_size, metric=a.metric, prune_step=a.prune_step, reestimate=a.reestimate,
        random_seeds=a.random_seeds, out=a.out, overwrite=a.overwrite,
        figure_format=a.figure_format, devices=a.devices,
        allow_nonfinite=a.allow_nonfinite,
    )  # fmt: skip


def run(config: MichelConfig) -> None:
    from analysis.api.ablation import run_prune  # after parsing: --help and flag errors need no JAX

    result = run_prune(config)  # computed and written
    print(result.run.text())
    cli.print_wrote(config.out)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
