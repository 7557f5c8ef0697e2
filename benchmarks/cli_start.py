"""Benchmark 10: how long `python -m CLI --help` takes, for every command a user runs.

Each run is a fresh `python -m MODULE --help` process, timed from its start to its exit (the
interpreter's start included: it is what a user waits for), with its CPU time (user + system, from
the kernel's accounting of the child) beside the wall time: on a shared machine the wall time
measures the load as much as the command, the CPU time does not. With `--baseline DIR` (another
checkout, e.g. `git worktree add DIR COMMIT`) the same commands of that tree run alternately with
this tree's (this, baseline, this, …), so that a noisy stretch hits both.

    python -m benchmarks.cli_start --repeat 5 [--baseline DIR]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common
from bertjax import cli

ROOT = Path(__file__).resolve().parents[1]

# The commands of the README and docs/cli.md.
COMMANDS = (
    "bertjax", "analysis.roles", "analysis.track", "analysis.finetune_effect", "analysis.report", "analysis.clark",
    "analysis.ablate", "analysis.prune", "analysis.report_screenshot", "train.prepare", "train.pretrain",
    "train.finetune",
)  # fmt: skip

TARGET_S = 1.0


class Failed(Exception):
    pass


def help_once(module: str, tree: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `python -m module --help` run in `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    clock = time.perf_counter()
    command = [sys.executable, "-m", module, "--help"]
    done = subprocess.run(command, check=False, cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - clock
    if done.returncode != 0:
        raise Failed(f"{module} in {tree}: exit status {done.returncode}: {done.stderr.strip()[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(args) -> list[dict]:
    trees = {"this": ROOT} | ({"baseline": Path(args.baseline).resolve()} if args.baseline else {})
    records = []
    for module in args.commands.split(","):
        walls: dict[str, list[float]] = {side: [] for side in trees}
        cpus: dict[str, list[float]] = {side: [] for side in trees}
        try:
            for tree in trees.values():
                help_once(module, tree)  # untimed: compiles the tree's bytecode, fills the page cache
        except Failed as e:  # a baseline tree may lack a command, or a library its --help imports
            common.log(f"skipped: {e}")
            continue
        for _ in range(args.repeat):
            for side, tree in trees.items():
                wall, cpu = help_once(module, tree)
                walls[side].append(wall)
                cpus[side].append(cpu)
        for side in trees:
            stats = common.summary(walls[side])
            cpu = common.summary(cpus[side])
            records.append(
                common.emit(
                    "cli_start",
                    command=f"python -m {module} --help",
                    tree=side,
                    **stats,
                    times_s=walls[side],
                    cpu_median_s=cpu["median_s"],
                    cpu_s=cpus[side],
                    target_s=TARGET_S,
                )
            )
            common.log(f"{module} ({side}): wall {stats['median_s']:.2f} s, CPU {cpu['median_s']:.2f} s")
    return records


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=5)
    p.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated modules to time")
    p.add_argument("--baseline", help="another checkout whose commands run alternately with this tree's")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
