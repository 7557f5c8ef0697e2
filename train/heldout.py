"""Held-out MLM and NSP metrics of a pre-training run, on text it never trains on.

The held-out corpora are prepared with the run's own data settings (sequence length, masking,
NSP) into `heldout-T<len>/` of the workdir, or `heldout.data_dir` names a folder prepared before
(one set shared by runs of other recipes, checked for the run's vocabulary and length); the
evaluation set is the first `sequences` instances of a fixed permutation with fixed masks
(`PretrainingData` makes a batch a pure function of its position and seed), so every checkpoint is
scored on exactly the same masked tokens and role onset can be read against learning.

Each evaluation also writes its per-sequence sums (`SEQUENCES_DIR`), the same sequences in the same
order every time, so that analyses can resample held-out sequences, paired across evaluations.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bertjax import runinfo, sharding
from bertjax.errors import UserError
from train.config import CorpusConfig, HeldOutConfig
from train.corpora import file_sha256, validate_corpus
from train.data import PretrainingData, load_meta, num_examples
from train.losses import batch_sums, pretraining_terms, sequence_sums

log = logging.getLogger(__name__)

SEQUENCES_DIR = "heldout-sequences"


def check_disjoint(heldout: list[CorpusConfig], training: list[CorpusConfig]) -> None:
    """A held-out corpus that is, contains or lies inside a training corpus is trained on. Each
    held-out corpus is checked first, under its own name: one without its path was a TypeError."""
    trained = [Path(c.path).resolve() for c in training if c.source == "local" and c.path]
    trained_hub = {(c.hub_id, c.hub_config, c.split) for c in training if c.source != "local"}
    for i, corpus in enumerate(heldout):
        validate_corpus(corpus, f"heldout.corpora.{i}")
        if corpus.source != "local":
            if (corpus.hub_id, corpus.hub_config, corpus.split) in trained_hub:
                raise UserError(f"heldout.corpora.{i}: {corpus.hub_id} {corpus.split} is also a training corpus")
            continue
        assert corpus.path is not None  # validate_corpus refused a local corpus without one
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


def shared_sources(held: dict, trained: dict) -> list[str]:
    """What two prepared folders' metas (`corpora`, as `train.corpora.describe` records them) both
    hold: a local file by content (digest: a folder prepared elsewhere records other paths for the
    same text), a hub corpus by id, config and split. Text copied into a file of other content is
    not found: the check is of sources, not of sentences."""
    trained_files = {f["sha256"]: f["path"] for c in trained["corpora"] for f in c.get("files", [])}
    trained_hub = {(c["hub_id"], c["hub_config"], c["split"]) for c in trained["corpora"] if c["source"] != "local"}
    found: list[str] = []
    for corpus in held["corpora"]:
        if corpus["source"] != "local":
            if (corpus["hub_id"], corpus["hub_config"], corpus["split"]) in trained_hub:
                found.append(f"{corpus['hub_id']} {corpus['split']} is also a training corpus")
            continue
        found += [
            f"{f['path']} has the content of the training file {trained_files[f['sha256']]}"
            for f in corpus.get("files", [])
            if f["sha256"] in trained_files
        ]
    return found


def check_shared(heldout_dir: Path, data_dir: Path, pair_task: str) -> None:
    """`heldout.data_dir` against the shards a phase trains on: the same vocabulary (by digest:
    other ids would be other words) and sequence length, and none of its sources trained on.
    Another pair task than the phase's is no mismatch: the MLM terms need none of its labels, and
    only they are scored (`HeldOutEvaluator`)."""
    held, trained = load_meta(heldout_dir), load_meta(data_dir)
    length = trained["max_seq_length"]
    if held["max_seq_length"] != length:
        raise UserError(
            f"heldout.data_dir: {heldout_dir} was prepared at max_seq_length {held['max_seq_length']}, the run "
            f"trains at {length}; give it a held-out folder prepared at {length}"
        )
    vocab_file = data_dir / trained["vocab_file"]
    if file_sha256(heldout_dir / held["vocab_file"]) != file_sha256(vocab_file):
        raise UserError(
            f"heldout.data_dir: {heldout_dir} was prepared with another vocabulary than the run's {vocab_file}; "
            f"prepare it with vocab_file={vocab_file}"
        )
    trained_on = shared_sources(held, trained)
    if trained_on:
        raise UserError(f"heldout.data_dir: {heldout_dir} holds text the run trains on: {trained_on[0]}")
    if held["pair_task"] != pair_task:
        log.info(
            "held-out set %s was prepared with pair task %s, the run trains with %s: only the held-out MLM loss "
            "and accuracy are evaluated on it", heldout_dir, held["pair_task"], pair_task,
        )  # fmt: skip


class HeldOutEvaluator:
    """The Trainer's `evaluate` hook: `heldout_mlm_{loss,accuracy}` of the params, and the pair
    task's (`heldout_nsp_*` or `heldout_sop_*`; none when MLM only, as in training, or when the
    held-out set was prepared for another pair task: its labels are not the run's task)."""

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
        self.forward = jax.jit(self._sums, out_shardings=replicated)
        self.pair_task = pair_task if data.meta["pair_task"] == pair_task else "none"
        self.seconds = 0.0

    def _sums(self, params, batch):
        # One forward pass for both; the metrics are read from the batch sums, as they were before
        # the per-sequence sums were kept (fused beside them, a total can move in its last float32 bits).
        terms = pretraining_terms(self.trainer.model(params), batch)
        return batch_sums(terms), sequence_sums(terms)

    def __call__(self, step: int, params: dict[str, jax.Array]) -> dict[str, float]:
        started = time.perf_counter()
        totals: dict[str, float] = {}
        parts: dict[str, list[np.ndarray]] = {}
        for batch in self.batches:
            sums, per_sequence = jax.device_get(self.forward(params, sharding.global_batch(batch, self.trainer.mesh)))
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + float(value)
            for key, value in per_sequence.items():
                parts.setdefault(key, []).append(value)
        if self.trainer.is_main:
            self._write_sequences(step, {key: np.concatenate(values) for key, values in parts.items()})
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

    def _write_sequences(self, step: int, sums: dict[str, np.ndarray]) -> None:
        """`heldout-sequences/step-<step>.npz`: each sequence's summed MLM loss (float32) and its
        hits and masked count (int32, counts summed exactly in float32), and the pair task's loss
        and hit when it is on. Replaced whole: a resumed run evaluates again the steps after its
        checkpoint, some of which it may have written before."""
        arrays = {
            "mlm_loss": sums["mlm_loss"].astype(np.float32),
            "mlm_hits": sums["mlm_hits"].astype(np.int32),
            "masked": sums["masked"].astype(np.int32),
        }
        if self.pair_task != "none":
            arrays["pair_loss"] = sums["pair_loss"].astype(np.float32)
            arrays["pair_hits"] = sums["pair_hits"].astype(np.int32)
        path = self.trainer.workdir / SEQUENCES_DIR / f"step-{step:09d}.npz"
        with runinfo.log_write(path, "the held-out sequences' sums"):
            path.parent.mkdir(exist_ok=True)
            with runinfo.atomic_file(path, binary=True, overwrite=True) as f:
                # The counts compress: 2.3 kB, not 6.9, for 512 sequences. (numpy's stub lets a
                # mapping's values stand for allow_pickle too; these are all arrays.)
                np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
