"""`python -m benchmarks.scoring_host`: the host's share of the scoring stage of `analysis.roles`
(padding each batch and building its sieve masks, everything but the forward pass), this tree
against a baseline tree, side by side.

On a GPU the forward passes of BERT-base on the 4 tasks take 0.23 s, so the scoring stage is as fast
as the host can hand it batches. Each measurement is a fresh process started in its tree: it encodes
the tasks (untimed, parses from one cache), then times every batch of every task through that
tree's own `scored_batches` with a scorer that returns at once; a second, untimed pass hashes every
mask the scorer was handed, so the two trees' masks are compared byte for byte (`identical`). The
processes alternate (this, baseline, this, …) and each side's median is reported.

    git archive COMMIT | tar -x -C /tmp/baseline
    python -m benchmarks.scoring_host --baseline /tmp/baseline --glue-dir ../shared/data/glue --repeat 5
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

# Run in each tree, with only what both trees have: the settings as JSON in argv[1].
MEASURE = r"""
import hashlib, json, sys, time
import numpy as np
import bertjax
from analysis.common import examples, forward
from analysis.heads import config as roles_config, scoring
from sieves.builders import present_roles

a = json.loads(sys.argv[1])
config = roles_config.RolesConfig(ckpt=a["ckpt"], task=tuple(a["tasks"]), glue_dir=a["glue_dir"], n=a["n"],
                                  split=a["split"], cache_dir=a["cache_dir"])
tokenizer = bertjax.load_tokenizer(a["ckpt"])
data = examples.load_tasks(config, list(config.task))
encoded = examples.encode_tasks(config, data, tokenizer, examples.make_parser(config), {})
digest = hashlib.sha256()

def returning_at_once(*arrays):
    rows = arrays[3]
    return np.zeros(rows.shape[:2] + (1, 1), np.float32), rows.sum(axis=-1), np.zeros((1, rows.shape[1], 1), bool)

def hashing(*arrays):
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return returning_at_once(*arrays)

def every_batch(scorer):
    batches = 0
    for task, seqs in encoded.items():
        present, _ = present_roles((s.num_segments for s in seqs), config.roles)
        for _ in scoring.scored_batches(forward.DataParallel(lambda _, *x: scorer(*x), None, None, ()), seqs,
                                        present, config, task):
            batches += 1
    return batches

clock = time.perf_counter()
batches = every_batch(returning_at_once)
seconds = time.perf_counter() - clock
every_batch(hashing)
print(json.dumps({"seconds": seconds, "batches": batches, "sha256": digest.hexdigest()}))
"""


def measure(tree: Path, settings: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(settings)], cwd=tree, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"scoring_host in {tree}: exit status {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args) -> list[dict]:
    trees = {"this": ROOT, "baseline": Path(args.baseline).resolve()}
    tasks = ["qnli", "qqp", "mrpc", "sst2"] if args.task == "all" else args.task.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-scoring-host-") as scratch:
        settings = {"ckpt": args.ckpt, "tasks": tasks, "glue_dir": args.glue_dir, "n": args.n, "split": args.split,
                    "cache_dir": args.cache_dir or str(Path(scratch) / "parses")}  # fmt: skip
        runs: dict[str, list[dict]] = {side: [] for side in trees}
        for i in range(args.repeat):
            for side, tree in trees.items():
                common.log(f"run {i + 1}/{args.repeat} in {side}")
                runs[side].append(measure(tree, settings))
    hashes = {run["sha256"] for side in runs.values() for run in side}
    shared = {"model": args.ckpt, "task": args.task, "split": args.split, "n": args.n, "identical": len(hashes) == 1}
    records, median = [], {}
    for side, measured in runs.items():
        times = [run["seconds"] for run in measured]
        median[side] = statistics.median(times)
        records.append(
            common.emit(
                "scoring_host", tree=side, path=str(trees[side]), **shared, host_s=median[side],
                times_s=[round(t, 3) for t in times], batches=measured[0]["batches"],
            )
        )  # fmt: skip
    records.append(common.emit("scoring_host", side="ratio", **shared, host_ratio=median["this"] / median["baseline"]))
    return records


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=5)
    common.add_tree_task_arguments(p)
    return common.resolve_tree_task_arguments(p.parse_args(argv))


def main(argv: list[str] | None = None) -> list[dict]:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
