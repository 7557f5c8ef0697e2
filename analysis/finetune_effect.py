"""`python -m analysis.finetune_effect --pre CKPT --post CKPT[:TASK] ...`: what fine-tuning does to the heads.

Two comparisons of a pre-trained checkpoint with each fine-tuned one, on the same sequences:

- Pande et al. 2021, Fig. 6: the change (post − pre) in mean sieve bias score per coarse role
  (local, syntactic, block, delimiter, and the delimiter split into [CLS] and [SEP]) in the
  initial, middle and final third of the layers;
- Kovaleva et al. 2019: per head, the cosine similarity between the pre and post attention maps,
  each flattened over the real × real tokens of an example, averaged over the examples.

Outputs (written into a temporary sibling of `--out` and renamed when complete): `beta_change.csv`,
`head_means.csv`, `attention_similarity.csv`, the figures `beta_change` and
`attention_similarity` (PNG and SVG), and `run.json`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from analysis.common.flags import refuse_early
from analysis.heads.config import EFFECT_SECTIONS, RolesConfig
from analysis.tools import Command
from bertjax import cli, settings

if TYPE_CHECKING:
    from analysis.heads.finetuning import EffectConfig


def _pair_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pre", required=True, help="the pre-trained checkpoint (HF directory, run workdir or step folder)")
    p.add_argument("--post", required=True, action="append",
                   help="a fine-tuned checkpoint, optionally :TASK (default: the --task tasks); repeatable")  # fmt: skip


def _settings(p: argparse.ArgumentParser, a: argparse.Namespace, argv: list[str] | None) -> RolesConfig:
    """The roles settings of the comparison, parsed without JAX."""
    data = settings.from_flags(RolesConfig, p, a, argv, sections=EFFECT_SECTIONS, ckpt=a.pre)
    settings.print_config_if_asked(a, data, sections=EFFECT_SECTIONS)
    return data


def _config(post: list[str], data: RolesConfig) -> EffectConfig:
    from analysis.heads.finetuning import effect_config  # JAX takes seconds to load

    return effect_config(post, data)


_command = Command("finetune_effect", __doc__, _pair_flags, lambda p, a, argv: _config(a.post, _settings(p, a, argv)))
build_parser, parse_args, run = _command.build_parser, _command.parse_args, _command.run


def main(argv: list[str] | None = None) -> object:
    p = build_parser()
    a = p.parse_args(argv)
    data = _settings(p, a, argv)
    refuse_early(data)  # before JAX loads, which making the config needs
    return run(_config(a.post, data))


if __name__ == "__main__":
    cli.run(main)
