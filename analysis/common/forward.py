"""Batches for the forward passes of every analysis: length-sorted, padded to a bucketed length (few
compiled shapes, little wasted compute) and to the full batch size (one shape per bucket).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np
from tqdm import tqdm

from sieves.align import EncodedSequence

log = logging.getLogger(__name__)

LENGTH_BUCKET = 32  # pad batches to a multiple of this: few compiles, little wasted compute


def batches(seqs: Sequence[EncodedSequence], size: int) -> Iterator[list[EncodedSequence]]:
    """Batches of similar length (sorted), so padding — and forward cost — stays small."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].length)
    for begin in range(0, len(order), size):
        yield [seqs[i] for i in order[begin : begin + size]]


def bucketed(length: int) -> int:
    """`length` rounded up to a multiple of LENGTH_BUCKET: the padded size of a batch."""
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


def padded_batches(
    seqs: Sequence[EncodedSequence], batch_size: int, max_length: int, desc: str
) -> Iterator[tuple[list[EncodedSequence], dict[str, np.ndarray]]]:
    """(the sequences, their model inputs [batch_size, bucketed length]) of each length-sorted
    batch, with a progress bar over the sequences; padding never goes past `max_length` (the
    encoding's, which fits the model's positions where a bucket may not)."""
    with tqdm(total=len(seqs), desc=desc, unit="seq") as progress:
        for chunk in batches(seqs, batch_size):
            length = bucketed(max(s.length for s in chunk))
            yield chunk, pad_batch(chunk, batch_size, min(length, max_length))
            progress.update(len(chunk))


def pad_batch(seqs: Sequence[EncodedSequence], batch_size: int, length: int) -> dict[str, np.ndarray]:
    """Model inputs padded to [batch_size, length]; missing rows are all-padding (no scored rows)."""
    arrays = {k: np.zeros((batch_size, length), np.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}
    for b, seq in enumerate(seqs):
        arrays["input_ids"][b, : seq.length] = seq.input_ids
        arrays["attention_mask"][b, : seq.length] = 1
        arrays["token_type_ids"][b, : seq.length] = seq.token_type_ids
    # An all-padding row would softmax over nothing; give it one real token (its scores are unused).
    arrays["attention_mask"][len(seqs) :, 0] = 1
    return arrays
