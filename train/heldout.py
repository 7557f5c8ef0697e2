"""Held-out MLM and NSP metrics of a pre-training run, on text it never trains on.

The held-out corpora are prepared with the run's own data settings (sequence length, masking,
NSP) into `heldout-T<len>/` of the workdir; the evaluation set is the first `sequences` instances of
a fixed permutation with fixed masks (`PretrainingData` makes a batch a pure function of its
position and seed), so every checkpoint is scored on exactly the same masked tokens and role onset
can be read against learning.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
from jax.sharding import NamedSharding, PartitionSpec

from bertjax import sharding
from bertjax.errors import UserError
from train.config import CorpusConfig, HeldOutConfig
from train.data import PretrainingData, load_meta, num_examples
from train.losses import pretraining_sums


def check_disjoint(heldout: list[CorpusConfig], training: list[CorpusConfig]) -> None:
    """A held-out corpus that is, contains or lies inside a training corpus is trained on."""
    trained = [Path(c.path).resolve() for c in training if c.source == "local" and c.path]
    trained_hub = {(c.hub_id, c.hub_config, c.split) for c in training if c.source != "local"}
    for i, corpus in enumerate(heldout):
        if corpus.source != "local":
            if (corpus.hub_id, corpus.hub_config, corpus.split) in trained_hub:
                raise UserError(f"heldout.corpora.{i}: {corpus.hub_id} {corpus.split} is also a training corpus")
            continue
        path = Path(corpus.path).resolve()
        for other in trained:
            if path == other or path.is_relative_to(other) or other.is_relative_to(path):
                raise UserError(f"heldout.corpora.{i}: {corpus.path} overlaps the training corpus {other}")


def check_sequences(config: HeldOutConfig, data_dir: Path) -> None:
    """`heldout.sequences` against the prepared held-out data: checked as soon as it is prepared,
    before the run writes its config, tokenizer or checkpoint directory."""
    count = num_examples(load_meta(data_dir))
    if config.sequences < config.batch_size or config.sequences > count:
        raise UserError(
            f"heldout.sequences: {config.sequences} must lie in [heldout.batch_size {config.batch_size}, "
            f"the {count} instances of {data_dir}]"
        )


class HeldOutEvaluator:
    """The Trainer's `evaluate` hook: `heldout_mlm_{loss,accuracy}` of the params, and the pair
    task's (`heldout_nsp_*` or `heldout_sop_*`; none when MLM only, as in training)."""

    def __init__(self, config: HeldOutConfig, data_dir: Path, trainer, pair_task: str = "nsp") -> None:
        sharding.check_batch_size("heldout.batch_size", config.batch_size, trainer.mesh)
        data = PretrainingData(
            data_dir, config.batch_size, seed=config.seed, process_index=jax.process_index(),
            process_count=jax.process_count(), epochs=1,
        )  # fmt: skip
        check_sequences(config, data_dir)
        # Whole batches only, so the set is the same on any number of hosts.
        self.batches = [next(data) for _ in range(config.sequences // config.batch_size)]
        self.trainer = trainer
        replicated = NamedSharding(trainer.mesh, PartitionSpec())
        self.forward = jax.jit(
            lambda params, batch: pretraining_sums(trainer.model(params), batch), out_shardings=replicated
        )
        self.pair_task = pair_task
        self.seconds = 0.0

    def __call__(self, step: int, params: dict[str, jax.Array]) -> dict[str, float]:
        started = time.perf_counter()
        totals: dict[str, float] = {}
        for batch in self.batches:
            sums = jax.device_get(self.forward(params, sharding.global_batch(batch, self.trainer.mesh)))
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        self.seconds += time.perf_counter() - started
        masked, sequences = max(totals["masked"], 1.0), totals["sequences"]
        row = {
            "heldout_mlm_loss": totals["mlm_loss"] / masked,
            "heldout_mlm_accuracy": totals["mlm_hits"] / masked,
            "heldout_sequences": sequences,
        }
        if self.pair_task != "none":
            row[f"heldout_{self.pair_task}_loss"] = totals["pair_loss"] / sequences
            row[f"heldout_{self.pair_task}_accuracy"] = totals["pair_hits"] / sequences
        return row
