"""Benchmark 7b: what the onset intervals add to a first `analysis.track` run, end to end.

`python -m analysis.track --run RUN --task mrpc,sst2 --n 200` on 16 checkpoints of the tiny
preset at random weights (the shapes and files of a trained tiny run; timing does not depend on the
weights), each side a fresh process on a new scores cache: `--bootstrap 0` (no intervals) against
`--bootstrap 1000` (the default), in alternating pairs so that a noisy stretch of the machine hits
both. One untimed run first fills the parse cache. The intervals' own seconds come from run.json
(`timings_s.intervals`: the replicates' tests at every step, the interval table and the curves'
refits).

    python -m benchmarks.onset_intervals --glue-dir ../shared/data/glue --vocab VOCAB
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from benchmarks import common
from benchmarks.track_cache import random_run, track
from bertjax import cli

STEPS = (1, 2, 4, 7, 12, 20, 35, 60, 100, 170, 290, 500, 850, 1450, 2450, 4200)


def run(args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-intervals-") as scratch:
        scratch = Path(scratch)
        workdir = random_run(scratch / "run", Path(args.vocab), STEPS)
        flags = ["--run", str(workdir), "--task", args.task, "--glue-dir", args.glue_dir, "--n", str(args.n),
                 "--cache-dir", str(scratch / "parses")]  # fmt: skip
        log = scratch / "track.log"
        common.log("untimed first run: parses into the cache, compiles")
        track(
            [*flags, "--bootstrap", "0", "--out", str(scratch / "warm"), "--scores-cache", str(scratch / "w.cache")],
            log,
        )
        times = {0: [], 1000: []}
        seconds = []
        for i in range(args.repeat):
            for replicates in (0, 1000):
                out = scratch / f"out{i}-{replicates}"
                cache = scratch / f"cache{i}-{replicates}"
                argv = [*flags, "--bootstrap", str(replicates), "--out", str(out), "--scores-cache", str(cache)]
                times[replicates].append(track(argv, log))
                if replicates:
                    seconds.append(json.loads((out / "run.json").read_text())["timings_s"]["intervals"])
            common.log(f"pair {i}: without {times[0][-1]:.1f} s, with intervals {times[1000][-1]:.1f} s")
    settings = {"steps": list(STEPS), "task": args.task, "n": args.n}
    without, with_ = common.summary(times[0]), common.summary(times[1000])
    return [
        common.emit("onset_intervals", side="bootstrap_0", **settings, **without, times_s=times[0]),
        common.emit(
            "onset_intervals", side="bootstrap_1000", **settings, **with_, times_s=times[1000], intervals_s=seconds
        ),
        common.emit(
            "onset_intervals", side="ratio", **settings, added=with_["median_s"] / without["median_s"] - 1, target=0.10
        ),
    ]


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=3)
    p.add_argument("--vocab", required=True, help="vocab.txt (bert-base-uncased's, as configs/pretrain/tiny.yaml)")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--task", default="mrpc,sst2")
    p.add_argument("--n", type=int, default=200)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
