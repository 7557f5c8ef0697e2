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
import logging

from analysis.api import run_roles as run
from analysis.heads.config import (
    RolesConfig,
    add_data_arguments,
    add_output_arguments,
    add_test_arguments,
    add_variant_arguments,
    config_from_args,
)
from analysis.heads.figures import DEFAULT_ROLES_FIGURES, ROLES_FIGURES
from bertjax import cli

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None) -> RolesConfig:
    p = argparse.ArgumentParser(prog="python -m analysis.roles", description=__doc__.split("\n\n")[0])
    cli.add_verbose_argument(p)
    p.add_argument("--ckpt", required=True, help="HF-format directory, bertjax run workdir, or hub id")
    p.add_argument("--step", type=int, help="checkpoint step of a bertjax run (default: latest)")
    add_data_arguments(p)
    add_test_arguments(p)
    add_variant_arguments(p)
    add_output_arguments(p, "roles_out", ROLES_FIGURES, DEFAULT_ROLES_FIGURES)
    a = p.parse_args(argv)
    return config_from_args(a, ckpt=a.ckpt, step=a.step)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
