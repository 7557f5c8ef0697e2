"""GLUE examples as arrays, the shuffled training iterator and padded evaluation batches.

Training is deterministic in the way of `train.data.PretrainingData`: epoch e visits the examples
in an order seeded by (seed, e), so the position `{"epoch", "index"}` is all a checkpoint keeps for
an exact resume; the examples that do not fill a last global batch are skipped in that epoch.

With `group_by_length` (the default for fine-tuning), the epoch's permutation is cut into groups of
`GROUP_BATCHES` batches, each group is sorted by length and cut into batches, and the batches are
shuffled; each batch is then cut to its longest sequence rounded up to `pad_multiple`. GLUE
sentences are far shorter than the 128 positions a fixed shape would pad to (SST-2's median is 10
wordpieces), so this cuts the compute several-fold, at the price of one compile per distinct padded
length (at most max_len / pad_multiple) — the sampler of HF's `group_by_length`. Padding never
changes a sequence's outputs (it is masked), only which examples share a batch.
Evaluation covers every example at the full length (see `eval_batches`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bertjax.errors import UserError
from bertjax.glue import FEATURES
from train.data import EpochBatches

GROUP_BATCHES = 50  # batches per length-sorted group: random enough, yet most batches are short


class ClassificationData(EpochBatches):
    """Yields dict batches of `global_batch_size // process_count` rows of `arrays`, forever."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        global_batch_size: int,
        *,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        position: dict[str, int] | None = None,
        group_by_length: bool = False,
        pad_multiple: int = 16,
    ) -> None:
        self.arrays = arrays
        self.lengths = arrays["attention_mask"].sum(axis=1)
        self.group_by_length = group_by_length
        self.pad_multiple = pad_multiple
        self.num_examples = len(arrays["labels"])
        if global_batch_size < 1 or global_batch_size % process_count:
            raise UserError(
                f"train.global_batch_size: {global_batch_size} is not a positive multiple of the "
                f"process count {process_count}"
            )
        self.global_batch_size = global_batch_size
        self.batch_size = global_batch_size // process_count
        self.batches_per_epoch = self.num_examples // global_batch_size
        if self.batches_per_epoch == 0:
            raise UserError(
                f"train.global_batch_size: {global_batch_size} exceeds the {self.num_examples} training examples"
            )
        self.seed = seed
        self.process_index = process_index
        self._perm_epoch, self._perm = -1, np.empty((0, 0), dtype=np.int64)
        self._start(position)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """[batches_per_epoch, global_batch_size] example indices of the epoch's global batches."""
        rng = np.random.default_rng([self.seed, epoch])
        used = self.batches_per_epoch * self.global_batch_size
        order = rng.permutation(self.num_examples)[:used]
        if not self.group_by_length:
            return order.reshape(self.batches_per_epoch, self.global_batch_size)
        group = GROUP_BATCHES * self.global_batch_size
        groups = np.split(order, range(group, used, group))
        grouped = [chunk[np.argsort(-self.lengths[chunk], kind="stable")] for chunk in groups]
        batches = np.concatenate(grouped).reshape(self.batches_per_epoch, self.global_batch_size)
        return batches[rng.permutation(self.batches_per_epoch)]

    def examples(self, epoch: int, index: int) -> tuple[np.ndarray, int]:
        """(indices of the examples in this process's slice of batch (epoch, index), the batch's
        padded length, the same on every process)."""
        if epoch != self._perm_epoch:
            self._perm = self.epoch_order(epoch)
            self._perm_epoch = epoch
        rows = self._perm[index]
        length = self.arrays["input_ids"].shape[1]
        if self.group_by_length:
            length = min(length, -(-int(self.lengths[rows].max()) // self.pad_multiple) * self.pad_multiple)
        start = self.process_index * self.batch_size
        return rows[start : start + self.batch_size], length

    def batch(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        rows, length = self.examples(epoch, index)
        return {k: v[rows, :length] if v.ndim == 2 else v[rows] for k, v in self.arrays.items()}


def eval_batches(
    arrays: dict[str, np.ndarray], global_batch_size: int, process_index: int = 0, process_count: int = 1
) -> Iterator[dict[str, np.ndarray]]:
    """This process's slices of the model inputs of consecutive global batches that cover every
    example once, in order. The last batch is filled up with copies of example 0 (real tokens, so
    no all-padding row), whose outputs the caller drops: it keeps the first N."""
    n = len(arrays["labels"])
    padded = -(-n // global_batch_size) * global_batch_size
    order = np.concatenate([np.arange(n), np.zeros(padded - n, dtype=np.int64)])
    local = global_batch_size // process_count
    for start in range(0, padded, global_batch_size):
        rows = order[start + process_index * local : start + (process_index + 1) * local]
        yield {k: arrays[k][rows] for k in FEATURES}
