"""Benchmark 3: peak resident memory of `python -m analysis.roles` at two sizes of N.

Attention is streamed by batch and reduced on device to per-sequence scores, so memory should not
grow with N beyond those scores ([N, L, H] floats per role). Each size runs as its own process (the
exact CLI, figures included), after an untimed run that fills the parse cache; peak RSS is the
kernel's `ru_maxrss` of that process.

    python -m benchmarks.roles_memory --glue-dir ../shared/data/glue     # MiniLM, QNLI, N = 100 and 1000
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from bertjax import cli


def run_roles(args, n: int, out: Path, cache_dir: Path) -> dict:
    command = [
        sys.executable, "-m", "analysis.roles", "--ckpt", args.ckpt, "--task", args.task, "--glue-dir",
        args.glue_dir, "--n", str(n), "--out", str(out), "--overwrite", "--cache-dir", str(cache_dir),
    ]  # fmt: skip
    clock = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - clock
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"analysis.roles --n {n} failed (exit {os.waitstatus_to_exitcode(status)})")
    return {"n": n, "peak_rss_mib": usage.ru_maxrss / 1024, "wall_s": wall}


def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as scratch:
        scratch = Path(scratch)
        common.log(f"untimed run at N = {max(args.sizes)}: fills the parse cache")
        run_roles(args, max(args.sizes), scratch / "warmup", scratch / "cache")
        measured = [run_roles(args, n, scratch / f"n{n}", scratch / "cache") for n in args.sizes]
    settings = {"model": args.ckpt, "task": args.task}
    for m in measured:
        common.emit("roles_memory", **settings, **m)
    small, large = min(measured, key=lambda m: m["n"]), max(measured, key=lambda m: m["n"])
    return common.emit(
        "roles_memory",
        **settings,
        side="ratio",
        sizes=[small["n"], large["n"]],
        rss_ratio=large["peak_rss_mib"] / small["peak_rss_mib"],
        target=1.2,
    )


def main(argv: list[str] | None = None) -> None:
    p = common.arguments(__doc__.split("\n\n")[0], repeat=None)
    p.add_argument("--ckpt", help="checkpoint (default: all-MiniLM-L6-v2 from the test extra)")
    p.add_argument("--task", default="qnli", help="a task with at least max(--sizes) examples in its dev split")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--sizes", type=int, nargs=2, default=[100, 1000])
    a = p.parse_args(argv)
    if a.ckpt is None:
        a.ckpt = common.minilm_checkpoint()
    run(a)


if __name__ == "__main__":
    cli.run(main)
