"""Word-level attention of a model (Clark et al. 2019, §4.1) over encoded sequences.

The definitions (to a word: the sum over its pieces; from a word: the mean over its pieces' rows,
or the first piece's with `first_piece=True`) and the pooling are `sieves.wordattn`'s, shared with
the probes inside pre-training. Here the forward pass and the pooling run in one jitted function
per batch; `iter_word_attention` yields one `WordAttention` per sequence, with the model's pooled
input embeddings, so consumers (dependency heads, the probes, coreference) only ever see one batch
at a time and never a dataset of attention maps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from analysis.common.finite import check_finite
from analysis.common.forward import compiled, padded_batches
from bertjax.model import Model
from sieves.align import EncodedSequence
from sieves.wordattn import WordAttention, pooling_batch, special_maps, word_maps


def make_word_attention_fn(model: Model):
    """A jitted forward that returns word maps, special-token columns/rows and pooled embeddings."""
    run, (state,) = compiled(_jit_word_attention, model)
    return lambda *arrays: run(state, *arrays)


def _jit_word_attention(graphdef):
    @jax.jit
    def run(state, input_ids, attention_mask, token_type_ids, from_words, to_words, special):
        bert = nnx.merge(graphdef, state)
        out = bert(input_ids, attention_mask, token_type_ids, output_attentions=True)
        attention = jnp.stack(out.attentions, axis=1)  # [B, L, H, T, T]
        maps = word_maps(attention, from_words, to_words)
        to_special, from_special = special_maps(attention, from_words, to_words, special)
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
    allowed: bool = False,
) -> Iterator[WordAttention]:
    """Stream the word-level attention of every sequence, batch by batch (length-sorted order). A
    sequence whose word attention is not finite stops the run (`finite.check_finite`, `allowed`
    its): counted as arcs no head found, or fed to the probes, it would read as a finding."""
    for chunk, arrays in padded_batches(seqs, batch_size, max_length, desc):
        pooling = pooling_batch(chunk, batch_size, arrays["input_ids"].shape[1], first_piece)
        present = pooling.present
        maps, to_special, from_special, embeddings = (
            np.asarray(x)
            for x in run(
                arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"],
                pooling.from_words, pooling.to_words, pooling.special,
            )
        )  # fmt: skip
        for b, seq in enumerate(chunk):
            w = len(seq.word_dep)
            pooled = (maps[b, :, :, :w, :w], to_special[b, :, :, :w, None], from_special[b, :, :, :w, None])
            check_finite(np.moveaxis(np.concatenate(pooled, axis=-1), (0, 1), (-2, -1)), "the word-level attention",
                         f"{desc}, sentence {seq.index}", allowed=allowed)  # fmt: skip
            yield WordAttention(
                maps=maps[b, :, :, :w, :w],
                to_special=to_special[b, :, :, :w],
                from_special=from_special[b, :, :, :w],
                embeddings=embeddings[b, :w],
                present=present[b, :w],
                word_dep=seq.word_dep,
                word_head=seq.word_head,
                index=seq.index,
            )
