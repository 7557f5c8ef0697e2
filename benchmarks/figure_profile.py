"""The figure stage of `analysis.roles`, profiled: per figure kind, seconds to build the figure,
run its layout engine and write each format; and the import of `analysis.heads.figures` (a worker's
start-up). Reads an `analysis.roles` output (`roles.csv`, `scores.npz`); draws in this process.

    python -m analysis.roles --ckpt "$MINILM" --glue-dir ../shared/data/glue --out roles_out
    python -m benchmarks.figure_profile roles_out --task qnli
"""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks import common
from bertjax import cli


def import_seconds() -> float:
    """Wall seconds of a fresh interpreter importing `analysis.heads.figures`, less one importing nothing."""

    def wall(code: str) -> float:
        clock = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - clock

    return wall("import analysis.heads.figures") - wall("pass")


def run(args) -> list[dict]:
    plots = importlib.import_module("analysis.heads.figures")
    common = importlib.import_module("analysis.common.figures")
    from sieves.builders import ROLES

    table = pd.read_csv(Path(args.roles_out) / "roles.csv")
    own = table[table["task"] == args.task]
    with np.load(Path(args.roles_out) / "scores.npz") as stored:
        scores = {tuple(k.split("/")): stored[k] for k in stored.files if not k.endswith("/index")}
    coarse = {name: role.coarse for name, role in ROLES.items()}
    spent: dict[str, float] = {}
    real_save = plots.save_figure

    def timed_save(fig, out_dir, stem):
        clock = time.perf_counter()
        engine = fig.get_layout_engine()
        if engine is not None:
            engine.execute(fig)
            fig.set_layout_engine("none")
        spent["layout"] = time.perf_counter() - clock
        for fmt in common.FIGURE_FORMATS:
            clock = time.perf_counter()
            fig.savefig(Path(out_dir) / f"{stem}.{fmt}", **({"dpi": common.PNG_DPI} if fmt == "png" else {}))
            spent[fmt] = time.perf_counter() - clock
        return []

    records = [common.emit("figure_profile", stage="import_analysis_plots", seconds=import_seconds())]
    with tempfile.TemporaryDirectory(prefix="bench-figures-") as scratch, contextlib.ExitStack() as stack:
        stack.callback(setattr, plots, "save_figure", real_save)
        plots.save_figure = timed_save
        jobs = plots.figure_jobs(own, scores, Path(scratch), args.tau, args.alpha, coarse)
        for drawing in ("first", "second"):  # the first pays matplotlib's font and text caches
            for kind, (fn, fn_args) in zip(plots.ROLES_FIGURES, jobs, strict=True):
                spent.clear()
                clock = time.perf_counter()
                fn(*fn_args)
                total = time.perf_counter() - clock
                records.append(
                    common.emit(
                        "figure_profile",
                        stage="figure",
                        task=args.task,
                        kind=kind,
                        drawing=drawing,
                        build_s=total - sum(spent.values()),
                        **{f"{k}_s": v for k, v in spent.items()},
                    )
                )
    return records


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=None)
    p.add_argument("roles_out", help="an analysis.roles output directory")
    p.add_argument("--task", default="qnli")
    p.add_argument("--tau", type=float, default=3.0)
    p.add_argument("--alpha", type=float, default=0.05)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
