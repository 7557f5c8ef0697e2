"""`python -m benchmarks.model_load`: the model load of a fresh process, `from_pretrained` and
`load_tokenizer` as `analysis.roles` calls them (its run.json's `load_model` stage, less the
scorer's set-up), this tree against a baseline tree, side by side.

Each run is a fresh interpreter started in its tree (`PYTHONPATH` set to it) that imports
`bertjax.pretrained`, then times the two loads; `process_s` is the whole process's wall time, its
imports included. The trees alternate (this, baseline, this, …) after one untimed run each (the
page cache); the medians are reported. The default checkpoint is a random BERT of `--preset`
(weights do not change the time) with the uncased vocabulary saved as transformers saves a
tokenizer (`tokenizer.json`).

    git archive COMMIT | tar -x -C /tmp/baseline
    python -m benchmarks.model_load --baseline /tmp/baseline --vocab ../shared/data/vocab/bert-base-uncased-vocab.txt
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from bertjax import cli

ROOT = Path(__file__).resolve().parents[1]

# Run in the tree measured: a baseline's load_tokenizer may predate `light`.
PROBE = """
import inspect, json, sys, time
from bertjax.pretrained import from_pretrained, load_tokenizer
light = {"light": True} if "light" in inspect.signature(load_tokenizer).parameters else {}
clock = time.perf_counter(); from_pretrained(sys.argv[1]); model = time.perf_counter() - clock
clock = time.perf_counter(); tokenizer = load_tokenizer(sys.argv[1], **light); words = time.perf_counter() - clock
print(json.dumps({"model_s": model, "tokenizer_s": words, "tokenizer": type(tokenizer).__name__}))
"""


def load_once(tree: Path, ckpt: str) -> dict:
    env = os.environ | {"PYTHONPATH": str(tree)}
    clock = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, ckpt], cwd=tree, env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip
    wall = time.perf_counter() - clock
    if done.returncode != 0:
        raise SystemExit(f"the load in {tree}: exit status {done.returncode}: {done.stderr.strip()[-2000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return record | {"load_s": record["model_s"] + record["tokenizer_s"], "process_s": wall}


def checkpoint(preset: str, vocab: Path, directory: Path) -> str:
    """A random `preset` BERT whose tokenizer is `vocab` saved by transformers (with tokenizer.json)."""
    from transformers import BertTokenizer  # the fast tokenizer in transformers 5

    ckpt = common.random_checkpoint(preset, vocab, directory)
    BertTokenizer(vocab=str(vocab), do_lower_case=True).save_pretrained(directory)
    return ckpt


def run(args) -> list[dict]:
    trees = {"this": ROOT, "baseline": Path(args.baseline).resolve()}
    with tempfile.TemporaryDirectory(prefix="bench-load-") as scratch:
        ckpt = args.ckpt or checkpoint(args.preset, Path(args.vocab), Path(scratch))
        for tree in trees.values():
            load_once(tree, ckpt)
        runs: dict[str, list[dict]] = {side: [] for side in trees}
        for i in range(args.repeat):
            for side, tree in trees.items():
                common.log(f"run {i + 1}/{args.repeat} in {side}")
                runs[side].append(load_once(tree, ckpt))
    records = []
    median = {}
    for side, done in runs.items():
        fields = {k: statistics.median(r[k] for r in done) for k in ("model_s", "tokenizer_s", "load_s", "process_s")}
        median[side] = fields["load_s"]
        records.append(
            common.emit(
                "model_load", tree=side, path=str(trees[side]), model=args.ckpt or f"random {args.preset}",
                tokenizer=done[0]["tokenizer"], **fields, load_times_s=[round(r["load_s"], 3) for r in done],
                runs=len(done), load_average=os.getloadavg(),
            )
        )  # fmt: skip
    records.append(common.emit("model_load", side="ratio", load_ratio=median["this"] / median["baseline"]))
    return records


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=3)
    p.add_argument("--baseline", required=True, help="another tree to compare with (e.g. `git archive` of a commit)")
    p.add_argument("--ckpt", help="checkpoint to load (default: a random --preset BERT with --vocab)")
    p.add_argument("--preset", default="base")
    p.add_argument("--vocab", help="vocab.txt of the random checkpoint")
    a = p.parse_args(argv)
    if a.ckpt is None and a.vocab is None:
        p.error("give --ckpt, or --vocab for a random checkpoint")
    if a.ckpt and Path(a.ckpt).exists():
        a.ckpt = str(Path(a.ckpt).resolve())
    return a


def main(argv: list[str] | None = None) -> list[dict]:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
