"""The one writer of the runs held as tables and drawing jobs (clark, ablate, prune, finetune_effect)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pandas as pd

from analysis.common.figures import figure_formats
from analysis.common.flags import select_formats
from bertjax import runinfo


def write_tables_run(
    run, directory: Path, indexed: tuple[str, ...] = (), figure_format: tuple[str, ...] | None = None
) -> dict:
    """Writes `run`'s tables (`<name>.csv`; the `indexed` ones with their index), every figure of
    its drawing jobs (`run.draw(job, directory)`, in `figure_format`, by default the one its config
    asks for) and run.json into `directory`; returns the run.json written. run.json's timings add
    the figures' and the total, from `run.started` to the end of the figures."""
    write_tables(run.tables, directory, indexed)
    clock = time.perf_counter()
    figures = []
    with figure_formats(select_formats(run.config.figure_format if figure_format is None else figure_format)):
        for job in run.figures:
            figures += run.draw(job, directory)
    timings = run.timings | {"figures": time.perf_counter() - clock, "total": time.perf_counter() - run.started}
    info = run.info | {
        "config": dataclasses.asdict(run.config),  # its place kept: the run's, or a saved copy's `out`
        "figures": sorted(p.name for p in figures),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    runinfo.write_run_json(directory, info)
    return info


def write_tables(tables: dict[str, pd.DataFrame], directory: Path, indexed: tuple[str, ...] = ()) -> None:
    """Each table as `<name>.csv` in `directory`; the `indexed` ones with their index."""
    for name, table in tables.items():
        table.to_csv(directory / f"{name}.csv", index=name in indexed)
