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

from analysis.common.flags import refuse_early
from analysis.heads.config import ROLES_TOOL, RolesConfig, add_roles_flags
from bertjax import cli, settings


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.roles", __doc__)
    add_roles_flags(p, ROLES_TOOL)
    return p


def parse_args(argv: list[str] | None) -> RolesConfig:
    p = build_parser()
    a = p.parse_args(argv)
    config = settings.from_flags(RolesConfig, p, a, argv)
    settings.print_config_if_asked(a, config)
    return config


def run(config: RolesConfig) -> None:
    refuse_early(config)
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
