"""The training-side iterator over prepared shards (see `train.prepare`).

Deterministic: epoch e visits the examples in the order of a permutation seeded by (seed, e);
batch i of epoch e is masked (dynamic masking) with a generator seeded by (seed, e, i, process).
So a batch depends only on its position `{"epoch": e, "index": i}`, which is all a checkpoint has
to keep for an exact resume. Each global batch is split into `process_count` disjoint slices, one
per host; the remainder of an epoch that does not fill a global batch is skipped, so every host
sees the same number of batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bertjax.errors import UserError
from train.instances import MaskingSpec, mask_batch

SHARD_KEYS = ("input_ids", "token_type_ids", "lengths", "nsp_labels")
STATIC_KEYS = ("masked_positions", "masked_ids")
# Leading words that keep the two generators' seeds apart: SeedSequence pads short entropy with
# zeros, so [seed, epoch] and [seed, epoch, 0, 0] would otherwise be the same stream.
_PERMUTATION, _MASKING = 1, 2


def load_meta(data_dir: Path) -> dict[str, Any]:
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise UserError(f"{data_dir}: not a prepared data directory (no meta.json)")
    return json.loads(path.read_text())


def num_examples(meta: dict[str, Any]) -> int:
    """The number of sequences a prepared directory holds, from its `load_meta`."""
    return sum(int(shard["count"]) for shard in meta["shards"])


class EpochBatches:
    """The position bookkeeping of a deterministic, resumable batch iterator: batch `index` of
    epoch `epoch`, in `batches_per_epoch` batches an epoch, forever or for `epochs` epochs.

    A subclass sets `batches_per_epoch` and `epochs`, implements `batch(epoch, index)` as a pure
    function of the position, and calls `_start(position)` at the end of its `__init__`.
    """

    batches_per_epoch: int
    epochs: int | None = None

    def _start(self, position: dict[str, int] | None) -> None:
        self._epoch, self._index = 0, 0
        if position is not None:
            self._restore(position)

    @property
    def position(self) -> dict[str, int]:
        """Where the next batch comes from; JSON-able, for the training checkpoint."""
        return {"epoch": self._epoch, "index": self._index}

    def _restore(self, position: dict[str, int]) -> None:
        try:
            epoch, index = int(position["epoch"]), int(position["index"])
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"data position {position!r}: needs integer epoch and index") from e
        if epoch < 0 or not 0 <= index <= self.batches_per_epoch:
            raise UserError(
                f"data position {position!r}: out of range for {self.batches_per_epoch} "
                f"batches per epoch of {self.describe()}"
            )
        self._epoch, self._index = epoch, index

    def describe(self) -> str:
        """The data, as named in errors."""
        return type(self).__name__

    def batch(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._index >= self.batches_per_epoch:
            self._epoch, self._index = self._epoch + 1, 0
        if self.epochs is not None and self._epoch >= self.epochs:
            raise StopIteration
        batch = self.batch(self._epoch, self._index)
        self._index += 1
        return batch


class PretrainingData(EpochBatches):
    """Yields dict batches of `global_batch_size // process_count` examples, forever or for
    `epochs` epochs:

    `input_ids`, `token_type_ids`, `attention_mask` [B, T] int32; `masked_positions`,
    `masked_ids` [B, P] int32 and `masked_weights` [B, P] float32 (0 for padding predictions);
    `nsp_labels` [B] int32 (1 = segment B is a random span).
    """

    def __init__(
        self,
        data_dir: Path,
        global_batch_size: int,
        *,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        position: dict[str, int] | None = None,
        epochs: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.meta = load_meta(self.data_dir)
        if global_batch_size < 1 or global_batch_size % process_count:
            raise UserError(
                f"global_batch_size: {global_batch_size} is not a positive multiple of the "
                f"process count {process_count}"
            )
        if not 0 <= process_index < process_count:
            raise UserError(f"process_index: {process_index} not in [0, {process_count})")
        if seed < 0:
            raise UserError(f"seed: must be >= 0, got {seed}")
        self.global_batch_size = global_batch_size
        self.batch_size = global_batch_size // process_count
        self.seed = seed
        self.process_index = process_index
        self.epochs = epochs
        self.static = self.meta["masking"] == "static"
        keys = SHARD_KEYS + (STATIC_KEYS if self.static else ())
        self._shards = [
            {k: np.load(self.data_dir / s["name"] / f"{k}.npy", mmap_mode="r") for k in keys}
            for s in self.meta["shards"]
        ]
        counts = [s["count"] for s in self.meta["shards"]]
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_examples = num_examples(self.meta)
        self.batches_per_epoch = self.num_examples // global_batch_size
        if self.batches_per_epoch == 0:
            raise UserError(
                f"global_batch_size: {global_batch_size} exceeds the {self.num_examples} examples in {self.data_dir}"
            )
        vocab = (self.data_dir / self.meta["vocab_file"]).read_text(encoding="utf-8").splitlines()
        self.spec = MaskingSpec.from_vocab(
            vocab,
            self.meta["masked_lm_prob"],
            self.meta["max_predictions_per_seq"],
            self.meta["whole_word_mask"],
        )
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)
        self._start(position)

    def describe(self) -> str:
        return str(self.data_dir)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([_PERMUTATION, self.seed, epoch])
            self._perm = rng.permutation(self.num_examples)
            self._perm_epoch = epoch
        return self._perm

    def _gather(self, examples: np.ndarray) -> dict[str, np.ndarray]:
        """Rows `examples` (global indices) from the memory-mapped shards, in the given order."""
        order = np.argsort(examples)
        sorted_examples = examples[order]
        shard_of = np.searchsorted(self._offsets, sorted_examples, side="right") - 1
        out: dict[str, list[np.ndarray]] = {}
        for s in np.unique(shard_of):
            rows = sorted_examples[shard_of == s] - self._offsets[s]
            for key, array in self._shards[s].items():
                out.setdefault(key, []).append(array[rows])
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return {k: np.concatenate(v)[inverse] for k, v in out.items()}

    def examples(self, epoch: int, index: int) -> np.ndarray:
        """Global indices of the examples in this process's slice of batch (epoch, index)."""
        start = index * self.global_batch_size + self.process_index * self.batch_size
        return self._permutation(epoch)[start : start + self.batch_size]

    def batch(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        """The batch at position (epoch, index) for this process; a pure function of both."""
        rows = self._gather(self.examples(epoch, index))
        lengths = rows["lengths"].astype(np.int32)
        t = rows["input_ids"].shape[1]
        if self.static:
            positions = rows["masked_positions"].astype(np.int32)
            masked = {
                "input_ids": rows["input_ids"].astype(np.int32),
                "masked_positions": positions,
                "masked_ids": rows["masked_ids"].astype(np.int32),
                # Position 0 is [CLS], never masked, so it marks the padding predictions.
                "masked_weights": (positions > 0).astype(np.float32),
            }
        else:
            rng = np.random.default_rng([_MASKING, self.seed, epoch, index, self.process_index])
            masked = mask_batch(rows["input_ids"], lengths, self.spec, rng)
        return {
            "input_ids": masked["input_ids"],
            "token_type_ids": rows["token_type_ids"].astype(np.int32),
            "attention_mask": (np.arange(t) < lengths[:, None]).astype(np.int32),
            "masked_positions": masked["masked_positions"],
            "masked_ids": masked["masked_ids"],
            "masked_weights": masked["masked_weights"],
            "nsp_labels": rows["nsp_labels"].astype(np.int32),
        }
