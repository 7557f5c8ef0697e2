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
from typing import TYPE_CHECKING

from analysis.heads.config import REPORT
from bertjax import cli

if TYPE_CHECKING:
    from analysis.heads.report import ReportConfig


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.report", __doc__)
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="an output directory of analysis.roles, analysis.track or analysis.finetune_effect",
    )
    p.add_argument(
        "--examples", type=int, default=4, help="example sequences whose attention is shown per task (0: none)"
    )
    p.add_argument("--out", help=f"the HTML file to write (default RUN_DIR/{REPORT}); a new file, or a report")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier report at --out")
    p.add_argument(
        "--coref",
        metavar="DIR",
        help="an analysis.clark output with coref_heads.csv: the head cards show its GAP coreference accuracy "
        "(default: RUN_DIR's own coref_heads.csv, if any)",
    )
    return p


def parse_args(argv: list[str] | None) -> ReportConfig:
    a = build_parser().parse_args(argv)
    from analysis.heads.report import ReportConfig  # after parsing: --help and flag errors need no JAX

    return ReportConfig(a.run_dir, a.examples, a.out, a.overwrite, a.coref)


def run(config: ReportConfig) -> None:
    from analysis.api.heads import run_report  # after parsing: --help and flag errors need no JAX
    from analysis.heads.report import wrote_line

    print(wrote_line(run_report(config).path))


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
