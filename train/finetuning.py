"""Fine-tuning, the library behind `python -m train.finetune`.

Fine-tunes BERT with a classifier on the pooled output on a GLUE task (QNLI, QQP, MRPC, SST-2),
starting from a bertjax pre-training run or a HF-format directory, with the pre-training `Trainer`.
Every epoch ends with an evaluation on the dev split (accuracy; F1 too for MRPC and QQP). The run
keeps the last checkpoint, the best by `best_metric` and, with `checkpoint.log_spaced=K`, K
log-spaced steps (as pre-training does), in the orbax layout of pre-training, so
`analysis.roles --ckpt DIR --step S` reads any of them and `analysis.track --run DIR` tracks them.
Re-running the same command resumes.

Outputs in the workdir: `checkpoints/`, `tokenizer/`, `metrics.jsonl` and `tensorboard/` (training
and `eval_*` curves), `eval.jsonl` (one row per evaluation), `eval.json` (the last evaluation, with
the best under `best`), `config.yaml`, `run.json`. With `--seeds K > 1`: one such run per seed in
`seed-<s>/` and their mean ± std in `seeds.json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bertjax import pretrained, runinfo, sharding
from bertjax import settings as config_lib
from bertjax.config import BertConfig
from bertjax.errors import UserError
from bertjax.glue import TaskSpec, classification_metrics, encode, glue_files, load_glue
from bertjax.model import BertForSequenceClassification
from train.checkpoints import check_resumable
from train.config import EVAL_SPLITS, CheckpointConfig, FinetuneConfig, LoopConfig, OptimizerConfig, task_spec
from train.glue_data import ClassificationData, eval_batches
from train.losses import classification_loss
from train.metrics import keep_rows_up_to
from train.pretraining import TOKENIZER_DIR, compute_dtype, write_tokenizer
from train.trainer import Trainer, check_batch

log = logging.getLogger(__name__)

EVAL_ROWS = "eval.jsonl"
EVAL_SUMMARY = "eval.json"
SEEDS_SUMMARY = "seeds.json"


def best_metric(config: FinetuneConfig, spec: TaskSpec) -> str:
    # TaskSpec lists accuracy first, then the task's GLUE metric where it has its own (F1).
    name = config.best_metric or spec.metrics[-1]
    if name not in spec.metrics:
        raise UserError(f"best_metric: {name!r} is not a metric of {spec.name} ({', '.join(spec.metrics)})")
    return name


class Evaluator:
    """The `evaluate` hook of the Trainer: a jitted forward of the trainer's params over every
    example of the split, metrics on host, one row appended to `eval.jsonl` per call."""

    def __init__(self, trainer: Trainer, arrays: dict[str, np.ndarray], spec: TaskSpec, split: str,
                 batch_size: int, batches_per_epoch: int):  # fmt: skip
        # Checked here, before training: the first evaluation comes after a whole epoch.
        sharding.check_batch_size("data.eval_batch_size", batch_size, trainer.mesh)
        self.trainer, self.arrays, self.spec, self.split = trainer, arrays, spec, split
        self.batch_size, self.batches_per_epoch = batch_size, batches_per_epoch
        replicated = NamedSharding(trainer.mesh, PartitionSpec())
        self.forward = jax.jit(
            lambda params, batch: (
                trainer.model(params)(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
            ),
            out_shardings=replicated,  # every host gets all logits
        )
        self.seconds = 0.0
        self.first = True

    def __call__(self, step: int, params: dict[str, jax.Array]) -> dict[str, float]:
        started = time.perf_counter()
        if self.first and self.trainer.is_main:
            # A resumed run's first evaluation is the first one after its checkpoint: the rows from
            # there on (and a line torn by the kill) came from the run killed before its next save.
            keep_rows_up_to(self.trainer.workdir / EVAL_ROWS, step - 1)
        self.first = False
        batches = eval_batches(self.arrays, self.batch_size, jax.process_index(), jax.process_count())
        logits = [jax.device_get(self.forward(params, sharding.global_batch(b, self.trainer.mesh))) for b in batches]
        labels = self.arrays["labels"]
        scores = classification_metrics(np.concatenate(logits)[: len(labels)], labels, self.spec.metrics)
        row = {"task": self.spec.name, "split": self.split, "step": step, "epoch": step // self.batches_per_epoch,
               "n_examples": len(labels), **scores}  # fmt: skip
        if self.trainer.is_main:
            path = self.trainer.workdir / EVAL_ROWS
            with runinfo.log_write(path, "the evaluation rows"), runinfo.open_append(path) as f:
                f.write(json.dumps(row) + "\n")
        log.info(
            "%s %s step %d: %s", self.spec.name, self.split, step, ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
        )
        self.seconds += time.perf_counter() - started
        return {f"eval_{k}": v for k, v in scores.items()}


def summarise_evaluations(workdir: Path, metric: str) -> dict[str, Any]:
    """eval.json's content: the last evaluation, plus the best by `metric` (ties: the later, as
    the checkpointer keeps)."""
    # A run resumed after a crash may evaluate a step twice (bit-identically): keep one row.
    rows = {}
    path = workdir / EVAL_ROWS
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            # Only a crash or a full disk in the middle of an append tears a line.
            raise UserError(
                f"{path}:{lineno}: not a JSON row (a write cut short?); delete that line and rerun"
            ) from None
        rows[row["step"]] = row
    last = rows[max(rows)]
    best = max(rows.values(), key=lambda r: (r[metric], r["step"]))
    return {**last, "best_metric": metric, "best": best}


# -- the run ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Prepared:
    """What every seed of a run shares: the checkpoint, the task, the model config, the tokenizer,
    the data."""

    source: pretrained.Checkpoint
    spec: TaskSpec
    metric: str
    model_config: BertConfig
    tokenizer: Any
    train_set: dict[str, np.ndarray]
    eval_set: dict[str, np.ndarray]
    data_files: list[dict[str, str]]
    seconds: float


# The splits an evaluation can score: GLUE's test labels are hidden.


def seed_runs(config: FinetuneConfig, workdir: Path) -> list[tuple[FinetuneConfig, Path]]:
    """Each seed's config and workdir: the run's own for one seed, `seed-<s>/` for several."""
    if config.seeds == 1:
        return [(config, workdir)]
    seeds = [config.train.seed + i for i in range(config.seeds)]
    return [
        (dataclasses.replace(config, seeds=1, train=dataclasses.replace(config.train, seed=s)), workdir / f"seed-{s}")
        for s in seeds
    ]


def check_settings(config: FinetuneConfig, workdir: Path, mesh: jax.sharding.Mesh) -> None:
    """Every setting that can be checked without the checkpoint or the data, and each seed's earlier
    run's settings, so that none is refused after the data is read and tokenized (the settings
    that need the model's config, `data.max_seq_length`'s bound and the vocabulary, come in
    `prepare`, before the data). The training steps depend on the data size, so the warm-up's
    length does too; its settings are checked here."""
    best_metric(config, task_spec(config.task))
    if not config.init:
        raise UserError("init: no checkpoint to fine-tune (--ckpt CKPT)")
    compute_dtype(config.dtype, "dtype")
    positive = (
        ("train.epochs", config.train.epochs),
        ("seeds", config.seeds),
        ("data.pad_multiple", config.data.pad_multiple),
        ("data.eval_batch_size", config.data.eval_batch_size),
        ("data.max_train_examples", 1 if config.data.max_train_examples is None else config.data.max_train_examples),
    )
    for name, value in positive:
        if value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")
    if config.checkpoint.log_spaced < 0:
        raise UserError(f"checkpoint.log_spaced must be at least 0, got {config.checkpoint.log_spaced}")
    if config.data.eval_split not in EVAL_SPLITS:
        raise UserError(
            f"data.eval_split: {config.data.eval_split!r} is not one of {', '.join(EVAL_SPLITS)} (test has no labels)"
        )
    if config.train.warmup_ratio is not None:
        if not 0 <= config.train.warmup_ratio <= 1:
            raise UserError(f"train.warmup_ratio must be in [0, 1], got {config.train.warmup_ratio}")
        if config.optimizer.warmup_steps or config.optimizer.warmup_fraction is not None:
            which = "warmup_steps" if config.optimizer.warmup_steps else "warmup_fraction"
            raise UserError(
                f"train.warmup_ratio and optimizer.{which} are both set; set train.warmup_ratio=null to use {which}"
            )
    loop = config.train
    # The trainer's own checks of its loop (batch, micro-batches, log interval, seed) and the mesh.
    check_batch(LoopConfig(steps=1, global_batch_size=loop.global_batch_size, grad_accum_steps=loop.grad_accum_steps,
                           seed=loop.seed, log_every=loop.log_every), mesh)  # fmt: skip
    sharding.check_batch_size("data.eval_batch_size", config.data.eval_batch_size, mesh)
    for one, directory in seed_runs(config, workdir):
        check_resumable(directory, dataclasses.asdict(one))


def prepare(config: FinetuneConfig, source: pretrained.Checkpoint) -> Prepared:
    """Reads the config and tokenizer of `source` (`config.init`, opened), checks the settings that
    need them, then reads and tokenizes the data (`check_settings` has checked the others)."""
    started = time.perf_counter()
    spec = task_spec(config.task)
    metric = best_metric(config, spec)
    model_config = pretrained.load_config(
        source, num_labels=spec.num_labels, dtype=compute_dtype(config.dtype, "dtype")
    )
    # Before the trainer traces a model of this config: a config.json claiming 100,000 layers over
    # 2 layers of weights kept it tracing for minutes before `from_pretrained` looked at them.
    pretrained.check_structure(source, model_config)
    tokenizer = pretrained.load_tokenizer(source)
    if len(tokenizer) != model_config.vocab_size:
        raise UserError(
            f"{config.init}: its tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
            f"{model_config.vocab_size}; the checkpoint and its tokenizer do not belong together"
        )
    length = config.data.max_seq_length
    if not 3 <= length <= model_config.max_position_embeddings:
        raise UserError(
            f"data.max_seq_length {length} is not in [3, {model_config.max_position_embeddings}] (the model's positions)"
        )

    glue_dir = Path(config.data.glue_dir) if config.data.glue_dir else None
    split = config.data.eval_split
    where = "the hub" if glue_dir is None else str(glue_dir)
    train = load_glue(spec.name, "train", glue_dir, config.data.max_train_examples, allow_empty=True)
    dev = load_glue(spec.name, split, glue_dir, allow_empty=True)
    for name, examples in (("train", train), (split, dev)):
        empty = sum(not (e.text_a.strip() and (e.text_b is None or e.text_b.strip())) for e in examples)
        if empty:
            log.warning(
                "%s %s: %d examples with an empty text, kept (as HF's run_glue keeps them)", spec.name, name, empty
            )
    files = (
        [] if glue_dir is None else glue_files(spec.name, "train", glue_dir) + glue_files(spec.name, split, glue_dir)
    )
    return Prepared(
        source=source,
        spec=spec,
        metric=metric,
        model_config=model_config,
        tokenizer=tokenizer,
        train_set=encode(train, tokenizer, length, f"{spec.name} train ({where})"),
        eval_set=encode(dev, tokenizer, length, f"{spec.name} {split} ({where})"),
        data_files=[{"path": str(p), "sha256": runinfo.input_sha256(p)} for p in files],
        seconds=time.perf_counter() - started,
    )


def finetune(
    config: FinetuneConfig, workdir: Path, prepared: Prepared, mesh: jax.sharding.Mesh
) -> dict[str, Any] | None:
    """One seed: trains `train.epochs` epochs in `workdir`; returns eval.json's content, or None
    when preempted (SIGTERM) before the end."""
    # `check_settings` has checked every setting (batches, optimizer, mesh, an earlier run's
    # settings) before the data was read: a bad one leaves no half-made workdir, nor rewrites a
    # run's config.yaml.
    run_config = dataclasses.asdict(config)
    loop = config.train
    data = ClassificationData(prepared.train_set, loop.global_batch_size, process_count=jax.process_count())
    steps = loop.epochs * data.batches_per_epoch
    optimizer = warmed_up(config, steps)
    trainer = Trainer(
        workdir=workdir,
        model_config=prepared.model_config,
        model_cls=BertForSequenceClassification,
        loss_fn=classification_loss,
        optimizer=optimizer,
        loop=trainer_loop(config, steps),
        checkpoint=kept_checkpoints(config, data.batches_per_epoch, prepared.metric),
        mesh=mesh,
        run_config=run_config,
        tokenizer=TOKENIZER_DIR,
        matmul_precision=config.matmul_precision,
        init=prepared.source,
    )

    def make_data(position):
        return ClassificationData(
            prepared.train_set,
            loop.global_batch_size,
            seed=loop.seed,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            position=position,
            group_by_length=config.data.group_by_length,
            pad_multiple=config.data.pad_multiple,
        )

    evaluator = Evaluator(trainer, prepared.eval_set, prepared.spec, config.data.eval_split,
                          config.data.eval_batch_size, data.batches_per_epoch)  # fmt: skip
    if jax.process_index() == 0:
        write_run_start(config, workdir, prepared.tokenizer, resumed=bool(trainer.checkpointer.steps()))
    log.info("%s: %d epochs × %d steps of %d from %s", prepared.spec.name, loop.epochs, data.batches_per_epoch,
             loop.global_batch_size, config.init)  # fmt: skip
    outcome = trainer.run(make_data, evaluate=evaluator, eval_every=data.batches_per_epoch)
    summary = None if outcome.preempted else summarise_evaluations(workdir, prepared.metric)
    if jax.process_index() == 0:
        if summary is not None:
            _write_json(workdir / EVAL_SUMMARY, summary)
        runinfo.write_run_json(
            workdir,
            {
                "config": run_config,
                "step": outcome.step,
                "preempted": outcome.preempted,
                "final_metrics": outcome.metrics,
                "eval": summary,
                "n_params": trainer.n_params,
                "n_train_examples": data.num_examples,
                "steps": steps,
                "warmup_steps": optimizer.warmup_steps,
                "data_files": prepared.data_files,
                "timings_s": {**outcome.timings, "data_s": prepared.seconds, "eval_s": evaluator.seconds},
            },
        )
    return summary


def warmed_up(config: FinetuneConfig, steps: int) -> OptimizerConfig:
    """The optimizer's settings, with `train.warmup_ratio` of the run's `steps` as its warm-up."""
    if config.train.warmup_ratio is None:
        return config.optimizer
    return dataclasses.replace(config.optimizer, warmup_steps=round(config.train.warmup_ratio * steps))


def trainer_loop(config: FinetuneConfig, steps: int) -> LoopConfig:
    """The trainer's loop: `steps` steps (the epochs' batches) from the checkpoint `init`."""
    loop = config.train
    return LoopConfig(
        steps=steps,
        global_batch_size=loop.global_batch_size,
        grad_accum_steps=loop.grad_accum_steps,
        seed=loop.seed,
        log_every=loop.log_every,
        init_from=config.init,
        init_step=config.init_step,
    )


def kept_checkpoints(config: FinetuneConfig, batches_per_epoch: int, metric: str) -> CheckpointConfig:
    """Saved at each epoch's end, right after its evaluation; kept: the last, the best by `metric`
    and the log-spaced steps."""
    return CheckpointConfig(
        every=batches_per_epoch, keep=1, log_spaced=config.checkpoint.log_spaced, best_metric=f"eval_{metric}"
    )


def write_run_start(config: FinetuneConfig, workdir: Path, tokenizer: Any, resumed: bool) -> None:
    """The workdir, its resolved config.yaml and the tokenizer (a resumed run's kept), before the
    first step."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_lib.save_resolved(config, workdir / "config.yaml")
    write_tokenizer(tokenizer, workdir / TOKENIZER_DIR, resumed)


def summarise_seeds(task: str, seeds: list[int], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± sample std (ddof 1) over seeds of the last and of the best evaluation."""
    names = [k for k in ("accuracy", "f1", "loss") if k in summaries[0]]
    out: dict[str, Any] = {"task": task, "split": summaries[0]["split"], "n_examples": summaries[0]["n_examples"],
                           "best_metric": summaries[0]["best_metric"], "seeds": seeds}  # fmt: skip
    for which in ("last", "best"):
        rows = [s if which == "last" else s["best"] for s in summaries]
        out[which] = {}
        for name in names:
            values = [float(r[name]) for r in rows]
            out[which][name] = {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)), "values": values}
    return out


def run(config: FinetuneConfig, workdir: Path) -> dict[str, Any] | None:
    """Fine-tunes `config.seeds` seeds; returns eval.json's content (one seed) or seeds.json's,
    or None when preempted."""
    workdir = Path(workdir)
    # One run writes a workdir, as in train.pretrain; process 0 writes, the others only read.
    with runinfo.one_writer(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return _run(config, workdir)


def _run(config: FinetuneConfig, workdir: Path) -> dict[str, Any] | None:
    mesh = sharding.make_mesh(config.mesh)
    check_settings(config, workdir, mesh)
    # The one opening of `init`, a text of the config: every seed's model config, tokenizer and
    # initial params come from this handle (a resumed run reads its config and tokenizer too).
    prepared = prepare(config, pretrained.open_checkpoint(config.init, config.init_step))
    if config.seeds == 1:
        return finetune(config, workdir, prepared, mesh)
    workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        config_lib.save_resolved(config, workdir / "config.yaml")
    runs = seed_runs(config, workdir)
    summaries = []
    for one, directory in runs:
        summary = finetune(one, directory, prepared, mesh)
        if summary is None:
            return None
        summaries.append(summary)
    result = summarise_seeds(prepared.spec.name, [one.train.seed for one, _ in runs], summaries)
    if jax.process_index() == 0:
        _write_json(workdir / SEEDS_SUMMARY, result)
    return result


def _write_json(path: Path, content: dict[str, Any]) -> None:
    with runinfo.atomic_file(path, overwrite=True) as f:
        f.write(json.dumps(content, indent=2) + "\n")


def describe(result: dict[str, Any]) -> str:
    """One line for the terminal: the last (and best) evaluation, or mean ± std over seeds."""
    head = f"{result['task']} {result['split']} ({result['n_examples']} examples)"
    if "seeds" in result:
        parts = [f"{which} {name} {m['mean']:.4f} ± {m['std']:.4f}"
                 for which in ("last", "best") for name, m in result[which].items() if name != "loss"]  # fmt: skip
        return f"{head} over seeds {result['seeds']}: " + ", ".join(parts)
    metric = result["best_metric"]
    scores = ", ".join(f"{k} {result[k]:.4f}" for k in ("accuracy", "f1") if k in result)
    return f"{head} at step {result['step']}: {scores}; best {metric} {result['best'][metric]:.4f} at step {result['best']['step']}"
