"""`python -m analysis.roles`: which attention heads hold which roles (Pande et al. 2021).

Data flow: GLUE (or CoNLL-U) examples → parses (cached) → encoded sequences → per batch: sieve masks
and one jitted function doing the model forward *and* the sieve-bias kernel, so attention never
leaves the device and memory does not grow with N → per-sequence scores → one-sided tests →
`roles.csv`, `scores.npz`, figures, `run.json`.

Outputs are written into a temporary sibling of `--out` and renamed at the end, so a failed run
leaves nothing half-written.
"""

from __future__ import annotations

import argparse

from analysis.common.flags import add_attention_argument
from analysis.heads.config import (
    DEFAULT_ROLES_FIGURES,
    ROLES_FIGURES,
    RolesConfig,
    add_data_arguments,
    add_output_arguments,
    add_test_arguments,
    add_variant_arguments,
    config_from_args,
)
from bertjax import cli


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.roles", __doc__)
    p.add_argument("--ckpt", required=True, help="HF-format directory, bertjax run workdir, or hub id")
    p.add_argument("--step", type=int, help="checkpoint step of a bertjax run (default: latest)")
    add_data_arguments(p)
    add_test_arguments(p)
    add_variant_arguments(p)
    add_attention_argument(p)
    add_output_arguments(p, "roles_out", ROLES_FIGURES, DEFAULT_ROLES_FIGURES)
    return p


def parse_args(argv: list[str] | None) -> RolesConfig:
    a = build_parser().parse_args(argv)
    return config_from_args(a, ckpt=a.ckpt, step=a.step)


def run(config: RolesConfig) -> None:
    from analysis.api.heads import run_roles  # after parsing: --help and flag errors need no JAX
    from analysis.heads.pipeline import write_html

    result = run_roles(config)  # computed and written
    if result is not None:  # None: a process other than the first, which writes nothing
        print(result.run.text())
        if config.html:
            print(write_html(config.out))
        cli.print_wrote(config.out)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
