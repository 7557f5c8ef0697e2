"""Benchmark 1: the jitted sieve-bias kernel against a per-token NumPy loop, on the same arrays.

The loop is how the β of Pande et al. is written in analysis notebooks: for every sequence, layer,
head and role, walk the scored tokens and take NumPy means over the sieve and over the real keys.
Both compute scores[R, B, L, H]; the script checks they agree before it reports a ratio.

Inputs are synthetic but shaped like an analysis batch: lengths drawn between T/4 and T, softmax
attention over the real keys, and per role a sieve of 1–4 real keys for ~90% of the real tokens
(the sizes of the positional and syntactic roles).

    python -m benchmarks.sieve_kernel                 # BERT-base shapes: L=H=12, B=32, T=128, R=12
"""

from __future__ import annotations

import time

import jax
import numpy as np

from benchmarks import common
from bertjax import cli
from sieves.kernel import sieve_scores


def make_inputs(layers: int, batch: int, heads: int, length: int, roles: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(length // 4, 2), length + 1, size=batch)
    lengths[0] = length  # one full-length sequence, as a sorted analysis batch has
    real = np.arange(length)[None, :] < lengths[:, None]
    logits = rng.normal(scale=2.0, size=(layers, batch, heads, length, length)).astype(np.float32)
    logits = np.where(real[None, :, None, None, :], logits, -np.inf)
    attentions = np.exp(logits - logits.max(-1, keepdims=True))
    attentions /= attentions.sum(-1, keepdims=True)
    attentions = np.where(real[None, :, None, :, None], attentions, 0).astype(np.float32)
    sieves = np.zeros((roles, batch, length, length), bool)
    for b, n in enumerate(lengths):
        size = rng.integers(1, 5, size=(roles, n))
        keys = rng.random((roles, n, n)).argsort(-1)  # a random order of the real keys per row
        sieves[:, b, :n, :n] = np.take_along_axis(np.argsort(keys, -1), keys, -1) < size[..., None]
    rows = sieves.any(-1) & (rng.random((roles, batch, length)) < 0.9) & real[None]
    return attentions, real, rows, sieves


def per_token_loop(attentions: np.ndarray, real: np.ndarray, rows: np.ndarray, sieves: np.ndarray) -> np.ndarray:
    """β token by token, as a notebook computes it; scores[R, B, L, H] (NaN: no scored row)."""
    num_roles, batch = rows.shape[:2]
    layers, _, heads = attentions.shape[:3]
    scores = np.full((num_roles, batch, layers, heads), np.nan)
    for b in range(batch):
        keys = np.flatnonzero(real[b])
        for layer in range(layers):
            for head in range(heads):
                alpha = attentions[layer, b, head]
                for r in range(num_roles):
                    betas = []
                    for t in np.flatnonzero(rows[r, b]):
                        sieve = np.flatnonzero(sieves[r, b, t])
                        betas.append(alpha[t, sieve].mean() / alpha[t, keys].mean())
                    if betas:
                        scores[r, b, layer, head] = np.mean(betas)
    return scores


def run(layers: int, batch: int, heads: int, length: int, roles: int, repeat: int, loop_repeat: int) -> dict:
    inputs = make_inputs(layers, batch, heads, length, roles)
    shapes = {"layers": layers, "batch": batch, "heads": heads, "length": length, "roles": roles}
    device_inputs = jax.device_put(inputs)

    def kernel():
        return jax.block_until_ready(sieve_scores(*device_inputs))

    clock = time.perf_counter()
    kernel_scores = np.asarray(kernel()[0])
    compile_s = time.perf_counter() - clock
    common.log(f"kernel compiled in {compile_s:.1f} s; timing the loop ({loop_repeat}×), then the kernel ({repeat}×)")
    loop_times, kernel_times = [], []
    for _ in range(loop_repeat):
        clock = time.perf_counter()
        loop_scores = per_token_loop(*inputs)
        loop_times.append(time.perf_counter() - clock)
        # Kernel runs between loop runs, so that a noisy stretch of the machine hits both.
        kernel_times += common.time_calls(kernel, repeat=max(repeat // loop_repeat, 1), warmup=0)
    np.testing.assert_allclose(kernel_scores, loop_scores, rtol=1e-4)  # the same numbers, or no ratio
    kernel_stats, loop_stats = common.summary(kernel_times), common.summary(loop_times)
    common.emit("sieve_kernel", implementation="jax_kernel", **shapes, **kernel_stats, compile_s=compile_s)
    common.emit("sieve_kernel", implementation="numpy_per_token_loop", **shapes, **loop_stats)
    return common.emit(
        "sieve_kernel",
        implementation="ratio",
        **shapes,
        speedup=loop_stats["median_s"] / kernel_stats["median_s"],
        target=200,
    )


def main(argv: list[str] | None = None) -> None:
    p = common.arguments(__doc__.split("\n\n")[0], repeat=10)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--roles", type=int, default=12)
    p.add_argument("--loop-repeat", type=int, default=1, help="runs of the (slow) loop")
    a = p.parse_args(argv)
    run(a.layers, a.batch, a.heads, a.length, a.roles, a.repeat, a.loop_repeat)


if __name__ == "__main__":
    cli.run(main)
