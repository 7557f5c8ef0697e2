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

import argparse

from analysis.heads.config import ReportConfig
from bertjax import cli, settings


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.report", __doc__)
    settings.add_flags(p, ReportConfig)
    settings.add_config_flags(p)
    return p


def parse_args(argv: list[str] | None) -> ReportConfig:
    p = build_parser()
    a = p.parse_args(argv)
    config = settings.from_flags(ReportConfig, p, a, argv)
    settings.print_config_if_asked(a, config)
    return config


def run(config: ReportConfig) -> None:
    from analysis.api.heads import run_report  # after parsing: --help and flag errors need no JAX
    from analysis.heads.report import wrote_line

    print(wrote_line(run_report(config).path))


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
