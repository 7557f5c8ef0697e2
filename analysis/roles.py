"""`python -m analysis.roles`: which attention heads hold which roles (Pande et al. 2021).

Data flow: GLUE (or CoNLL-U) examples → parses (cached) → encoded sequences → per batch: sieve masks
and one jitted function doing the model forward *and* the sieve-bias kernel, so attention never
leaves the device and memory does not grow with N → per-sequence scores → one-sided tests →
`roles.csv`, `scores.npz`, figures, `run.json`.

Outputs are written into a temporary sibling of `--out` and renamed at the end, so a failed run
leaves nothing half-written.
"""

from __future__ import annotations

from analysis.tools import Command
from bertjax import cli

_command = Command("roles", __doc__)
build_parser, parse_args, run = _command.build_parser, _command.parse_args, _command.run


def main(argv: list[str] | None = None) -> object:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
