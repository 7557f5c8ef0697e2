"""`python -m analysis.clark`: the analyses of Clark et al. 2019, "What Does BERT Look At?".

Sub-analyses (`--analyses`, default all): `surface` (attention to [CLS]/[SEP]/punctuation/
neighbours and entropies per head, on two-paragraph WikiText segments or a GLUE task), `cluster`
(Jensen–Shannon distances between heads and their 2-D MDS map), `gradients` (∂MLM-loss/∂attention;
needs a checkpoint with a trained MLM head), `depheads` (dependency heads on UD English-EWT, chosen
on dev, reported on test) and `probes` (attention-only, attention + embedding and distance +
embedding dependency probes, trained on EWT train, UAS on EWT test) and `coref` (coreference
heads on GAP, chosen on development, reported on test). Definitions are in the docstrings of
`analysis.attention.surface`, `.gradients`, `.depheads`, `.probes` and `.coref`, and of
`sieves.wordattn` (word-level attention) and `sieves.depattn` (the dependency-head counts). Everything streams batch by batch; no analysis holds the attention of a whole
dataset.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from analysis.attention.options import ANALYSES, ClarkConfig
from analysis.common.flags import refuse_early
from bertjax import cli, settings

if TYPE_CHECKING:
    from analysis.api.attention import ClarkResult


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.clark", __doc__)
    settings.add_flags(p, ClarkConfig)
    settings.add_config_flags(p)
    return p


def parse_args(argv: list[str] | None) -> ClarkConfig:
    p = build_parser()
    a = p.parse_args(argv)
    config = settings.from_flags(ClarkConfig, p, a, argv)
    # Only named analyses make a missing MLM head or GAP an error; all of them (the default) skip it.
    config = dataclasses.replace(config, analyses_explicit=config.analyses != ANALYSES)
    settings.print_config_if_asked(a, config)
    return config


def run(config: ClarkConfig) -> ClarkResult:
    refuse_early(config)
    from analysis.api.attention import run_clark  # after parsing: --help and flag errors need no JAX

    result = run_clark(config)  # computed and written
    if result.run.lines:
        print(result.run.text())
    cli.print_wrote(config.out)
    return result


def main(argv: list[str] | None = None) -> ClarkResult:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
