"""`python -m analysis.prune`: Michel et al. 2019, "Are Sixteen Heads Really Better than One?".

Head importance I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1, where ξ [L, H] multiplies every head's attention
and L is the cross-entropy with the gold label, each layer's vector then scaled to unit L2 norm;
iterative pruning (mask the least important remaining heads in steps of a fixed fraction of all
heads, re-evaluating the metric on --split at each step, optionally re-estimating importance under
the current mask), against random pruning orders.

By default importance is estimated on dev (whatever --split is) and --n examples, so with the
default `--split dev` on the very examples the curve is measured on (in-sample, as HF's
run_bertology does); `--importance-split train --importance-n N` keeps them apart.

Outputs are written into a temporary sibling of `--out` and renamed at the end.
"""

from __future__ import annotations

from analysis.tools import Command
from bertjax import cli

_command = Command("prune", __doc__)
build_parser, parse_args, run = _command.build_parser, _command.parse_args, _command.run


def main(argv: list[str] | None = None) -> object:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
