"""Benchmark 7: a cached re-run of `analysis.track` against its first run, end to end.

The README's tracking demonstration: `python -m analysis.track --run RUN --task mrpc,sst2 --n 200`
on the tiny run's 7 checkpoints (steps 1, 3, 10, 31, 96, 200, 300), parses cached. Each side is
a fresh `python -m analysis.track` process, timed from its start to its exit (interpreter start and
imports included: they are part of what a user waits for). The first run scores every checkpoint
into an empty scores cache; the re-run, on the same cache, takes every step from it. One untimed
run first fills the parse cache and XLA's compilation cache. The pairs alternate (first, re-run,
first, …), each first run on a new cache, so a noisy stretch of the machine hits both sides.

Without `--run`, the checkpoints are the tiny preset at random weights (timing does not depend on
the weights): the same shapes, checkpoint files and tokenizer as a trained tiny run.

    python -m benchmarks.track_cache --glue-dir ../shared/data/glue --vocab VOCAB [--run RUN]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from bertjax import cli

STEPS = (1, 3, 10, 31, 96, 200, 300)


def random_run(workdir: Path, vocab: Path, steps: tuple[int, ...] = STEPS, preset: str = "tiny", **sizes: int) -> Path:
    """A training workdir with `preset` (tiny), resized by `sizes` (config fields), at random
    weights saved at `steps`, as the trainer saves them (params + meta), and the vocabulary's
    tokenizer."""
    import orbax.checkpoint as ocp
    from flax import nnx
    from transformers import BertTokenizerFast

    import bertjax
    from bertjax import checkpoint as ckpt

    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(workdir / "tokenizer")
    manager = ocp.CheckpointManager(workdir / ckpt.CHECKPOINTS, item_names=(ckpt.PARAMS, ckpt.META))
    for seed, step in enumerate(steps):
        model = bertjax.init_model(
            bertjax.preset(preset, **{"max_position_embeddings": 128, **sizes}), bertjax.BertForPreTraining, seed=seed
        )
        params = ckpt.flatten_params(nnx.state(model, nnx.Param))
        manager.save(step, args=ocp.args.Composite(**ckpt.save_args(params, ckpt.make_meta(model, "tokenizer", {}))))
    manager.wait_until_finished()
    manager.close()
    return workdir


def track(argv: list[str], log: Path) -> float:
    """Wall seconds of one `python -m analysis.track` process; its output goes to `log`."""
    clock = time.perf_counter()
    with log.open("a") as f:
        subprocess.run([sys.executable, "-m", "analysis.track", *argv], stdout=f, stderr=f, check=True)
    return time.perf_counter() - clock


def run(args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-track-") as scratch:
        scratch = Path(scratch)
        workdir = Path(args.run) if args.run else random_run(scratch / "run", Path(args.vocab))
        flags = ["--run", str(workdir), "--task", args.task, "--glue-dir", args.glue_dir, "--n", str(args.n),
                 "--cache-dir", args.cache_dir or str(scratch / "parses"), *args.extra]  # fmt: skip
        log = scratch / "track.log"
        common.log("untimed first run: parses into the cache, compiles")
        track([*flags, "--out", str(scratch / "warm"), "--scores-cache", str(scratch / "warm.cache")], log)
        first, again, stages = [], [], {}
        for i in range(args.repeat):
            out, cache = scratch / f"out{i}", scratch / f"cache{i}"
            argv = [*flags, "--out", str(out), "--scores-cache", str(cache)]
            first.append(track(argv, log))
            stages["first"] = json.loads((out / "run.json").read_text())["timings_s"]
            again.append(track(argv, log))
            run_json = json.loads((out / "run.json").read_text())
            assert run_json["analysed_steps"] == [], "the re-run scored a step: the cache missed"
            stages["cached"] = run_json["timings_s"]
            common.log(f"pair {i}: first {first[-1]:.1f} s, cached re-run {again[-1]:.1f} s")
        steps = run_json["steps"]
    settings = {"run": args.run or "tiny preset, random weights", "steps": steps, "task": args.task, "n": args.n,
                "extra": args.extra}  # fmt: skip
    first_stats, again_stats = common.summary(first), common.summary(again)
    return [
        common.emit(
            "track_cache", side="first_run", **settings, **first_stats, times_s=first, stages_s=stages["first"]
        ),
        common.emit(
            "track_cache", side="cached_rerun", **settings, **again_stats, times_s=again, stages_s=stages["cached"]
        ),
        common.emit(
            "track_cache",
            side="ratio",
            **settings,
            speedup=first_stats["median_s"] / again_stats["median_s"],
            target=3.0,
        ),
    ]


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=3)
    p.add_argument("--run", help="a training run's workdir (default: the tiny preset at random weights at STEPS)")
    p.add_argument("--vocab", help="vocab.txt for the random run (bert-base-uncased's, as configs/pretrain/tiny.yaml)")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--task", default="mrpc,sst2")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--cache-dir", help="parse cache (default: a fresh one, filled by the untimed run)")
    p.add_argument("extra", nargs="*", help="more analysis.track flags, after --, e.g. -- --figures none")
    a = p.parse_args(argv)
    if not a.run and not a.vocab:
        p.error("without --run, --vocab is needed")
    return a


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
