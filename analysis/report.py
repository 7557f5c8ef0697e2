"""`python -m analysis.report RUN_DIR`: one self-contained `report.html` for an analysis output.

RUN_DIR is what `analysis.roles`, `analysis.track` or `analysis.finetune_effect` wrote. The page
shows the role grid of each task (layers × heads), a card per head with its statistics as the run's
table has them, and the head's attention on a few example sequences of the run, with a role's sieve
highlighted. A track report adds a step slider; a fine-tuning effect report shows pre and post side
by side. Scripts, styles and data are inlined: the file opens with no network.

The example attention is computed here, from the run's checkpoint and the settings in its run.json,
for the few sequences shown only. When the checkpoint is gone the report is written without it and
says so.
"""

from __future__ import annotations

from analysis.tools import Command
from bertjax import cli

_command = Command("report", __doc__)
build_parser, parse_args, run = _command.build_parser, _command.parse_args, _command.run


def main(argv: list[str] | None = None) -> object:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
