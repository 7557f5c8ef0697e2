"""Where a bertjax pre-training step spends its time: the step taken apart, each part timed alone.

Parts (each its own jitted function on the same params and batch): the loss forward pass, forward
+ backward with and without dropout, the optimizer update alone, and the whole compiled step of
`train.trainer.Trainer`. Differences between them bound the cost of the backward pass, of dropout
(its random bits and the masked softmax path it forces in attention) and of the update. With
`--prng`, JAX's random-bit generator is swapped (threefry is JAX's default; rbg and unsafe_rbg use
XLA's RngBitGenerator, much cheaper per bit on GPUs) to measure what dropout's bits cost.

    python -m benchmarks.step_profile --preset base --batch-size 256 --dtype bfloat16   # on a GPU
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import jax
import optax

from benchmarks import common
from benchmarks.train_step import BertjaxStep, make_batch
from bertjax import cli
from bertjax.config import preset
from train.metrics import flops_per_token, peak_flops


def parts(step: BertjaxStep) -> dict[str, tuple]:
    trainer, batch = step.trainer, step.batch
    params, key = step.state["params"], jax.random.key(1)
    loss = lambda p, k: trainer._loss(p, batch, k, step.state["step"])[0]
    update = lambda p, o, g: optax.apply_updates(p, trainer.tx.update(g, o, p)[0])
    return {
        "forward": (jax.jit(loss), (params, key)),
        "forward_backward": (jax.jit(jax.grad(loss)), (params, key)),
        "forward_backward_no_dropout": (jax.jit(jax.grad(lambda p: loss(p, None))), (params,)),
        "optimizer_update": (jax.jit(update), (params, step.state["opt_state"], params)),
    }


def run(args) -> list[dict]:
    if args.prng != "threefry":
        jax.config.update("jax_default_prng_impl", args.prng)
    config = preset(args.preset, dtype=args.dtype)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as workdir:
        step = BertjaxStep(config, make_batch(config, args.batch_size, args.seq_len), Path(workdir))
        tokens = args.batch_size * args.seq_len
        flops = flops_per_token(config, step.n_params, args.seq_len) * tokens
        peak = peak_flops(jax.devices()[0])
        settings = {"preset": args.preset, "batch": args.batch_size, "seq_len": args.seq_len, "dtype": args.dtype,
                    "prng": args.prng}  # fmt: skip
        records = []
        timed = {name: part for name, part in {**parts(step), "step": (None, None)}.items() if name in args.parts}
        for name, (fn, fn_args) in timed.items():
            call = step if fn is None else (lambda fn=fn, fn_args=fn_args: jax.block_until_ready(fn(*fn_args)))
            clock = time.perf_counter()
            call()
            compile_s = time.perf_counter() - clock
            stats = common.summary(common.time_calls(call, repeat=args.repeat, warmup=1))
            extra = {"mfu_of_step_flops": flops / stats["median_s"] / peak} if peak else {}
            records.append(common.emit("step_profile", part=name, **settings, **stats, compile_s=compile_s, **extra))
            if args.trace:
                # An XLA trace of a few calls (open with xprof/TensorBoard: per-op and per-kernel time).
                with jax.profiler.trace(str(Path(args.trace) / name)):
                    for _ in range(args.trace_calls):
                        call()
        step.close()
    return records


def main(argv: list[str] | None = None) -> None:
    p = common.arguments(__doc__.split("\n\n")[0], repeat=10)
    p.add_argument("--preset", default="base")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--prng", choices=("threefry", "rbg", "unsafe_rbg"), default="threefry")
    p.add_argument("--parts", default="forward,forward_backward,forward_backward_no_dropout,optimizer_update,step",
                   help="comma list of the parts to time")  # fmt: skip
    p.add_argument("--trace", help="also write a profiler trace of each part under this directory")
    p.add_argument("--trace-calls", type=int, default=2)
    args = p.parse_args(argv)
    args.parts = args.parts.split(",")
    run(args)


if __name__ == "__main__":
    cli.run(main)
