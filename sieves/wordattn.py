"""Word-level attention (Clark et al. 2019, §4.1): wordpiece attention maps turned into word maps.

Attention *to* a word is the sum of the attention to its pieces (it stays a distribution);
attention *from* a word is the mean over its pieces' rows, as the paper says, or the first piece's
row (`first_piece=True`), which is what the authors' released pipeline computes
(docs/fidelity.md). [CLS]/[SEP] are not words: the attention each word pays to them, and the
attention they pay to each word, are kept beside the word map for consumers that need a ROOT.

Model-agnostic: the pooling matrices of a padded batch (`pooling_batch`) and the pooled maps
(`word_maps`, `special_maps`) are what a jitted forward applies to its attention, both in the
analyses (`analysis.attention.wordattn`, one checkpoint) and in the probes inside pre-training
(`train.probe`, the params being trained), so the two compute the same word maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import jax.numpy as jnp
import numpy as np

from sieves.align import EncodedSequence, bucketed


@dataclass(frozen=True)
class WordAttention:
    """One sequence's attention at word level; W = number of words of its parse. The special-token
    maps and the embeddings are None where the consumer (e.g. the dependency-head counts) has no
    use for them."""

    maps: np.ndarray  # float32 [L, H, W, W]: word → word
    to_special: np.ndarray | None  # float32 [L, H, W]: word → [CLS] and every [SEP], summed
    from_special: np.ndarray | None  # float32 [L, H, W]: mean over the [CLS]/[SEP] rows of attention to the word
    embeddings: np.ndarray | None  # float32 [W, d]: the model's input word embeddings, mean over pieces
    present: np.ndarray  # bool [W]: the word kept at least one piece after truncation
    word_dep: tuple[str, ...]
    word_head: np.ndarray  # int32 [W]; a root is its own head
    index: int


def pooling_matrices(word_ids: np.ndarray, num_words: int, first_piece: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(from [W, T], to [T, W]) so that `from @ A @ to` is the word-level map of piece map A.

    `to[t, w]` is 1 when piece t belongs to word w; row w of `from` averages w's pieces (or picks
    its first). A word without pieces has zero rows and columns.
    """
    length = word_ids.shape[0]
    to = np.zeros((length, num_words), np.float32)
    owned = np.flatnonzero(word_ids >= 0)
    to[owned, word_ids[owned]] = 1.0
    source = to.T.copy()
    if first_piece:
        first = np.zeros_like(source)
        has_piece = source.any(axis=1)
        first[np.flatnonzero(has_piece), np.argmax(source[has_piece], axis=1)] = 1.0
        source = first
    pieces = source.sum(axis=1, keepdims=True)
    return np.divide(source, pieces, out=np.zeros_like(source), where=pieces > 0), to


def word_attention(attention: np.ndarray, from_words: np.ndarray, to_words: np.ndarray) -> np.ndarray:
    """attention [..., T, T] → [..., W, W]."""
    return from_words @ attention @ to_words


@dataclass(frozen=True)
class PoolingBatch:
    """The pooling matrices of one padded batch (`rows` × `length` pieces, `words` word slots)."""

    from_words: np.ndarray  # float32 [rows, words, length]
    to_words: np.ndarray  # float32 [rows, length, words]
    special: np.ndarray  # float32 [rows, length]: 1 at [CLS] and every [SEP]

    @property
    def present(self) -> np.ndarray:
        """bool [rows, words]: the word owns a piece (padding words and rows own none)."""
        # Over an axis of a 3-d array: an array, which numpy's stubs cannot tell from a scalar.
        return cast(np.ndarray, self.to_words.any(axis=1))


def pooling_batch(chunk: Sequence[EncodedSequence], rows: int, length: int, first_piece: bool = False) -> PoolingBatch:
    """The pooling matrices of `chunk` padded to `rows` × `length` pieces. Words are padded like
    pieces (usually to the piece length itself: one compile per bucket); truncation can leave more
    words than pieces, and those words own no piece."""
    words = max(length, bucketed(max(len(s.word_dep) for s in chunk)))
    from_words = np.zeros((rows, words, length), np.float32)
    to_words = np.zeros((rows, length, words), np.float32)
    special = np.zeros((rows, length), np.float32)
    for b, seq in enumerate(chunk):
        num_words = len(seq.word_dep)
        f, t = pooling_matrices(seq.word_ids, num_words, first_piece)
        from_words[b, :num_words, : seq.length] = f
        to_words[b, : seq.length, :num_words] = t
        special[b, : seq.length] = seq.is_cls | seq.is_sep
    return PoolingBatch(from_words, to_words, special)


def word_maps(attention: jnp.ndarray, from_words: jnp.ndarray, to_words: jnp.ndarray) -> jnp.ndarray:
    """attention [B, L, H, T, T] → word maps [B, L, H, W, W] (`word_attention`, batched)."""
    return jnp.einsum("bwt,blhts,bsv->blhwv", from_words, attention, to_words)


def special_maps(
    attention: jnp.ndarray, from_words: jnp.ndarray, to_words: jnp.ndarray, special: jnp.ndarray
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(to_special, from_special), each [B, L, H, W]: the attention each word pays to [CLS] and the
    [SEP]s together, and the mean over those rows of the attention paid to each word."""
    to_special = jnp.einsum("bwt,blhts,bs->blhw", from_words, attention, special)
    n_special = jnp.maximum(special.sum(axis=1), 1.0)
    from_special = jnp.einsum("bt,blhts,bsv->blhv", special, attention, to_words) / n_special[:, None, None, None]
    return to_special, from_special
