"""`python -m benchmarks.intervene_cost`: what the `intervene` section costs per pre-training step
(issue 49 item 3), the step with each steering beside the step without, on each model preset.

Each variant's config is resolved as `train.pretrain` resolves it (`--config`, then the preset,
batch, length and the variant's `intervene` list as overrides, then the command's own overrides),
checked by `train.pretraining.check_settings`, and its step is the compiled step of the trainer
`train.pretraining.phase_trainer` builds for a run: the same loss (the section's penalties from the
forward pass's own attention), optimizer (LAMB by default), dropout, compute dtype and matmul
precision. The batch is `benchmarks.train_step.make_batch`'s, in the prepared data's layout
(`[CLS] A [SEP] B [SEP]`, padding, ~15% masked): the step's cost does not depend on the tokens.

Variants: `none` (no section), `positional` (prev and next suppressed on every head: the known
answer's steering) and `cls` ([CLS] suppressed on every head: its control). Each compiles, takes
`--warmup` untimed steps, then the variants take one step each per round, the order rotating from
round to round, so that a drift in the machine's load falls on all of them alike. A steered
variant's cost is its step's time over the unsteered step's in the same round; its median over the
rounds is `cost`, with the quartiles and the range for the spread; `cpu_cost` is the same read on
the process's CPU seconds, which the load of other processes on a shared machine inflates far less.
One JSON line per variant, then one `cost` line per steered variant.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import jax

from benchmarks import common
from benchmarks.train_step import make_batch, predictions_per_seq
from bertjax import cli, sharding
from bertjax import settings as config_lib
from bertjax.config import PRESETS
from bertjax.errors import UserError
from bertjax.precision import matmul_precision
from train import pretraining
from train.config import PretrainConfig

VARIANTS = {
    "none": "intervene=[]",
    "positional": "intervene=[{role: prev}, {role: next}]",
    "cls": "intervene=[{role: cls}]",
}


class Step:
    """One variant's compiled step from a run's trainer, timed in steady state: the donated state is
    fed back in, under the run's matmul precision, as `Trainer.run` calls it."""

    def __init__(self, variant: str, config: PretrainConfig, workdir: Path, seed: int):
        self.variant = variant
        self.config = config
        mesh = sharding.make_mesh(config.mesh)
        pretraining.check_settings(config, workdir, mesh)
        phase = pretraining.phase_settings(config)[0]
        self.trainer = pretraining.phase_trainer(
            config, phase, config.data, config.data.vocab_size, workdir, mesh, dataclasses.asdict(config)
        )
        self.state, _ = self.trainer.restore_or_init()
        # The same batch for every variant (one seed; the vocabulary data.vocab_size, 30522 by default).
        batch = make_batch(self.trainer.config, config.train.global_batch_size, config.data.max_seq_length, seed)
        self.batch = sharding.global_batch(batch, mesh)
        self.key = self.trainer.dropout_key()
        self.metrics: dict[str, jax.Array] = {}

    def __call__(self) -> None:
        with matmul_precision(self.trainer.matmul_precision):
            self.state, self.metrics = self.trainer._step_fn(self.state, self.batch, self.key)
        jax.block_until_ready((self.state, self.metrics))

    def close(self) -> None:
        self.trainer.checkpointer.close()


def rounds(steps: list[Step], repeat: int) -> tuple[list[list[float]], list[list[float]]]:
    """`repeat` rounds of one timed call of each step, round i starting at step i mod len(steps):
    (wall, cpu), wall[s][i] step s's wall seconds in round i, cpu[s][i] the process's CPU seconds
    (every XLA thread's), which other processes' load inflates far less than the wall time."""
    wall: list[list[float]] = [[] for _ in steps]
    cpu: list[list[float]] = [[] for _ in steps]
    for i in range(repeat):
        for j in range(len(steps)):
            s = (i + j) % len(steps)
            start, start_cpu = time.perf_counter(), time.process_time()
            steps[s]()
            wall[s].append(time.perf_counter() - start)
            cpu[s].append(time.process_time() - start_cpu)
    return wall, cpu


def spread(values: list[float]) -> dict[str, Any]:
    """The median of `values`, their quartiles and range."""
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "quartiles": [quartiles[0], quartiles[2]],
            "range": [min(values), max(values)]}  # fmt: skip


def run_preset(name: str, args) -> list[dict[str, Any]]:
    seq_len = args.seq_len
    shape = [f"model.preset={name}", f"train.global_batch_size={args.batch_size}", f"data.max_seq_length={seq_len}",
             f"data.max_predictions_per_seq={predictions_per_seq(seq_len)}"]  # fmt: skip
    configs = {
        variant: config_lib.load_config(PretrainConfig, args.config, [*shape, VARIANTS[variant], *args.overrides])
        for variant in args.variants
    }
    steps: list[Step] = []
    records, compile_s = [], {}
    with tempfile.TemporaryDirectory(prefix="bertjax-intervene-cost-") as workdir:
        try:
            for variant, config in configs.items():
                common.log(f"{name}: compiling {variant} (batch {args.batch_size} × T {seq_len})")
                step = Step(variant, config, Path(workdir) / variant, args.seed)
                steps.append(step)
                compile_s[variant] = common.time_calls(step, repeat=1, warmup=0)[0]
                common.time_calls(step, repeat=0, warmup=args.warmup)
            common.log(f"{name}: timing {' / '.join(args.variants)} in {args.repeat} rotating rounds")
            load_before = os.getloadavg()
            times, cpu_times = rounds(steps, args.repeat)
            load_after = os.getloadavg()
            model = steps[0].trainer.config
            settings = {
                "preset": name,
                "batch": args.batch_size,
                "seq_len": seq_len,
                "dtype": model.dtype,
                "optimizer": steps[0].config.optimizer.name,
                "attention_dropout": model.attention_probs_dropout_prob,
                "layers": model.num_hidden_layers,
                "heads": model.num_attention_heads,
                "params": steps[0].trainer.n_params,
            }
            by_variant = dict(zip(args.variants, times, strict=True))
            cpu_by_variant = dict(zip(args.variants, cpu_times, strict=True))
            for step, variant_times, variant_cpu in zip(steps, times, cpu_times, strict=True):
                records.append(
                    common.emit(
                        "intervene_cost",
                        **settings,
                        variant=step.variant,
                        intervene=[dataclasses.asdict(e) for e in step.config.intervene],
                        compile_s=compile_s[step.variant],
                        **common.summary(variant_times),
                        loss=float(step.metrics["loss"]),
                        # The last step's metrics: each entry's penalty and the β̄ it acts on.
                        intervene_metrics={k: float(v) for k, v in step.metrics.items() if k.startswith("intervene/")},
                        times_s=[round(t, 4) for t in variant_times],
                        cpu_median_s=statistics.median(variant_cpu),
                        cpu_times_s=[round(t, 4) for t in variant_cpu],
                    )
                )
            for variant, variant_times in by_variant.items():
                if variant == "none" or "none" not in by_variant:
                    continue
                ratios = [s / u for s, u in zip(variant_times, by_variant["none"], strict=True)]
                stats = spread(ratios)
                cpu_ratios = [s / u for s, u in zip(cpu_by_variant[variant], cpu_by_variant["none"], strict=True)]
                cpu_stats = spread(cpu_ratios)
                records.append(
                    common.emit(
                        "intervene_cost",
                        **settings,
                        variant=variant,
                        baseline="none",
                        cost=stats["median"],
                        cost_quartiles=stats["quartiles"],
                        cost_range=stats["range"],
                        ratio_of_medians=statistics.median(variant_times) / statistics.median(by_variant["none"]),
                        cpu_cost=cpu_stats["median"],
                        cpu_cost_quartiles=cpu_stats["quartiles"],
                        cpu_cost_range=cpu_stats["range"],
                        rounds=len(ratios),
                        load_average_before=[round(x, 2) for x in load_before],
                        load_average_after=[round(x, 2) for x in load_after],
                    )
                )
        finally:
            for step in steps:
                step.close()
    return records


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = common.arguments(__doc__.split("\n\n")[0], repeat=10)
    p.add_argument("--preset", default="mini,base", help=f"comma list of {', '.join(PRESETS)} (default: mini,base)")
    p.add_argument("--config", help="a train.pretrain config to start from (default: PretrainConfig's defaults)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant after its compile")
    p.add_argument("--seed", type=int, default=0, help="seed of the batch")
    p.add_argument(
        "overrides", nargs="*", help="train.pretrain's dotted.key=value overrides, e.g. model.dtype=bfloat16"
    )
    args = p.parse_args(argv)
    presets = [s.strip() for s in args.preset.split(",") if s.strip()]
    for name in presets:
        if name not in PRESETS:
            raise UserError(f"--preset: unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    args.variants = [s.strip() for s in args.variants.split(",") if s.strip()]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown or not args.variants:
        raise UserError(f"--variants: {', '.join(sorted(unknown)) or 'none given'}; choose from {', '.join(VARIANTS)}")
    if args.seq_len < 8 or args.repeat < 1 or args.warmup < 0 or args.batch_size < 1:
        raise UserError("--seq-len must be at least 8, --repeat and --batch-size at least 1, --warmup at least 0")
    records = []
    for name in presets:
        records += run_preset(name, args)
    return records


if __name__ == "__main__":
    cli.run(main)
