"""The training loop shared by pre-training and fine-tuning.

One step is compiled once with explicit shardings and a donated state: gradient accumulation is a
`lax.scan` over micro-batches inside it, the dropout key is `fold_in(seed key, step)` (so a resumed
run replays the same randomness), and a non-finite loss is recorded on device (`bad_step`) and
checked only when metrics are fetched, so the host never waits on the device between logs.

Params live as a flat dict `{"bert/encoder/...": array}`, the checkpoint layout, so the optimizer,
the shardings and orbax all see one simple tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bertjax import checkpoint as ckpt
from bertjax import cli, sharding
from bertjax.config import BertConfig
from bertjax.errors import UserError
from bertjax.model import Model
from bertjax.precision import matmul_precision
from bertjax.pretrained import Checkpoint, from_pretrained
from bertjax.progress import tqdm
from train.checkpoints import OPT_SIGNATURE, Checkpointer, abstract_with_shardings, tree_signature
from train.config import CheckpointConfig, LoopConfig, OptimizerConfig
from train.metrics import MetricsWriter, flops_per_token, peak_flops, throughput
from train.optim import make_optimizer, schedule

log = logging.getLogger(__name__)

# (model, batch, dropout key, step=the updates made before this one) → (loss, metrics).
LossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


def check_batch(loop: LoopConfig, mesh: jax.sharding.Mesh, name: str = "train.global_batch_size") -> None:
    """The batch splits into `grad_accum_steps` micro-batches on every process and over the mesh's
    devices; `name` is the setting that gave it (a later phase has its own)."""
    if loop.grad_accum_steps < 1:
        raise UserError(f"train.grad_accum_steps must be at least 1, got {loop.grad_accum_steps}")
    if loop.global_batch_size % (loop.grad_accum_steps * jax.process_count()):
        raise UserError(
            f"{name} {loop.global_batch_size} is not divisible by "
            f"grad_accum_steps × processes ({loop.grad_accum_steps} × {jax.process_count()})"
        )
    sharding.check_batch_size(name, loop.global_batch_size, mesh)


class DataIterator(Protocol):
    def __next__(self) -> dict[str, np.ndarray]: ...

    @property
    def position(self) -> dict[str, Any]: ...


@dataclasses.dataclass
class Outcome:
    step: int
    preempted: bool
    metrics: dict[str, float]
    timings: dict[str, float]


@dataclasses.dataclass(frozen=True)
class _Hooks:
    """`Trainer.run`'s evaluation and probes, and their intervals."""

    evaluate: Callable[[int, dict[str, jax.Array]], dict[str, float]] | None
    eval_every: int
    eval_at_saves: bool
    probe: Callable[[int, dict[str, jax.Array]], dict[str, float]] | None
    probe_every: int


@dataclasses.dataclass
class _Window:
    """The steps since the last metrics line: their metrics (on the devices until the line is
    written), tokens and FLOPs. `start` is None until the first step, which compiles, is done."""

    metrics: list[dict[str, jax.Array]] = dataclasses.field(default_factory=list)
    tokens: float = 0.0
    flops: float = 0.0
    start: float | None = None

    def add(self, metrics: dict[str, jax.Array], tokens: float, flops: float) -> None:
        self.metrics.append(metrics)
        self.tokens += tokens
        self.flops += flops

    def restart(self) -> None:
        self.metrics, self.tokens, self.flops, self.start = [], 0.0, 0.0, time.perf_counter()

    def means(self) -> dict[str, float]:
        """The window's mean metrics, once its steps are done."""
        fetched = jax.device_get(self.metrics)
        return {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}

    def summary(self, batch_size: int, peak: float | None) -> dict[str, float]:
        """The window's mean metrics and its throughput."""
        means = self.means()
        assert self.start is not None  # a summary's window began after the first step
        elapsed = time.perf_counter() - self.start
        steps = len(self.metrics)
        return means | throughput(steps, elapsed, batch_size, self.tokens, self.flops, peak, jax.device_count())


class Trainer:
    def __init__(
        self,
        *,
        workdir: Path,
        model_config: BertConfig,
        model_cls: type[Model],
        loss_fn: LossFn,
        optimizer: OptimizerConfig,
        loop: LoopConfig,
        checkpoint: CheckpointConfig,
        mesh: jax.sharding.Mesh,
        run_config: dict[str, Any],
        tokenizer: str,
        start_step: int = 0,
        matmul_precision: str = "default",
        init: Checkpoint | None = None,
    ):
        """`start_step`: where this phase begins in a multi-phase run (its steps continue the
        previous phase's; its optimizer and learning-rate schedule start afresh).
        `matmul_precision`: the matrix products' (`bertjax.precision`), for everything `run` computes.
        `init`: `loop.init_from`, opened by the run's entry (once, and only where the workdir has no
        checkpoint to resume: a resume never needs it)."""
        check_batch(loop, mesh)
        self.init = init
        self.matmul_precision = matmul_precision
        self.workdir = Path(workdir)
        self.config = model_config
        self.model_cls = model_cls
        self.loop = loop
        self.start, self.end = start_step, start_step + loop.steps
        self.mesh = mesh
        self.is_main = jax.process_index() == 0
        abstract_model = nnx.eval_shape(lambda: model_cls(model_config, rngs=nnx.Rngs(params=loop.seed)))
        self.graphdef, self.abstract_state = nnx.split(abstract_model)
        self.abstract_params = ckpt.flatten_params(self.abstract_state)
        self.meta = ckpt.make_meta(abstract_model, tokenizer, run_config)
        self.n_params = sum(int(np.prod(x.shape)) for x in self.abstract_params.values())

        self.schedule = schedule(optimizer, loop.steps)
        self.tx = make_optimizer(optimizer, loop.steps)
        self.param_shardings = sharding.state_shardings(mesh, self.abstract_params)
        abstract_opt = jax.eval_shape(self.tx.init, self.abstract_params)
        self.meta[OPT_SIGNATURE] = tree_signature(abstract_opt)
        self.opt_shardings = sharding.state_shardings(mesh, abstract_opt)
        self.abstract_opt = abstract_with_shardings(abstract_opt, self.opt_shardings)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self.state_shardings = {
            "params": self.param_shardings,
            "opt_state": self.opt_shardings,
            "step": replicated,
            "bad_step": replicated,
        }
        self.checkpointer = Checkpointer(self.workdir, checkpoint, self.end, first_step=self.start)
        self.loss_fn = loss_fn
        self._step_fn = jax.jit(
            self._train_step,
            in_shardings=(self.state_shardings, sharding.batch_sharding(mesh), replicated),
            out_shardings=(self.state_shardings, replicated),
            donate_argnums=(0,),
        )
        self._preempted = False

    # -- state -----------------------------------------------------------------------------

    def model(self, params: dict[str, jax.Array]) -> nnx.Module:
        return nnx.merge(self.graphdef, ckpt.unflatten_params(self.abstract_state, params))

    def _fresh_state(self, params: dict[str, jax.Array]) -> dict[str, Any]:
        init_opt = jax.jit(self.tx.init, out_shardings=self.opt_shardings)
        state = {
            "params": params,
            "opt_state": init_opt(params),
            "step": jnp.zeros((), jnp.int32),
            "bad_step": jnp.full((), -1, jnp.int32),
        }
        # Exactly the shardings the step returns, or its second call would compile again.
        return jax.device_put(state, self.state_shardings)

    def _initial_params(self) -> dict[str, jax.Array]:
        if self.init is not None:
            model = from_pretrained(self.init, self.model_cls, seed=self.loop.seed)
            params = ckpt.flatten_params(nnx.state(model, nnx.Param))
            for name, expected in self.abstract_params.items():
                if params[name].shape != expected.shape:
                    raise UserError(
                        f"train.init_from {self.loop.init_from}: tensor {name} has shape "
                        f"{list(params[name].shape)}, this run's model needs {list(expected.shape)}"
                    )
            return jax.device_put(
                {k: params[k].astype(v.dtype) for k, v in self.abstract_params.items()}, self.param_shardings
            )
        cls, config = self.model_cls, self.config
        # The key is an argument, not a constant: with nothing traced the whole init is a constant
        # computation for XLA to fold, and BERT-base's took 4 min 15 s to compile on an H100.
        init = jax.jit(
            lambda key: ckpt.flatten_params(nnx.state(cls(config, rngs=nnx.Rngs(params=key)), nnx.Param)),
            out_shardings=self.param_shardings,
        )
        return init(jax.random.key(self.loop.seed))

    def dropout_key(self) -> jax.Array:
        """The run's key of the dropout masks; each step folds its number in."""
        return jax.random.key(self.loop.seed, impl=self.loop.dropout_rng)

    def restore_or_init(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(train state, data position to resume from or None)."""
        abstract_params = abstract_with_shardings(self.abstract_params, self.param_shardings)
        restored = self.checkpointer.restore_latest(abstract_params, self.abstract_opt, self.meta)
        if restored is None:
            if self.start > 0:
                raise UserError(f"{self.workdir}: no checkpoint of the previous phase to start step {self.start} from")
            if self.loop.init_from and self.init is None:
                # The entry saw steps to resume and left init_from unopened; each has proved
                # unreadable since (and was set aside): a random init would ignore the setting.
                raise UserError(
                    f"{self.checkpointer.directory}: no readable checkpoint to resume from; run the same "
                    f"command again to start afresh from train.init_from {self.loop.init_from}"
                )
            return self._fresh_state(self._initial_params()), None
        step, items = restored
        if step < self.start:
            raise UserError(f"{self.workdir}: latest checkpoint is step {step}, before this phase's start {self.start}")
        if step == self.start and self.start > 0:
            log.info("phase starting at step %d from the previous phase's params", step)
            state = self._fresh_state(items[ckpt.PARAMS])
            state["step"] = jax.device_put(jnp.asarray(step, jnp.int32), self.state_shardings["step"])
            return state, None
        log.info("resuming from %s at step %d", self.checkpointer.directory, step)
        trainer = items["trainer"]
        state = {
            "params": items[ckpt.PARAMS],
            "opt_state": items["opt_state"],
            "step": jnp.asarray(step, jnp.int32),
            "bad_step": jnp.full((), -1, jnp.int32),
        }
        return jax.device_put(state, self.state_shardings), trainer["data_position"]

    # -- the step ----------------------------------------------------------------------------

    def _loss(self, params, batch, key, step):
        return self.loss_fn(self.model(params), batch, key, step=step)

    def _train_step(self, state, batch, key):
        accum = self.loop.grad_accum_steps
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)
        params = state["params"]
        step_key = jax.random.fold_in(key, state["step"])
        if accum == 1:
            (loss, metrics), grads = grad_fn(params, batch, step_key, state["step"])
        else:
            micro = jax.tree.map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)

            def body(carry, inputs):
                i, one = inputs
                (loss, metrics), grads = grad_fn(params, one, jax.random.fold_in(step_key, i), state["step"])
                return jax.tree.map(jnp.add, carry, (loss, metrics, grads)), None

            (loss_shape, metrics_shape), grads_shape = jax.eval_shape(
                grad_fn, params, jax.tree.map(lambda x: x[0], micro), step_key, state["step"]
            )
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), (loss_shape, metrics_shape, grads_shape))
            (loss, metrics, grads), _ = jax.lax.scan(body, zeros, (jnp.arange(accum), micro))
            loss, metrics, grads = jax.tree.map(lambda x: x / accum, (loss, metrics, grads))
        updates, opt_state = self.tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        # Checking the update too keeps non-finite params out of the checkpoint saved after it.
        finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(updates))
        bad = jnp.where((state["bad_step"] < 0) & ~finite, state["step"] + 1, state["bad_step"])
        metrics = {
            **metrics,
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": self.schedule(state["step"] - self.start),
        }
        new_state = {"params": new_params, "opt_state": opt_state, "step": state["step"] + 1, "bad_step": bad}
        return new_state, metrics

    # -- the loop ----------------------------------------------------------------------------

    def _after_step(
        self,
        step: int,
        state,
        data: DataIterator,
        key: jax.Array,
        hooks: _Hooks,
        writer: MetricsWriter,
        last_good: int | None,
    ) -> int | None:
        """What follows step `step`: a signal's effect, the evaluation and probes due, the checkpoint
        due (a scheduled one, or a preemption's); returns the last good checkpoint's step."""
        if cli.interrupted():
            raise KeyboardInterrupt  # Ctrl-C: no checkpoint, the steps since the last are dropped
        if cli.terminated() and not self._preempted:
            log.warning("SIGTERM: saving a checkpoint after step %d, then exiting", step)
            self._preempted = True
        scheduled_save = self.checkpointer.should_save(step)
        periodic = hooks.eval_every and (step % hooks.eval_every == 0 or step == self.end)
        evaluated = None
        # Not at a preemption's save: the grace period goes to saving, not to evaluating.
        if hooks.evaluate is not None and (periodic or (hooks.eval_at_saves and scheduled_save)):
            evaluated = hooks.evaluate(step, state["params"])
            writer.write(step, evaluated)
        if hooks.probe is not None and (step % hooks.probe_every == 0 or scheduled_save):
            writer.write(step, hooks.probe(step, state["params"]))
        if not (scheduled_save or self._preempted):
            return last_good
        self._check_finite(state, last_good)
        self.save(state, data.position, key, evaluated)
        return step

    def _check_finite(self, state, last_good: int | None) -> None:
        bad = int(jax.device_get(state["bad_step"]))
        if bad >= 0:
            kept = f"the last good checkpoint is step {last_good}" if last_good else "no checkpoint was written"
            raise UserError(f"non-finite loss or update at step {bad}; stopping ({kept})")

    def save(
        self, state, data_position: dict[str, Any], key: jax.Array, metrics: dict[str, float] | None = None
    ) -> None:
        step = int(jax.device_get(state["step"]))
        trainer = {
            "step": step,
            "data_position": data_position,
            "rng_key": np.asarray(jax.random.key_data(key)).tolist(),
        }
        self.checkpointer.save(step, state["params"], state["opt_state"], trainer, self.meta, metrics)

    def run(self, make_data: Callable[[dict[str, Any] | None], DataIterator], **hooks: Any) -> Outcome:
        """`_run` under the run's matrix-product precision: the step, the evaluations and the
        probes are traced with it at their first call (jit keys its cache on it)."""
        with matmul_precision(self.matmul_precision):
            return self._run(make_data, **hooks)

    def _run(
        self,
        make_data: Callable[[dict[str, Any] | None], DataIterator],
        evaluate: Callable[[int, dict[str, jax.Array]], dict[str, float]] | None = None,
        eval_every: int = 0,
        eval_at_saves: bool = False,
        probe: Callable[[int, dict[str, jax.Array]], dict[str, float]] | None = None,
        probe_every: int = 0,
    ) -> Outcome:
        """Trains to step `start_step + loop.steps`, resuming if the workdir has checkpoints.

        `evaluate(step, params)` runs every `eval_every` steps and at the end, and with
        `eval_at_saves` at every scheduled checkpoint; its metrics are logged and stored
        with a checkpoint saved at the same step (for `best_metric`). `probe(step, params)` (the
        role probes, train.probe) runs every `probe_every` steps and at every scheduled checkpoint;
        its metrics are logged only. Tokens
        and FLOPs are counted from each batch's shape, which may vary (length-grouped batches)."""
        started = time.perf_counter()
        state, position = self.restore_or_init()
        data = make_data(position)
        key = self.dropout_key()
        start = int(jax.device_get(state["step"]))
        # The flag `cli.run` also sets (in place here for callers other than the CLIs): read after
        # each step, which then saves a checkpoint and ends the loop.
        previous = signal.signal(signal.SIGTERM, cli.on_signal)
        writer = MetricsWriter(self.workdir, self.is_main, start)
        hooks = _Hooks(evaluate, eval_every, eval_at_saves, probe, probe_every)
        peak = peak_flops(jax.devices()[0])
        timings = {"setup_s": time.perf_counter() - started}
        window = _Window()
        last_metrics: dict[str, float] = {}
        last_good = max(self.checkpointer.steps(), default=None)
        step = start
        progress = tqdm(total=self.end, initial=start, desc="train", unit="step", disable=not self.is_main)
        reading = contextlib.ExitStack()
        try:
            while step < self.end:
                host_batch = next(data)
                seq_len = host_batch["input_ids"].shape[1]
                batch = sharding.global_batch(host_batch, self.mesh)
                state, metrics = self._step_fn(state, batch, key)
                step += 1
                tokens = self.loop.global_batch_size * seq_len
                window.add(metrics, tokens, flops_per_token(self.config, self.n_params, seq_len) * tokens)
                first = window.start is None
                if first or step % self.loop.log_every == 0 or step == self.end:
                    self._check_finite(state, last_good)
                    # The first step (a run's first point, or a resume's) compiles: logged without
                    # rates, and its time is kept out of the next window's.
                    last_metrics = window.means() if first else window.summary(self.loop.global_batch_size, peak)
                    if first:
                        timings["first_step_s"] = time.perf_counter() - started - timings["setup_s"]
                    writer.write(step, last_metrics)
                    progress.set_postfix(loss=f"{last_metrics['loss']:.3f}")
                    window.restart()
                last_good = self._after_step(step, state, data, key, hooks, writer, last_good)
                if first:
                    # From now on every step is followed by a read of the flag (SIGTERM's checkpoint),
                    # however long it takes; in the first, tracing and compiling, a signal is raised
                    # where it comes (`cli.GRACE_S`): no step since the last checkpoint is lost.
                    reading.enter_context(cli.reading_the_flag())
                progress.update(1)
                if self._preempted:
                    break
        finally:
            reading.close()
            progress.close()
            writer.close()
            signal.signal(signal.SIGTERM, previous)
            self.checkpointer.close()
        timings["total_s"] = time.perf_counter() - started
        return Outcome(step=step, preempted=self._preempted, metrics=last_metrics, timings=timings)
