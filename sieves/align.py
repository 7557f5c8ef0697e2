"""Encode one- or two-segment examples and map every wordpiece to the parsed word it belongs to.

A wordpiece belongs to the word of its own segment whose character span overlaps the piece's
offsets from the fast tokenizer; offsets, never strings, so lower-casing and accent stripping
cannot break the alignment, nor can a byte-level BPE's pieces (`Ġword`, whose leading space
overlaps no word, whether the tokenizer trims it from the offsets or not).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bertjax.errors import UserError
from sieves.parse import Parse

if TYPE_CHECKING:  # a type only: importing transformers costs half a second of every analysis's start
    from transformers import PreTrainedTokenizerBase

    from bertjax.tokenization import LightTokenizer

    Tokenizer = PreTrainedTokenizerBase | LightTokenizer


MIN_LENGTH = 5  # the shortest encoding budget: [CLS] A [SEP] B [SEP] with a wordpiece in each segment


@dataclass(frozen=True)
class EncodedSequence:
    """One encoded example, unpadded (n real tokens), with its words in global numbering.

    Words are numbered across both segments (segment A's first); `word_ids` is -1 for [CLS]/[SEP]
    and for pieces that overlap no word. Words cut away by truncation keep their index but own no
    piece. `word_pos` holds each word's UPOS tag ("" when the parse has none). `is_cls` and
    `is_sep` mark the tokenizer's own class and separator tokens (BERT's [CLS] and [SEP],
    RoBERTa's `<s>` and `</s>`); `token_type_ids` are the model's input, all 0 where a model has
    none (RoBERTa, ModernBERT), so the segments the sieves use are `segments`.
    """

    input_ids: np.ndarray  # int32[n]
    token_type_ids: np.ndarray  # int32[n]
    special: np.ndarray  # bool[n]
    is_cls: np.ndarray  # bool[n]
    is_sep: np.ndarray  # bool[n]
    word_ids: np.ndarray  # int32[n]
    word_dep: tuple[str, ...]
    word_head: np.ndarray  # int32[num_words]
    num_segments: int
    index: int
    word_pos: tuple[str, ...] = ()

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def segments(self) -> np.ndarray:
        """int32[n]: 0 up to and including the first separator, 1 after it (a single segment: all 0).
        BERT's token-type ids exactly ([CLS] A [SEP] | B [SEP]), and RoBERTa's pair layout too
        (<s> A </s> | </s> B </s>), whose token-type ids are all 0. A pair without a separator
        keeps its token-type ids."""
        if self.num_segments == 1 or not self.is_sep.any():
            return self.token_type_ids
        return (np.arange(self.length) > np.argmax(self.is_sep)).astype(np.int32)


def encode(
    tokenizer: Tokenizer,
    segments: Sequence[str],
    parses: Sequence[Parse] | None,
    max_length: int = 128,
    index: int = 0,
) -> EncodedSequence:
    """Tokenize one example (pairs truncated longest-first) and align its pieces to its words."""
    return encode_batch(tokenizer, [segments], None if parses is None else [parses], max_length, [index])[0]


def encode_batch(
    tokenizer: Tokenizer,
    examples: Sequence[Sequence[str]],
    parses: Sequence[Sequence[Parse]] | None,
    max_length: int = 128,
    indices: Sequence[int] | None = None,
) -> list[EncodedSequence]:
    """`encode` for many examples, with one tokenizer call per segment count (~1.5x faster).

    `parses[i]` holds one parse per segment of `examples[i]`; `indices` default to 0, 1, ...
    """
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} is not a fast tokenizer; "
            "word alignment needs its character offsets"
        )
    if indices is None:
        indices = range(len(examples))
    if len(indices) != len(examples) or (parses is not None and len(parses) != len(examples)):
        raise ValueError("examples, parses and indices must have the same length")
    for position, segments in enumerate(examples):
        if len(segments) not in (1, 2):
            raise ValueError(f"example {position} has {len(segments)} segments; expected 1 or 2")
        if parses is not None and len(parses[position]) != len(segments):
            raise ValueError(f"example {position} has {len(segments)} segments but {len(parses[position])} parses")

    # A tokenizer that names no class or separator token (a GPT-style BPE) opens and closes with
    # its begin and end tokens.
    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    encoded: list[EncodedSequence | None] = [None] * len(examples)
    for num_segments in (1, 2):
        members = [i for i, segments in enumerate(examples) if len(segments) == num_segments]
        if not members:
            continue
        columns = [[examples[i][segment] for i in members] for segment in range(num_segments)]
        batch = backend_encode(tokenizer, columns, max_length)
        for row, i in enumerate(members):
            encoded[i] = _align(
                input_ids=batch[row].ids,
                token_type_ids=batch[row].type_ids,
                offsets=batch[row].offsets,
                sequence_ids=batch[row].sequence_ids,
                parses=None if parses is None else parses[i],
                num_segments=num_segments,
                index=indices[i],
                cls_id=cls_id,
                sep_id=sep_id,
            )
    return encoded  # type: ignore[return-value]


def backend_encode(
    tokenizer: Tokenizer, columns: Sequence[Sequence[str]], max_length: int | None, special: bool = True
) -> list:
    """The `tokenizers.Encoding`s of one column of texts (or two: pairs) as transformers' fast
    tokenizers make them (`tokenizer(*columns, truncation="longest_first", max_length=...)`; no
    truncation without `max_length`; `special`: add the special tokens), from the
    `tokenizers.Tokenizer` both kinds of tokenizer hold (transformers' and
    `bertjax.tokenization.LightTokenizer`), setting its truncation and padding as transformers does
    on every call."""
    backend = tokenizer.backend_tokenizer
    if max_length is None:
        backend.no_truncation()
    else:
        side = getattr(tokenizer, "truncation_side", "right")
        backend.enable_truncation(max_length, stride=0, strategy="longest_first", direction=side)
    backend.no_padding()
    backend.encode_special_tokens = getattr(tokenizer, "split_special_tokens", False)
    texts = list(zip(*columns, strict=True)) if len(columns) == 2 else list(columns[0])
    return backend.encode_batch(texts, add_special_tokens=special)


def _align(
    input_ids: list[int],
    token_type_ids: list[int],
    offsets: list[tuple[int, int]],
    sequence_ids: list[int | None],
    parses: Sequence[Parse] | None,
    num_segments: int,
    index: int,
    cls_id: int,
    sep_id: int,
) -> EncodedSequence:
    ids = np.asarray(input_ids, dtype=np.int32)
    special = np.array([segment is None for segment in sequence_ids], dtype=bool)
    piece_segment = np.array([-1 if s is None else s for s in sequence_ids], dtype=np.int32)
    piece_span = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    word_ids = np.full(ids.shape, -1, dtype=np.int32)
    word_dep: list[str] = []
    word_head: list[int] = []
    word_pos: list[str] = []
    for segment, words in enumerate(parses or ()):
        first_word = len(word_dep)
        word_dep.extend(word.dep for word in words)
        word_pos.extend(word.pos for word in words)
        word_head.extend(first_word + word.head for word in words)
        pieces = np.flatnonzero(piece_segment == segment)
        if not words or not pieces.size:
            continue
        word_span = np.array([(word.start, word.end) for word in words], dtype=np.int64)
        piece_start = piece_span[pieces, 0, None]
        piece_end = piece_span[pieces, 1, None]
        overlaps = (piece_start < word_span[None, :, 1]) & (word_span[None, :, 0] < piece_end)
        # A piece straddling two words (BERT's "don" over spaCy's "do" + "n't") goes to the word
        # it shares most characters with, the earlier one on a tie.
        shared = np.minimum(piece_end, word_span[None, :, 1]) - np.maximum(piece_start, word_span[None, :, 0])
        best = np.argmax(np.where(overlaps, shared, -1), axis=1)
        word_ids[pieces] = np.where(overlaps.any(axis=1), first_word + best, -1)
    return EncodedSequence(
        input_ids=ids,
        token_type_ids=np.asarray(token_type_ids, dtype=np.int32),
        special=special,
        is_cls=special & (ids == cls_id),
        is_sep=special & (ids == sep_id),
        word_ids=word_ids,
        word_dep=tuple(word_dep),
        word_head=np.asarray(word_head, dtype=np.int32),
        num_segments=num_segments,
        index=index,
        word_pos=tuple(word_pos),
    )


# -- padded batches: length-sorted, padded to a bucketed length (few compiled shapes, little
# wasted compute); shared by the analyses and the probes inside training --

LENGTH_BUCKET = 32  # pad batches to a multiple of this: few compiles, little wasted compute


def batches(seqs: Sequence[EncodedSequence], size: int) -> Iterator[list[EncodedSequence]]:
    """Batches of similar length (sorted), so padding — and forward cost — stays small."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].length)
    for begin in range(0, len(order), size):
        yield [seqs[i] for i in order[begin : begin + size]]


def bucketed(length: int) -> int:
    """`length` rounded up to a multiple of LENGTH_BUCKET: the padded size of a batch."""
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


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
