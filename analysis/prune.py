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

from analysis.ablation.options import MichelConfig
from analysis.common.flags import refuse_early
from bertjax import cli, settings


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.prune", __doc__)
    settings.add_flags(p, MichelConfig)
    settings.add_config_flags(p)
    return p


def parse_args(argv: list[str] | None) -> MichelConfig:
    p = build_parser()
    a = p.parse_args(argv)
    config = settings.from_flags(MichelConfig, p, a, argv)
    settings.print_config_if_asked(a, config)
    return config


def run(config: MichelConfig) -> None:
    refuse_early(config)
    from analysis.api.ablation import run_prune  # after parsing: --help and flag errors need no JAX

    result = run_prune(config)  # computed and written
    print(result.run.text())
    cli.print_wrote(config.out)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
