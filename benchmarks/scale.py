"""Benchmark 8: sequences per second of the roles scoring against the number of devices.

The scoring stage of `analysis.roles` (sieve masks on the host, then one jitted forward + β kernel
per batch) on the same encoded sequences, once with the single-device path the analyses had before
they were sharded (`devices=None`: arrays on the default device) and once per device count with the
data-parallel path (`Devices.local(n)`: the model replicated, every batch split). One untimed pass
per side compiles; the timed passes alternate the sides, so a noisy stretch hits them all. Every
side's per-sequence scores are checked against the unsharded side's (max relative difference).

On a CPU this measures the overhead of the sharded path at 1 device (fake CPU devices share the same
cores and say nothing about speed); on a GPU box or a TPU VM, the speed-up from 1 device to all.

    python -m benchmarks.scale --glue-dir ../shared/data/glue                 # MiniLM, 4 tasks
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from analysis.common.examples import encode_tasks, fit_max_length, load_tasks, make_parser
from analysis.common.forward import Devices
from analysis.heads.config import RolesConfig, config_tasks
from analysis.heads.scoring import make_scorer, score_sequences
from benchmarks import common
from bertjax import cli
from bertjax.pretrained import from_pretrained, load_tokenizer
from bertjax.settings import comma_list


def device_counts() -> list[int]:
    """1, 2, 4, … up to every local device (and the total when it is not a power of two)."""
    total = len(jax.local_devices())
    counts = [1 << k for k in range(total.bit_length()) if 1 << k <= total]
    return counts if counts[-1] == total else [*counts, total]


def max_relative_difference(results, reference) -> float:
    worst = 0.0
    for task, result in results.items():
        for role, scores in result.scores.items():
            expected = reference[task].scores[role]
            gap = np.abs(scores - expected) / np.maximum(np.abs(expected), 1e-30)
            worst = max(worst, float(np.nanmax(gap, initial=0.0)))
    return worst


def run(args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as scratch:
        ckpt = args.ckpt
        if args.random_preset:
            ckpt = common.random_checkpoint(args.random_preset, Path(args.vocab), Path(scratch))
        return measure(args, ckpt)


def measure(args, ckpt: str) -> list[dict]:
    roles = {"roles": tuple(args.roles.split(","))} if args.roles else {}
    config = RolesConfig(ckpt=ckpt, task=args.task, glue_dir=args.glue_dir, n=args.n, batch_size=args.batch_size,
                         **roles, **({"cache_dir": args.cache_dir} if args.cache_dir else {}))  # fmt: skip
    model = from_pretrained(ckpt)
    config = fit_max_length(config, model.config.max_position_embeddings)
    data = load_tasks(config, config_tasks(config))
    sequences = encode_tasks(config, data, load_tokenizer(ckpt), make_parser(config), {})
    n_sequences = sum(len(s) for s in sequences.values())
    sides = {"unsharded": None} | {f"devices={n}": Devices.local(n) for n in device_counts()}
    scorers = {name: make_scorer(model, (), devices) for name, devices in sides.items()}

    common.log("untimed pass per side: compiles")
    results = {name: score_sequences(scorer, sequences, config, {}) for name, scorer in scorers.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeat):
        for name, scorer in scorers.items():
            clock = time.perf_counter()
            score_sequences(scorer, sequences, config, {})
            times[name].append(time.perf_counter() - clock)

    settings = {
        "model": args.random_preset or ckpt,
        "task": args.task,
        "roles": list(config.roles),
        "n_sequences": n_sequences,
        "batch_size": args.batch_size,
    }
    lines = []
    for name, devices in sides.items():
        stats = common.summary(times[name])
        lines.append(common.emit(
            "scale", side=name, devices=None if devices is None else devices.count, **settings, **stats,
            sequences_per_s=n_sequences / stats["median_s"],
            max_relative_difference=max_relative_difference(results[name], results["unsharded"]),
        ))  # fmt: skip
    unsharded, one = (common.summary(times[name])["median_s"] for name in ("unsharded", "devices=1"))
    lines.append(
        common.emit("scale", side="overhead_at_1_device", **settings, overhead=one / unsharded - 1, target=0.05)
    )
    return lines


def parse_args(argv: list[str] | None):
    p = common.arguments(__doc__.split("\n\n")[0], repeat=3)
    common.add_model_arguments(p)
    p.add_argument("--task", default="all", type=comma_list, help="tasks, as analysis.roles --task")
    p.add_argument(
        "--roles", help="as analysis.roles --roles (positional roles need no parser: a GPU box without spaCy)"
    )
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cache-dir", help="parse cache (default: analysis.roles's)")
    return common.check_model_arguments(p, p.parse_args(argv))


def main(argv: list[str] | None = None) -> None:
    cli.use_compilation_cache()
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
