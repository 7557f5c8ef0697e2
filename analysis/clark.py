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

from analysis.tools import Command
from bertjax import cli

_command = Command("clark", __doc__)
build_parser, parse_args, run = _command.build_parser, _command.parse_args, _command.run


def main(argv: list[str] | None = None) -> object:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
