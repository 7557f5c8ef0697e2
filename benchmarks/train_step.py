"""`python -m benchmarks.train_step`: one BERT pre-training step (forward + backward + AdamW update,
dropout on), bertjax's compiled step against HF transformers' PyTorch, on the same batch.

bertjax runs `train.trainer.Trainer`'s own compiled step (donated state fed back in, as `Trainer.run`
does); torch runs `transformers.BertForPreTraining` in train mode as a PyTorch user runs it: SDPA
attention, `torch.autocast` to bf16 under `--dtype bfloat16`, `torch.optim.AdamW` (fused on CUDA)
and global-norm clipping to 1.0, the settings bertjax's AdamW uses; `torch-compile` is the same
under `torch.compile` (its first call compiles and is reported as `compile_s`). AdamW on both sides,
although bertjax's recipes pre-train with LAMB: torch.optim has no LAMB, and the comparison needs the
same optimizer work on both (LAMB's update adds a per-layer norm pair to AdamW's). The backends' timed
calls are interleaved (A B A B ...) so that machine noise hits all alike. One JSON line per backend,
then one `speedup` line per torch backend (its median / bertjax's). Run it on an otherwise idle
machine: under CPU contention torch's OpenMP threads slow down far more than XLA's, which inflates
the speedup.

Note what "the same step" means: bertjax computes the MLM logits only at the P masked positions
(`masked_positions`), HF at every position (labels -100 elsewhere); that is how each library
pre-trains, and part of the difference. FLOP/s use `train.metrics.flops_per_token` for both.

On an accelerator: `--backends bertjax --dtype bfloat16 --preset base --batch-size 256` (bf16
compute over fp32 params, as `train.pretrain`'s `dtype: auto` picks there) gives the step's MFU.
torch is imported only when its backend is selected, and runs on CUDA when JAX does.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from benchmarks import common
from bertjax import cli
from bertjax.config import PRESETS, BertConfig, preset
from bertjax.errors import UserError
from train.metrics import flops_per_token, peak_flops

BACKENDS = ("bertjax", "torch", "torch-compile")
TORCH_BACKENDS = ("torch", "torch-compile")
MASK_FRACTION = 0.15  # of the real tokens, as in BERT
CLS, SEP, MASK = 101, 102, 103  # bert-base-uncased's special ids; any ids below the vocabulary do
LEARNING_RATE = 1e-3  # OptimizerConfig's default; bertjax's schedule barely decays it over the run


def reuse_freed_memory() -> bool:
    """Makes glibc serve every allocation from one heap that it never trims, so that what a step
    frees is reused by the next one rather than unmapped and faulted in again page by page.

    XLA:CPU maps each execution's temp arena afresh (1.6 GiB for base at batch 8: ~412k page
    faults, 1-5 s of kernel time per step). No numerics change; the setting is process-wide
    (torch gets it too) and covers JAX's threads only if it runs before JAX starts its CPU client.
    False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8  # <malloc.h>
    # One arena (threads' arenas are capped at 64 MiB and fall back to mmap), no mmap, no trimming.
    return bool(mallopt(m_arena_max, 1) and mallopt(m_mmap_max, 0) and mallopt(m_trim_threshold, -1))


def default_batch_size(name: str) -> int:
    """Keeps one eager torch step on a 2-core CPU under ~10 s."""
    return {"base": 8, "large": 4}.get(name, 32)


def predictions_per_seq(seq_len: int) -> int:
    """P: BERT's max_predictions_per_seq (20 at T = 128, 80 at 512, as in configs/pretrain),
    else round(0.15 · T)."""
    return {128: 20, 512: 80}.get(seq_len, max(1, round(MASK_FRACTION * seq_len)))


def make_batch(config: BertConfig, batch_size: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A pre-training batch in bertjax's layout (`train.data`): two segments per sequence, some
    padding, ~15% of the real tokens masked (at most P = `predictions_per_seq(T)` per sequence)."""
    rng = np.random.default_rng(seed)
    max_pred = predictions_per_seq(seq_len)
    input_ids = np.zeros((batch_size, seq_len), np.int32)
    token_type_ids = np.zeros((batch_size, seq_len), np.int32)
    attention_mask = np.zeros((batch_size, seq_len), np.int32)
    masked_positions = np.zeros((batch_size, max_pred), np.int32)
    masked_ids = np.zeros((batch_size, max_pred), np.int32)
    masked_weights = np.zeros((batch_size, max_pred), np.float32)
    low = min(1000, config.vocab_size // 2)
    for b in range(batch_size):
        length = int(rng.integers(max(seq_len // 2, 5), seq_len + 1))  # [CLS] a [SEP] b [SEP], then padding
        first_sep = int(rng.integers(2, length - 2))
        ids = rng.integers(low, config.vocab_size, length).astype(np.int32)
        ids[0], ids[first_sep], ids[length - 1] = CLS, SEP, SEP
        token_type_ids[b, first_sep + 1 : length] = 1
        attention_mask[b, :length] = 1
        candidates = [i for i in range(1, length - 1) if i != first_sep]
        count = min(max_pred, max(1, round(MASK_FRACTION * length)), len(candidates))
        positions = np.sort(rng.choice(candidates, count, replace=False))
        masked_positions[b, :count] = positions
        masked_ids[b, :count] = ids[positions]
        masked_weights[b, :count] = 1.0
        ids[positions] = MASK
        input_ids[b, :length] = ids
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "masked_positions": masked_positions,
        "masked_ids": masked_ids,
        "masked_weights": masked_weights,
        "nsp_labels": rng.integers(0, 2, batch_size).astype(np.int32),
    }


class BertjaxStep:
    """`Trainer`'s compiled step, timed in steady state: the donated state is fed back in."""

    def __init__(self, config: BertConfig, batch: dict[str, np.ndarray], workdir: Path, dropout_rng: str | None = None):
        from bertjax import sharding
        from bertjax.model import BertForPreTraining
        from train.checkpoints import CheckpointConfig
        from train.losses import pretraining_loss
        from train.optim import OptimizerConfig
        from train.trainer import LoopConfig, Trainer

        self.name = "bertjax"
        self.trainer = Trainer(
            workdir=workdir,
            model_config=config,
            model_cls=BertForPreTraining,
            loss_fn=pretraining_loss,
            optimizer=OptimizerConfig(name="adamw", learning_rate=LEARNING_RATE),
            # Many steps so that the linear decay keeps the learning rate ~constant while timed.
            loop=LoopConfig(
                steps=1_000_000,
                global_batch_size=len(batch["input_ids"]),
                seed=0,
                # None: the trainer's default generator.
                **({} if dropout_rng is None else {"dropout_rng": dropout_rng}),
            ),
            checkpoint=CheckpointConfig(every=0),  # never reached: only the step function is called
            mesh=sharding.make_mesh(sharding.MeshConfig()),
            run_config={},
            tokenizer="tokenizer",
        )
        self.n_params = self.trainer.n_params
        self.state, _ = self.trainer.restore_or_init()
        self.batch = sharding.global_batch(batch, self.trainer.mesh)
        self.key = self.trainer.dropout_key()
        self.metrics: dict[str, jax.Array] = {}
        self.on_accelerator = jax.devices()[0].platform != "cpu"

    def __call__(self) -> None:
        self.state, self.metrics = self.trainer._step_fn(self.state, self.batch, self.key)
        jax.block_until_ready((self.state, self.metrics))

    def loss(self) -> float:
        return float(self.metrics["loss"])

    def close(self) -> None:
        self.trainer.checkpointer.close()


class TorchStep:
    """HF `BertForPreTraining` in train mode with SDPA attention, eager or under `torch.compile`;
    AdamW with bertjax's hyper-parameters; bf16 autocast when `dtype` is bfloat16."""

    def __init__(self, config: BertConfig, batch: dict[str, np.ndarray], compiled: bool = False):
        try:
            import torch
            import transformers
        except ImportError as e:
            raise UserError(f"the torch backend needs torch and transformers ({e}); pass --backends bertjax") from None
        from train.optim import OptimizerConfig

        self.name = "torch-compile" if compiled else "torch"
        self.torch = torch
        torch.set_num_threads(os.cpu_count() or 1)
        torch.manual_seed(0)
        on_gpu = jax.devices()[0].platform == "gpu" and torch.cuda.is_available()
        self.device = torch.device("cuda" if on_gpu else "cpu")
        self.on_accelerator = on_gpu
        # Params stay in their storage dtype (fp32); bf16 compute is autocast's, as torch users run it.
        self.autocast_dtype = torch.bfloat16 if config.dtype == "bfloat16" else None
        hf_config = transformers.BertConfig.from_dict(
            config.to_hf_dict("BertForPreTraining"), attn_implementation="sdpa"
        )
        self.model = transformers.BertForPreTraining(hf_config).to(self.device).train()
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.forward = torch.compile(self.model) if compiled else self.model
        opt = OptimizerConfig(name="adamw", learning_rate=LEARNING_RATE)
        # The fused kernel exists for CUDA tensors only.
        self.fused = self.device.type == "cuda"
        # Weight decay skips biases and LayerNorm, as `train.optim.decay_mask` does.
        named = list(self.model.named_parameters())
        no_decay = [p for n, p in named if n.endswith("bias") or "LayerNorm" in n]
        decay = [p for n, p in named if not (n.endswith("bias") or "LayerNorm" in n)]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=opt.learning_rate,
            betas=(opt.b1, opt.b2),
            eps=opt.eps,
            fused=self.fused,
        )
        self.max_grad_norm = opt.max_grad_norm
        labels = np.full(batch["input_ids"].shape, -100, np.int64)
        rows, slots = np.nonzero(batch["masked_weights"])
        labels[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
        as_tensor = lambda x: torch.from_numpy(np.asarray(x, np.int64)).to(self.device)
        self.inputs = {
            "input_ids": as_tensor(batch["input_ids"]),
            "token_type_ids": as_tensor(batch["token_type_ids"]),
            "attention_mask": as_tensor(batch["attention_mask"]),
            "labels": as_tensor(labels),
            "next_sentence_label": as_tensor(batch["nsp_labels"]),
        }
        self.last_loss = None

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with self.torch.autocast(self.device.type, self.autocast_dtype, enabled=self.autocast_dtype is not None):
            loss = self.forward(**self.inputs).loss
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.last_loss = loss.detach()
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def loss(self) -> float:
        return float(self.last_loss)

    def close(self) -> None:
        pass


def interleaved(runners: list[Callable[[], Any]], repeat: int) -> list[list[float]]:
    """`repeat` timed calls of each runner, alternating A B A B ... (warm-up done beforehand)."""
    times: list[list[float]] = [[] for _ in runners]
    for _ in range(repeat):
        for runner, recorded in zip(runners, times, strict=True):
            recorded.extend(common.time_calls(runner, repeat=1, warmup=0))
    return times


def run_preset(name: str, args) -> list[dict[str, Any]]:
    batch_size = args.batch_size or default_batch_size(name)
    overrides = {} if args.attention_dropout is None else {"attention_probs_dropout_prob": args.attention_dropout}
    config = preset(name, dtype=args.dtype, max_position_embeddings=max(512, args.seq_len), **overrides)
    batch = make_batch(config, batch_size, args.seq_len, seed=args.seed)
    settings = {
        "preset": name,
        "batch": batch_size,
        "seq_len": args.seq_len,
        "dtype": args.dtype,
        "attention_dropout": config.attention_probs_dropout_prob,
        "dropout_rng": args.dropout_rng,
        "malloc": "reuse" if args.reuse_freed_memory else "default",
    }
    peak = peak_flops(jax.devices()[0])
    records = []
    with tempfile.TemporaryDirectory(prefix="bertjax-train-step-") as workdir:
        runners, extra = [], {}
        try:
            for backend in args.backends:
                common.log(f"{name}: building {backend} (batch {batch_size} × T {args.seq_len}, {args.dtype})")
                if backend == "bertjax":
                    runner = BertjaxStep(config, batch, Path(workdir) / backend, args.dropout_rng)
                    runners.append(runner)
                    # The first call compiles; it is reported, not timed with the rest.
                    extra[backend] = {"compile_s": common.time_calls(runner, repeat=1, warmup=0)[0]}
                else:
                    runner = TorchStep(config, batch, compiled=backend == "torch-compile")
                    runners.append(runner)
                    extra[backend] = {"threads": runner.torch.get_num_threads(), "attention": "sdpa",
                                      "autocast": str(runner.autocast_dtype), "fused_adamw": runner.fused}  # fmt: skip
                    if backend == "torch-compile":
                        extra[backend]["compile_s"] = common.time_calls(runner, repeat=1, warmup=0)[0]
                common.time_calls(runners[-1], repeat=0, warmup=args.warmup)
            common.log(f"{name}: timing {' / '.join(args.backends)} interleaved, {args.repeat} runs each")
            all_times = interleaved(runners, args.repeat)
            medians = {}
            for runner, times in zip(runners, all_times, strict=True):
                stats = common.summary(times)
                medians[runner.name] = stats["median_s"]
                tokens = batch_size * args.seq_len
                flops = flops_per_token(config, runner.n_params, args.seq_len) * tokens / stats["median_s"]
                record = {
                    **settings,
                    "backend": runner.name,
                    "params": runner.n_params,
                    **stats,
                    "sequences_per_s": batch_size / stats["median_s"],
                    "tokens_per_s": tokens / stats["median_s"],
                    "flops_per_s": flops,
                    **({"mfu": flops / peak} if peak is not None and runner.on_accelerator else {}),
                    **extra[runner.name],
                    "loss": runner.loss(),
                    "times_s": [round(t, 4) for t in times],
                }
                records.append(common.emit("train_step", **record))
            for baseline in TORCH_BACKENDS:
                if "bertjax" in medians and baseline in medians:
                    records.append(
                        common.emit(
                            "train_step",
                            **settings,
                            backend="bertjax",
                            baseline=baseline,
                            speedup=medians[baseline] / medians["bertjax"],
                            bertjax_median_s=medians["bertjax"],
                            torch_median_s=medians[baseline],
                        )
                    )
        finally:
            for runner in runners:
                runner.close()
    return records


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = common.arguments(__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="mini,base", help=f"comma list of {', '.join(PRESETS)} (default: mini,base)")
    p.add_argument("--tiny", action="store_true", help="smoke test: preset tiny, batch 2, T = 32")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: 32; base 8, large 4)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--backends", default="bertjax,torch", help=f"comma list of {', '.join(BACKENDS)}")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="compute dtype over fp32 params (torch: bf16 autocast)",
    )
    p.add_argument(
        "--attention-dropout",
        type=float,
        default=None,
        help="attention dropout of both sides (default: the preset's 0.1); at 0 bertjax attends through "
        "jax.nn.dot_product_attention, as the emergence recipes train",
    )
    p.add_argument(
        "--dropout-rng",
        choices=("threefry2x32", "rbg"),
        default="threefry2x32",
        help="bertjax's generator of the dropout masks (train.dropout_rng)",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per backend (after bertjax's compile)")
    p.add_argument("--seed", type=int, default=0, help="seed of the batch")
    p.add_argument(
        "--reuse-freed-memory",
        action="store_true",
        help="glibc: keep freed memory for reuse (no per-step page faults); see reuse_freed_memory",
    )
    args = p.parse_args(argv)
    if args.tiny:
        args.preset = "tiny"
        args.batch_size = args.batch_size or 2
        args.seq_len = 32 if args.seq_len == 128 else args.seq_len
    presets = [s.strip() for s in args.preset.split(",") if s.strip()]
    for name in presets:
        if name not in PRESETS:
            raise UserError(f"--preset: unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    args.backends = [s.strip() for s in args.backends.split(",") if s.strip()]
    unknown = set(args.backends) - set(BACKENDS)
    if unknown or not args.backends:
        raise UserError(f"--backends: {', '.join(sorted(unknown)) or 'none given'}; choose from {', '.join(BACKENDS)}")
    if args.seq_len < 8 or args.repeat < 1 or args.warmup < 0 or (args.batch_size is not None and args.batch_size < 1):
        raise UserError("--seq-len must be at least 8, --repeat and --batch-size at least 1, --warmup at least 0")
    # Both frameworks share one GPU: JAX would otherwise take 75% of its memory at start, and the
    # torch backends' first step would run out. Set before JAX starts its client, as this is.
    if set(args.backends) & set(TORCH_BACKENDS):
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    # Before anything starts JAX's CPU client, so that its threads allocate from the one heap.
    if args.reuse_freed_memory and not reuse_freed_memory():
        raise UserError("--reuse-freed-memory needs glibc's mallopt")
    records = []
    for name in presets:
        records += run_preset(name, args)
    return records


if __name__ == "__main__":
    cli.run(main)
