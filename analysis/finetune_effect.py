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
from analysis.heads.config import EFFECT_SKIP, EFFECT_TOOL, RolesConfig, add_roles_flags
from bertjax import cli, settings

if TYPE_CHECKING:
    from analysis.heads.finetuning import EffectConfig


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.finetune_effect", __doc__)
    p.add_argument("--pre", required=True, help="the pre-trained checkpoint (HF directory, run workdir or step folder)")
    p.add_argument("--post", required=True, action="append",
                   help="a fine-tuned checkpoint, optionally :TASK (default: the --task tasks); repeatable")  # fmt: skip
    add_roles_flags(p, EFFECT_TOOL, EFFECT_SKIP)
    return p


def _parse(argv: list[str] | None) -> tuple[list[str], RolesConfig]:
    """The --post checkpoints and the roles settings, parsed without JAX."""
    p = build_parser()
    a = p.parse_args(argv)
    data = settings.from_flags(RolesConfig, p, a, argv, skip=EFFECT_SKIP, ckpt=a.pre)
    settings.print_config_if_asked(a, data, skip=EFFECT_SKIP)
    return a.post, data


def _config(post: list[str], data: RolesConfig) -> EffectConfig:
    from analysis.heads.finetuning import effect_config  # JAX takes seconds to load

    return effect_config(post, data)


def parse_args(argv: list[str] | None) -> EffectConfig:
    return _config(*_parse(argv))


def run(config: EffectConfig) -> None:
    from analysis.api.heads import run_finetune_effect  # after parsing: --help and flag errors need no JAX
    from analysis.heads.pipeline import write_html

    result = run_finetune_effect(config)  # computed and written
    if result is not None:  # None: a process other than the first, which writes nothing
        print(result.run.text())
        if config.data.html:
            print(write_html(config.data.out))
        cli.print_wrote(config.data.out)


def main(argv: list[str] | None = None) -> None:
    post, data = _parse(argv)
    refuse_early(data)  # before JAX loads
    run(_config(post, data))


if __name__ == "__main__":
    cli.run(main)
