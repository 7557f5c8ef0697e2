"""`python -m benchmarks.host_stages`: the host stages of `analysis.roles` (loading, preparing,
tests and tables, figures: every stage of run.json's `timings_s` but the scoring), this tree
against a baseline tree, side by side.

Each run is the CLI itself, `python -m analysis.roles`, in a fresh process started in its tree, on
the same tasks with one cache directory (the parses, and the encoded tasks of a tree that keeps
them), filled by an untimed run of each tree first, which also compiles. The timed runs alternate (this, baseline, this, …) so that a noisy stretch of a shared
machine hits both; each stage's median per tree is reported, and the host stages' sum. The two
trees' outputs are compared byte for byte (run.json aside: it holds timings and paths), so a
speed-up that changed a number shows as `identical: false`, the files it changed in `differing`.

    git archive COMMIT | tar -x -C /tmp/baseline
    python -m benchmarks.host_stages --baseline /tmp/baseline --glue-dir ../shared/data/glue --repeat 3
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common
from bertjax import cli

ROOT = Path(__file__).resolve().parents[1]


def host_stage(name: str) -> bool:
    """run.json's stages but the scoring (`TASK/score`) and the whole (`total`)."""
    return not name.endswith("/score") and name != "total"


def analyse(tree: Path, args, out: Path) -> dict[str, float]:
    """One `analysis.roles` run in `tree`, writing into `out`; its run.json's stage seconds."""
    command = [sys.executable, "-m", "analysis.roles", "--ckpt", args.ckpt, "--task", args.task, "--glue-dir",
               args.glue_dir, "--split", args.split, "--n", str(args.n), "--cache-dir", args.cache_dir, "--out",
               str(out), "--overwrite"]  # fmt: skip
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"analysis.roles in {tree}: exit status {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads((out / "run.json").read_text())["timings_s"]


def differing_outputs(a: Path, b: Path) -> list[str]:
    """The files of either run but run.json that the other lacks or holds other bytes in (a tree
    whose output marker names the tool, since eca5cf7, differs from d301105's in that file alone)."""
    files = lambda d: {p.relative_to(d) for p in d.rglob("*") if p.is_file() and p.name != "run.json"}
    return sorted(
        str(f)
        for f in files(a) | files(b)
        if not ((a / f).is_file() and (b / f).is_file() and (a / f).read_bytes() == (b / f).read_bytes())
    )


def run(args) -> list[dict]:
    trees = {"this": ROOT, "baseline": Path(args.baseline).resolve()}
    with tempfile.TemporaryDirectory(prefix="bench-host-") as scratch:
        scratch = Path(scratch)
        args.cache_dir = args.cache_dir or str(scratch / "parses")
        for side, tree in trees.items():
            common.log(f"untimed run in {tree}: parses into the cache, compiles")
            analyse(tree, args, scratch / side)
        timings: dict[str, list[dict[str, float]]] = {side: [] for side in trees}
        for i in range(args.repeat):
            for side, tree in trees.items():
                common.log(f"run {i + 1}/{args.repeat} in {side}")
                timings[side].append(analyse(tree, args, scratch / side))
        # The last runs': read back from the caches the untimed runs filled, as a re-run reads them.
        differing = differing_outputs(scratch / "this", scratch / "baseline")
    settings = {"model": args.ckpt, "task": args.task, "split": args.split, "n": args.n,
                "identical": not differing, "differing": differing}  # fmt: skip
    records, host = [], {}
    for side, runs in timings.items():
        stages = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
        host_runs = [sum(v for k, v in run.items() if host_stage(k)) for run in runs]
        host[side] = statistics.median(host_runs)
        records.append(
            common.emit(
                "host_stages", tree=side, path=str(trees[side]), **settings, stages_s=stages,
                host_s=host[side], host_times_s=[round(t, 3) for t in host_runs], runs=len(runs),
            )
        )  # fmt: skip
    records.append(
        common.emit("host_stages", side="ratio", **settings, host_ratio=host["this"] / host["baseline"], target=0.5)
    )
    return records


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=3)
    common.add_tree_task_arguments(p)
    return common.resolve_tree_task_arguments(p.parse_args(argv))


def main(argv: list[str] | None = None) -> list[dict]:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
