"""Word-level attention (Clark et al. 2019, §4.1): wordpiece attention maps turned into word maps.

Attention *to* a word is the sum of the attention to its pieces (it stays a distribution);
attention *from* a word is the mean over its pieces' rows, as the paper says, or the first piece's
row (`first_piece=True`), which is what the authors' released pipeline computes
(docs/fidelity.md). [CLS]/[SEP] are not words: the attention each word pays to them, and the
attention they pay to each word, are kept beside the word map for consumers that need a ROOT.

The forward pass and the conversion run in one jitted function per batch; `iter_word_attention`
yields one `WordAttention` per sequence, so consumers (dependency heads, the probes, a future
coreference probe) only ever see one batch at a time and never a dataset of attention maps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from analysis.common.forward import compiled, padded_batches
from sieves.align import EncodedSequence, bucketed


@dataclass(frozen=True)
class WordAttention:
    """One sequence's attention at word level; W = number of words of its parse."""

    maps: np.ndarray  # float32 [L, H, W, W]: word → word
    to_special: np.ndarray  # float32 [L, H, W]: word → [CLS] and every [SEP], summed
    from_special: np.ndarray  # float32 [L, H, W]: mean over the [CLS]/[SEP] rows of attention to the word
    embeddings: np.ndarray  # float32 [W, d]: the model's input word embeddings, mean over pieces
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


def make_word_attention_fn(model: nnx.Module):
    """A jitted forward that returns word maps, special-token columns/rows and pooled embeddings."""
    run, (state,) = compiled(_jit_word_attention, model)
    return lambda *arrays: run(state, *arrays)


def _jit_word_attention(graphdef):
    @jax.jit
    def run(state, input_ids, attention_mask, token_type_ids, from_words, to_words, special):
        bert = nnx.merge(graphdef, state)
        out = bert(input_ids, attention_mask, token_type_ids, output_attentions=True)
        attention = jnp.stack(out.attentions, axis=1)  # [B, L, H, T, T]
        maps = jnp.einsum("bwt,blhts,bsv->blhwv", from_words, attention, to_words)
        to_special = jnp.einsum("bwt,blhts,bs->blhw", from_words, attention, special)
        n_special = jnp.maximum(special.sum(axis=1), 1.0)
        from_special = jnp.einsum("bt,blhts,bsv->blhv", special, attention, to_words) / n_special[:, None, None, None]
        pieces = bert.embeddings.word_embeddings(input_ids).astype(jnp.float32)
        piece_counts = jnp.maximum(to_words.sum(axis=1), 1.0)  # [B, W]
        embeddings = jnp.einsum("btw,btd->bwd", to_words, pieces) / piece_counts[..., None]
        return maps, to_special, from_special, embeddings

    return run


def iter_word_attention(
    run,
    seqs: Sequence[EncodedSequence],
    batch_size: int,
    max_length: int,
    first_piece: bool = False,
    desc: str = "word attention",
) -> Iterator[WordAttention]:
    """Stream the word-level attention of every sequence, batch by batch (length-sorted order).

    Words are padded like pieces (usually to the piece length itself: one compile per bucket).
    """
    for chunk, arrays in padded_batches(seqs, batch_size, max_length, desc):
        length = arrays["input_ids"].shape[1]
        # Truncation can leave more words than pieces; those words own no piece.
        words = max(length, bucketed(max(len(s.word_dep) for s in chunk)))
        from_words = np.zeros((batch_size, words, length), np.float32)
        to_words = np.zeros((batch_size, length, words), np.float32)
        special = np.zeros((batch_size, length), np.float32)
        for b, seq in enumerate(chunk):
            num_words = len(seq.word_dep)
            f, t = pooling_matrices(seq.word_ids, num_words, first_piece)
            from_words[b, :num_words, : seq.length] = f
            to_words[b, : seq.length, :num_words] = t
            special[b, : seq.length] = seq.is_cls | seq.is_sep
        maps, to_special, from_special, embeddings = (
            np.asarray(x)
            for x in run(
                arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"],
                from_words, to_words, special,
            )
        )  # fmt: skip
        for b, seq in enumerate(chunk):
            w = len(seq.word_dep)
            yield WordAttention(
                maps=maps[b, :, :, :w, :w],
                to_special=to_special[b, :, :, :w],
                from_special=from_special[b, :, :, :w],
                embeddings=embeddings[b, :w],
                present=to_words[b, :, :w].any(axis=0),
                word_dep=seq.word_dep,
                word_head=seq.word_head,
                index=seq.index,
            )
