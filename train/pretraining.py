"""Pre-training BERT (MLM + NSP) with LAMB: the library behind `python -m train.pretrain`.

Phase 1 runs `train.steps` at `data.max_seq_length`; an optional phase 2 (BERT's recipe: a short
phase at T = 512) continues from phase 1's last params with its own data, batch size and
learning-rate schedule, in the same workdir and step count. Re-running the same command resumes
from the latest checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import jax

from bertjax import pretrained, runinfo, sharding
from bertjax import settings as config_lib
from bertjax.config import BertConfig, preset
from bertjax.errors import UserError
from bertjax.model import BertForPreTraining
from train.checkpoints import check_resumable, saved_steps, setting_changes
from train.config import LoopConfig, ModelSettings, OptimizerConfig, PrepareConfig, PretrainConfig
from train.corpora import corpus_files
from train.data import PretrainingData, load_meta, num_examples
from train.heldout import HeldOutEvaluator, check_disjoint, check_sequences, check_shared
from train.interventions import Interventions
from train.interventions import check_config as check_interventions
from train.losses import pretraining_loss
from train.prepare import prepare
from train.probe import ProbeSet, RoleProbe, check_config, read_probe_set
from train.trainer import Outcome, Trainer, check_batch

log = logging.getLogger(__name__)

TOKENIZER_DIR = "tokenizer"


DTYPES = ("auto", "float32", "bfloat16", "float16")


def compute_dtype(setting: str, name: str = "model.dtype") -> str:
    """The compute dtype `setting` (the config key `name`) asks for; "auto": bfloat16 on GPU/TPU,
    float32 on CPU. Anything else was a JAX traceback once the data was prepared."""
    if setting not in DTYPES:
        raise UserError(f"{name}: {setting!r} is not one of {', '.join(DTYPES)}")
    if setting != "auto":
        return setting
    return "float32" if jax.devices()[0].platform == "cpu" else "bfloat16"


# Settings that change how the shards are made or cut, not what they hold: parallel segmentation
# gives the serial sentences, and the iterator numbers rows across shard boundaries.
LAYOUT_ONLY = ("segment_workers", "shard_size")


def prepared_data(config: PrepareConfig, directory: Path, explicit: str | None) -> Path:
    """The prepared shards: `explicit` if given, else prepared once into `directory`, and reused
    there only if they were prepared with the same data settings."""
    if explicit:
        load_meta(Path(explicit))
        return Path(explicit)
    if (directory / "meta.json").is_file():
        check_prepared_with(config, directory)
        return directory
    if jax.process_index() == 0:
        prepare(config, directory)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("prepared data")
    return directory


def check_prepared_with(config: PrepareConfig, directory: Path) -> None:
    """Shards prepared under other settings (whole-word masking, corpora, the prediction cap, …)
    would train silently on the old data: refuse them, naming what differs."""
    meta = load_meta(directory)
    differ = setting_changes(meta.get("config"), dataclasses.asdict(config), ignore=LAYOUT_ONLY)
    differ += changed_corpus_files(meta)
    if differ:
        raise UserError(
            f"{directory}: prepared with other data settings ({'; '.join(differ)}); delete it to prepare "
            "again, or set data_dir to shards prepared with these settings"
        )


def changed_corpus_files(meta: dict[str, Any]) -> list[str]:
    """The local corpus files that are not, by their list and sizes, those the shards were prepared
    from: a corpus rewritten at the same path (a new vocabulary of the same size with it) was
    trained on as the old text. Sizes, not hashes, so that a resume does not read the corpora
    again; a corpus not present here (shards prepared on another machine) is not compared."""
    changed = []
    for corpus in meta.get("corpora") or []:
        root = Path(str(corpus.get("path")))
        if corpus.get("source") != "local" or "files" not in corpus or not root.exists():
            continue
        then = {f["path"]: f["bytes"] for f in corpus["files"]}
        now = {str(f): f.stat().st_size for f in corpus_files(root)}
        changed += [
            f"{path}: {_size(then.get(path))} then, {_size(now.get(path))} now"
            for path in sorted(then.keys() | now.keys())
            if then.get(path) != now.get(path)
        ]
    return changed


def _size(count: int | None) -> str:
    return "absent" if count is None else f"{count} bytes"


def check_batch_fits(setting: str, batch_size: int, data_dir: Path) -> None:
    """A batch larger than the prepared data cannot make a step: refused as soon as the count is
    known, before the tokenizer, the resolved config or the checkpoint directory is written."""
    count = num_examples(load_meta(data_dir))
    if batch_size > count:
        raise UserError(
            f"{setting}: {batch_size} exceeds the {count} sequences prepared in {data_dir}; "
            "lower it, or give the run more text"
        )


def model_config(settings: ModelSettings, vocab_size: int) -> BertConfig:
    shape = {
        key: value
        for key in ("num_hidden_layers", "hidden_size", "num_attention_heads")
        if (value := getattr(settings, key)) is not None
    }
    for key, value in shape.items():
        if value < 1:
            raise UserError(f"model.{key}: must be at least 1, got {value}")
    if "hidden_size" in shape:
        shape["intermediate_size"] = 4 * shape["hidden_size"]
    return preset(
        settings.preset,
        **shape,
        vocab_size=vocab_size,
        max_position_embeddings=settings.max_position_embeddings,
        hidden_dropout_prob=settings.hidden_dropout_prob,
        attention_probs_dropout_prob=settings.attention_probs_dropout_prob,
        layer_norm_position=settings.layer_norm_position,
        position_embedding_init=settings.position_embedding_init,
        dtype=compute_dtype(settings.dtype),
    )


def make_tokenizer(data_dir: Path, lowercase: bool):
    # transformers 5's BertTokenizer is the fast (Rust) one; it takes the vocabulary as `vocab`
    # and silently ignores the old `vocab_file` keyword (leaving only the special tokens).
    from transformers import BertTokenizer

    return BertTokenizer(vocab=str(data_dir / "vocab.txt"), do_lower_case=lowercase)


def save_tokenizer(data_dir: Path, lowercase: bool, workdir: Path, resumed: bool) -> None:
    target = workdir / TOKENIZER_DIR
    if jax.process_index() == 0:
        vocab_file = data_dir / "vocab.txt"
        tokenizer = make_tokenizer(data_dir, lowercase)
        expected = len(vocab_file.read_text(encoding="utf-8").splitlines())
        if len(tokenizer) != expected:
            raise RuntimeError(f"{vocab_file}: tokenizer has {len(tokenizer)} tokens, the file {expected}")
        write_tokenizer(tokenizer, target, resumed)


def write_tokenizer(tokenizer, target: Path, resumed: bool) -> None:
    """The run's tokenizer at `target` (the workdir's `tokenizer`). A resumed run keeps the one its
    checkpoints were trained with; any other writes its own over what a re-used workdir holds:
    another run's vocabulary of the same size is told apart by nothing else, and every analysis
    of the run reads this one. `tokenizer.save_pretrained` goes into a new directory of its own,
    renamed to `target` once whole, so that nothing planted at a fixed name in the workdir (a
    link) is written into. A full disk is one line."""
    if resumed and target.is_dir():
        return
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tokenizer.save_pretrained(str(partial))
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            log.warning("replacing %s, left in the workdir by an earlier run, with this run's tokenizer", target)
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            target.rename(aside / target.name)
            shutil.rmtree(aside)
        partial.rename(target)
    except BaseException as e:
        shutil.rmtree(partial, ignore_errors=True)
        reason = runinfo.no_space(e)
        if reason is not None:
            raise UserError(f"no space left writing the tokenizer into {target} ({reason}); make room and run the "
                            "same command again") from None  # fmt: skip
        raise


def run(config: PretrainConfig, workdir: Path, prepare_only: bool = False) -> dict[str, Any]:
    """Runs every phase not yet finished in `workdir`; returns the last phase's outcome. With
    `prepare_only`, prepares each phase's shards (and held-out shards) into `workdir` and stops: a
    machine with spaCy prepares what a machine without it then trains on, at the same `workdir`
    path (the held-out settings name the vocabulary by its absolute path)."""
    if config.distributed:
        jax.distributed.initialize()
    workdir = Path(workdir)
    # Process 0 writes the workdir; the others only read what it wrote.
    with runinfo.one_writer(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return _run(config, workdir, prepare_only)


def shares_shards(config: PretrainConfig) -> bool:
    """Whether phase 2 trains on phase 1's shards: prepared at its length into the same directory."""
    p2 = config.phase2
    return p2 is not None and not config.data_dir and p2.max_seq_length == config.data.max_seq_length


def check_settings(config: PretrainConfig, workdir: Path, mesh: jax.sharding.Mesh) -> None:
    """Every setting that can be checked without the data, phase 2's included, so that none is
    refused after the data is prepared or phase 1 has trained. (The data settings are checked
    where the data is prepared, before it is read: shards prepared elsewhere may be trained on
    where the corpora are not.)"""
    if config.train.steps < 1:
        raise UserError(f"train.steps must be at least 1, got {config.train.steps}")
    model = model_config(config.model, config.data.vocab_size)  # BertConfig checks the model's settings
    check_interventions(config.intervene, model.num_hidden_layers, model.num_attention_heads)
    lengths = [("data.max_seq_length", config.data.max_seq_length)]
    check_batch(config.train, mesh)
    p2 = config.phase2
    if p2 is not None:
        for key in ("steps", "global_batch_size"):
            if getattr(p2, key) < 1:
                raise UserError(f"phase2.{key} must be at least 1, got {getattr(p2, key)}")
        if not 5 <= p2.max_seq_length <= 32767:
            raise UserError(f"phase2.max_seq_length: must be in [5, 32767], got {p2.max_seq_length}")
        if not 1 <= p2.max_predictions_per_seq <= p2.max_seq_length:
            raise UserError(
                f"phase2.max_predictions_per_seq: must be in [1, phase2.max_seq_length {p2.max_seq_length}], "
                f"got {p2.max_predictions_per_seq}"
            )
        if not (math.isfinite(p2.learning_rate) and p2.learning_rate >= 0):
            raise UserError(f"phase2.learning_rate: must be a finite number ≥ 0, got {p2.learning_rate}")
        if p2.warmup_steps < 0:
            raise UserError(f"phase2.warmup_steps: must be ≥ 0, got {p2.warmup_steps}")
        check_batch(dataclasses.replace(config.train, global_batch_size=p2.global_batch_size), mesh,
                    "phase2.global_batch_size")  # fmt: skip
        lengths.append(("phase2.max_seq_length", p2.max_seq_length))
        if shares_shards(config) and p2.max_predictions_per_seq != config.data.max_predictions_per_seq:
            raise UserError(
                f"phase2.max_predictions_per_seq: {p2.max_predictions_per_seq} is not data.max_predictions_per_seq "
                f"{config.data.max_predictions_per_seq}, but both phases prepare into "
                f"{workdir / f'data-T{config.data.max_seq_length}'}; make them equal or give phase 2 another max_seq_length"
            )
    for name, length in lengths:
        if length > model.max_position_embeddings:
            raise UserError(f"{name} {length} exceeds model.max_position_embeddings {model.max_position_embeddings}")
    check_config(config.probe, config.model.max_position_embeddings)


class Phase(NamedTuple):
    """One phase's settings: its data, loop and optimizer, and its shards if prepared elsewhere."""

    data: PrepareConfig
    loop: LoopConfig
    optimizer: OptimizerConfig
    data_dir: str | None


class PhaseData(NamedTuple):
    """Where a phase's shards and held-out shards are, and the data settings they were made with."""

    data_dir: Path
    heldout_dir: Path | None
    data: PrepareConfig


def _run(config: PretrainConfig, workdir: Path, prepare_only: bool) -> dict[str, Any]:
    mesh = sharding.make_mesh(config.mesh)
    check_settings(config, workdir, mesh)
    # The one opening of `train.init_from`, a text of the config, handed to phase 1's trainer, and
    # only where no step is saved: a run that resumes never reads it. Its config is checked against
    # its weights before any data is prepared (`from_pretrained` would, after the data and the trainer).
    init = None
    if config.train.init_from and not saved_steps(workdir):
        init = pretrained.open_checkpoint(config.train.init_from, config.train.init_step)
        pretrained.check_structure(init, init.config)
    p1, p2 = config.data, config.phase2
    check_disjoint(config.heldout.corpora, p1.corpora)
    run_config = dataclasses.asdict(config)
    check_resumable(workdir, run_config)
    workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        log.info(
            "%s a %s BERT for %d steps of %d sequences (T = %d%s) into %s",
            "preparing the data to pre-train" if prepare_only else "pre-training", config.model.preset, config.train.steps, config.train.global_batch_size, p1.max_seq_length,
            "" if p2 is None else f", then {p2.steps} at T = {p2.max_seq_length}", workdir,
        )  # fmt: skip
    phases = phase_settings(config)
    # Read and parsed once, before any data is prepared; encoded once the tokenizer exists.
    probe_set = read_probe_set(config.probe) if config.probe.task else None
    prepared = prepare_phases(config, phases, workdir)
    if jax.process_index() == 0:
        # Once the data is known to fit: a refused run writes nothing else.
        config_lib.save_resolved(config, workdir / "config.yaml")
    if prepare_only:
        return {}
    outcome = train_phases(config, workdir, mesh, run_config, phases, prepared, probe_set, init)
    return {} if outcome is None else dataclasses.asdict(outcome)


def phase_settings(config: PretrainConfig) -> list[Phase]:
    """Phase 1's settings, then phase 2's: phase 1's with its own length, prediction cap, steps,
    batch and schedule, from phase 1's last params (not `train.init_from`)."""
    phases = [Phase(config.data, config.train, config.optimizer, config.data_dir)]
    p2 = config.phase2
    if p2 is not None:
        data2 = dataclasses.replace(
            config.data, max_seq_length=p2.max_seq_length, max_predictions_per_seq=p2.max_predictions_per_seq
        )
        loop2 = dataclasses.replace(
            config.train, steps=p2.steps, global_batch_size=p2.global_batch_size, init_from=None
        )
        opt2 = dataclasses.replace(
            config.optimizer, learning_rate=p2.learning_rate, warmup_steps=p2.warmup_steps, warmup_fraction=None
        )
        phases.append(Phase(data2, loop2, opt2, None))
    return phases


def prepare_phases(config: PretrainConfig, phases: list[Phase], workdir: Path) -> list[PhaseData]:
    """Every phase's data (and held-out data), prepared and checked before any training, so that a
    setting that does not fit phase 2 is refused now rather than after phase 1's hours."""
    prepared: list[PhaseData] = []
    for index, (data_config, loop, _, explicit_dir) in enumerate(phases, start=1):
        if prepared and shares_shards(config):
            # Phase 2 at phase 1's length and prediction cap trains on phase 1's shards (with its
            # vocabulary and held-out data): prepared again, they would be the same.
            check_batch_fits("phase2.global_batch_size", loop.global_batch_size, prepared[0].data_dir)
            prepared.append(prepared[0])
            continue
        if prepared and data_config.train_vocab:
            # A later phase tokenises with the first phase's trained vocabulary: trained again, it
            # would number the tokens otherwise (or hold others) under the same embeddings.
            first_vocab = str((prepared[0].data_dir / "vocab.txt").resolve())
            data_config = dataclasses.replace(data_config, vocab_file=first_vocab, train_vocab=False)
        data_dir = prepared_data(data_config, workdir / f"data-T{data_config.max_seq_length}", explicit_dir)
        check_batch_fits(
            "train.global_batch_size" if index == 1 else "phase2.global_batch_size", loop.global_batch_size, data_dir
        )
        heldout_dir = None
        if config.heldout.corpora:
            # The training data's own vocabulary, trained or copied, so both tokenise alike; by its
            # absolute path, so a resume from another working directory finds the same settings.
            vocab = str((data_dir / "vocab.txt").resolve())
            heldout_data = dataclasses.replace(
                data_config, corpora=config.heldout.corpora, vocab_file=vocab, train_vocab=False
            )
            heldout_dir = prepared_data(heldout_data, workdir / f"heldout-T{data_config.max_seq_length}", None)
            check_sequences(config.heldout, heldout_dir)
        elif config.heldout.data_dir:
            heldout_dir = Path(config.heldout.data_dir)
            check_shared(heldout_dir, data_dir, data_config.pair_task)
            check_sequences(config.heldout, heldout_dir)
        prepared.append(PhaseData(data_dir, heldout_dir, data_config))
    return prepared


def train_phases(
    config: PretrainConfig,
    workdir: Path,
    mesh: jax.sharding.Mesh,
    run_config: dict[str, Any],
    phases: list[Phase],
    prepared: list[PhaseData],
    probe_set: ProbeSet | None,
    init: pretrained.Checkpoint | None = None,
) -> Outcome | None:
    """Trains every phase not yet finished, writing run.json after each; returns the last phase's
    outcome (None when every phase had finished before). `init`: `train.init_from` opened, where
    phase 1 starts from it."""
    start, outcome = 0, None
    probe_sequences = None
    for index, (phase_data, phase) in enumerate(zip(prepared, phases, strict=True), start=1):
        data_dir, heldout_dir, data_config = phase_data
        meta = load_meta(data_dir)
        trainer = phase_trainer(config, phase, data_config, meta["vocab_size"], workdir, mesh, run_config, start,
                                init if index == 1 else None)  # fmt: skip
        save_tokenizer(data_dir, data_config.lowercase, workdir, resumed=bool(trainer.checkpointer.steps()))
        start = trainer.end
        if index < len(phases) and max(trainer.checkpointer.steps(), default=-1) > trainer.end:
            continue  # a later phase has started: this one finished in an earlier invocation

        def make_data(position, loop=phase.loop, data_dir=data_dir):
            return PretrainingData(
                data_dir,
                loop.global_batch_size,
                seed=loop.seed,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
                position=position,
            )

        evaluator = (
            None
            if heldout_dir is None
            else HeldOutEvaluator(config.heldout, heldout_dir, trainer, data_config.pair_task)
        )

        probe = None
        if probe_set is not None:
            if probe_sequences is None:
                tokenizer = make_tokenizer(data_dir, data_config.lowercase)
                probe_sequences = probe_set.encode(tokenizer, config.probe.max_length)
            probe = RoleProbe(config.probe, probe_sequences, trainer)

        log.info("phase %d: steps %d → %d, T = %d", index, trainer.start, trainer.end, meta["max_seq_length"])
        outcome = trainer.run(
            make_data,
            evaluate=evaluator,
            eval_every=config.heldout.every,
            eval_at_saves=True,
            probe=probe,
            probe_every=config.probe.every,
        )
        if jax.process_index() == 0:
            runinfo.write_run_json(workdir, phase_record(run_config, index, outcome, trainer, evaluator, probe))
        if outcome.preempted:
            break
    return outcome


def phase_trainer(
    config: PretrainConfig,
    phase: Phase,
    data_config: PrepareConfig,
    vocab_size: int,
    workdir: Path,
    mesh: jax.sharding.Mesh,
    run_config: dict[str, Any],
    start_step: int = 0,
    init: pretrained.Checkpoint | None = None,
) -> Trainer:
    """The trainer of `phase` on data prepared with `data_config` (a vocabulary of `vocab_size`),
    from step `start_step`: the model, the pre-training loss with the `intervene` section's
    penalties, the phase's optimizer and loop. One place, so that `benchmarks.intervene_cost` times
    the step a run compiles."""
    model = model_config(config.model, vocab_size)
    steerings = check_interventions(config.intervene, model.num_hidden_layers, model.num_attention_heads)
    interventions = Interventions(tuple(steerings)) if steerings else None
    return Trainer(
        workdir=workdir,
        model_config=model,
        model_cls=BertForPreTraining,
        loss_fn=functools.partial(pretraining_loss, pair_task=data_config.pair_task, interventions=interventions),
        optimizer=phase.optimizer,
        loop=phase.loop,
        checkpoint=config.checkpoint,
        mesh=mesh,
        run_config=run_config,
        tokenizer=TOKENIZER_DIR,
        start_step=start_step,
        matmul_precision=config.model.matmul_precision,
        init=init,
    )


def phase_record(
    run_config: dict[str, Any],
    index: int,
    outcome: Outcome,
    trainer: Trainer,
    evaluator: HeldOutEvaluator | None,
    probe: RoleProbe | None,
) -> dict[str, Any]:
    """run.json's content after phase `index`."""
    return {
        "config": run_config,
        "phase": index,
        "step": outcome.step,
        "preempted": outcome.preempted,
        "final_metrics": outcome.metrics,
        "n_params": trainer.n_params,
        "timings_s": outcome.timings
        | ({"heldout_eval_s": evaluator.seconds} if evaluator else {})
        | ({"probe_s": probe.seconds} if probe else {}),
    }
