"""Benchmark 10: `analysis.track` over a series of checkpoints against the same series' forward passes alone.

The series: `--checkpoints` directories, each holding the checkpoint's files as links (not
copies) under its own name, so each is a distinct member to the scores cache and is loaded from
its own path: a stand-in for a public series at that model's size (MiniLM by default). One
invocation times, on the same encoded MRPC dev pairs:

- **track**: `analysis.track --ckpt DIR/ckpt{step} --steps 0,…,N-1` into an empty scores cache,
  without figures (the series' figures cost the same whatever the number of checkpoints), split
  into loading the checkpoints (`from_pretrained`), scoring (the jitted forward + sieve kernel,
  `score_sequences`), each step's tests (`test_roles`), writing the scores cache, the series'
  tables (track.csv, onsets) and the rest (reading and encoding the data, start);
- **forward alone**: each checkpoint's jitted forward pass (with attention probabilities, as the
  analysis needs them) over the same length-sorted, bucket-padded batches, the checkpoint loaded
  before its clock starts.

An untimed `analysis.track` of one checkpoint first fills the parse cache and compiles; both sides
then alternate per repeat. Checkpoints a minute is the series' rate end to end.

    python -m benchmarks.series_throughput --glue-dir ../shared/data/glue --checkpoints 30 --n 100
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
from flax import nnx

from analysis import api
from analysis.common.examples import encode_tasks, load_tasks, make_parser
from analysis.common.forward import padded_batches
from analysis.heads import tracking
from analysis.heads.config import RolesConfig
from benchmarks import common
from bertjax import cli
from bertjax.pretrained import from_pretrained, load_tokenizer


def link_series(checkpoint: Path, directory: Path, count: int) -> str:
    """`count` directories `ckpt<i>` of links to `checkpoint`'s files; returns their `{step}` pattern."""
    for i in range(count):
        member = directory / f"ckpt{i}"
        member.mkdir(parents=True)
        for file in checkpoint.iterdir():
            if file.is_file():
                (member / file.name).symlink_to(file.resolve())
    return str(directory / "ckpt{step}")


class Stopwatch:
    """Accumulated seconds of calls to some functions of `analysis.heads.tracking`, by name."""

    def __init__(self, names: dict[str, str]):
        self.names, self.seconds, self.saved = names, dict.fromkeys(names.values(), 0.0), {}

    def __enter__(self):
        for attribute, stage in self.names.items():
            original = self.saved[attribute] = getattr(tracking, attribute)

            def timed(*args, _original=original, _stage=stage, **kwargs):
                clock = time.perf_counter()
                result = _original(*args, **kwargs)
                self.seconds[_stage] += time.perf_counter() - clock
                return result

            setattr(tracking, attribute, timed)
        return self

    def __exit__(self, *exc):
        for attribute, original in self.saved.items():
            setattr(tracking, attribute, original)


def run_track(pattern: str, count: int, args, out: Path, cache: Path) -> dict[str, float]:
    settings = dict(
        ckpt=pattern, steps=list(range(count)), task="mrpc", glue_dir=args.glue_dir, n=args.n,
        batch_size=args.batch_size, cache_dir=args.cache_dir, scores_cache=str(cache), out=str(out), overwrite=True,
        figures="none",
    )  # fmt: skip
    clock = time.perf_counter()
    with (
        Stopwatch(
            {
                "from_pretrained": "load",
                "score_sequences": "scoring",
                "test_roles": "tests",
                "save_scores": "cache_writes",
            }
        ) as watch,  # fmt: skip
        contextlib.redirect_stdout(sys.stderr),
    ):
        api.track(**settings)
    total = time.perf_counter() - clock
    timings = json.loads((out / "run.json").read_text())["timings_s"]
    # `timings["tests"]` is the series' tables (track.csv, onsets) after every step is tested.
    stages = {**watch.seconds, "tables": timings["tests"]}
    return {"total_s": total, **stages, "rest": total - sum(stages.values())}


def time_forward(pattern: str, count: int, args) -> float:
    """Seconds of every checkpoint's forward passes over the encoded MRPC pairs (loads untimed)."""
    config = RolesConfig(ckpt=pattern.format(step=0), task=("mrpc",), glue_dir=args.glue_dir, n=args.n,
                         batch_size=args.batch_size, cache_dir=args.cache_dir, out="-")  # fmt: skip
    tokenizer = load_tokenizer(config.ckpt)
    data = load_tasks(config, ["mrpc"])
    sequences = encode_tasks(config, data, tokenizer, make_parser(config), {})["mrpc"]
    first = from_pretrained(pattern.format(step=0))
    graphdef, _ = nnx.split(first)

    @jax.jit  # one function for every checkpoint: they share the architecture
    def forward(state, input_ids, attention_mask, token_type_ids):
        out = nnx.merge(graphdef, state)(input_ids, attention_mask, token_type_ids, output_attentions=True)
        return out.last_hidden_state, out.attentions

    batches = [arrays for _, arrays in padded_batches(sequences, args.batch_size, config.max_length, "forward")]
    seconds = 0.0
    for i in range(count):
        _, state = nnx.split(first if i == 0 else from_pretrained(pattern.format(step=i)))
        clock = time.perf_counter()
        last = [forward(state, a["input_ids"], a["attention_mask"], a["token_type_ids"]) for a in batches][-1]
        jax.block_until_ready(last)
        seconds += time.perf_counter() - clock
    return seconds


def run(args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-series-") as scratch:
        scratch = Path(scratch)
        pattern = link_series(Path(args.ckpt), scratch / "series", args.checkpoints)
        args.cache_dir = args.cache_dir or str(scratch / "parses")
        common.log("untimed first run of one checkpoint: parses into the cache, compiles")
        run_track(pattern, 1, args, scratch / "warm", scratch / "warm-cache")
        time_forward(pattern, 1, args)
        tracks, forwards = [], []
        for repeat in range(args.repeat):
            tracks.append(run_track(pattern, args.checkpoints, args, scratch / "out", scratch / f"cache{repeat}"))
            forwards.append(time_forward(pattern, args.checkpoints, args))
    best = sorted(range(args.repeat), key=lambda i: tracks[i]["total_s"])[args.repeat // 2]
    stages = tracks[best]
    forward = sorted(forwards)[args.repeat // 2]
    settings = {"model": args.ckpt, "checkpoints": args.checkpoints, "task": "mrpc", "n": args.n,
                "batch_size": args.batch_size, "figures": "none"}  # fmt: skip
    return [
        common.emit(
            "series_throughput",
            side="track",
            **settings,
            **{k: round(v, 3) for k, v in stages.items()},
            checkpoints_per_min=args.checkpoints / stages["total_s"] * 60,
            totals_s=[round(t["total_s"], 3) for t in tracks],
        ),
        common.emit(
            "series_throughput",
            side="forward_only",
            **settings,
            total_s=round(forward, 3),
            totals_s=[round(f, 3) for f in forwards],
        ),
        common.emit(
            "series_throughput",
            side="ratio",
            **settings,
            scoring_over_forward=stages["scoring"] / forward,
            track_over_forward=stages["total_s"] / forward,
        ),
    ]


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=1)
    p.add_argument("--ckpt", help="the checkpoint every member links to (default: all-MiniLM-L6-v2)")
    p.add_argument("--checkpoints", type=int, default=30, help="members of the series")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--n", type=int, default=100, help="MRPC dev pairs")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cache-dir", help="parse cache (default: a fresh one, filled by the untimed run)")
    a = p.parse_args(argv)
    a.ckpt = a.ckpt or common.minilm_checkpoint()
    return a


def main(argv: list[str] | None = None) -> None:
    cli.use_compilation_cache()
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
