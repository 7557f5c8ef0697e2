"""NSP sentence pairs and MLM masking, after BERT's `create_pretraining_data.py`.

Pairs: the target length is `max_seq_length - 3`, or with probability `short_seq_prob` a uniform
draw from [2, max]; segment A is the first 1..m-1 of m consecutive sentences, B the true
continuation or (50%, and always when m = 1) a span from another document of the pool, in which
case the unused sentences are put back; the pair is truncated longest-first, one token at a time
from the front or the back at random; the input is `[CLS] A [SEP] B [SEP]`.

Masking (`mask_batch`, vectorised over a batch): 15% of the non-special tokens (rounded, at least
one, at most `max_predictions`), of which 80% become [MASK], 10% a uniformly random vocabulary id
and 10% stay; with whole-word masking a word is a piece plus its following `##` pieces and words are
taken whole (a word that would overshoot the budget is skipped, as in the original).

Default: dynamic masking. The training iterator masks each batch afresh with a generator seeded by
(seed, epoch, batch), so every epoch sees new masks; RoBERTa (Liu et al. 2019) found this no worse
than static masking, and it avoids writing `dupe_factor` = 10 masked copies of the data to disk.
`masking=static` masks once at preparation, as the original did.

Where the original code differs from its stated intent, we follow the intent and keep the original
as a switch or a note:
- `short_seq_per="instance"` (default) redraws the target length for every instance, so ~10% of
  instances are short as the original's comment says; `"document"` draws it once per document, as
  the original code does.
- The mask budget counts only maskable tokens; the original counts [CLS] and the two [SEP] too,
  which gives about 0.45 more predictions per sequence.
- A `##` piece right after [SEP] starts a word (the original would join it to the last word of A).
- Truncation draws how many tokens leave each segment's front in one binomial draw instead of one
  coin per token: the same distribution, without a Python loop per token.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MASKINGS = ("dynamic", "static")
SHORT_SEQ_PER = ("instance", "document")
PAIR_TASKS = ("nsp", "sop", "none")


@dataclass(frozen=True)
class TokenizedDocument:
    """A document's WordPiece ids, concatenated, with sentence `bounds` (len = sentences + 1)."""

    ids: np.ndarray
    bounds: np.ndarray

    @classmethod
    def from_sentences(cls, sentences: Sequence[Sequence[int]]) -> TokenizedDocument:
        sentences = [s for s in sentences if len(s)]
        lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        bounds = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        ids = np.fromiter(itertools.chain.from_iterable(sentences), dtype=np.int32, count=int(bounds[-1]))
        return cls(ids, bounds)

    @property
    def num_sentences(self) -> int:
        return len(self.bounds) - 1


@dataclass
class Instances:
    """Packed NSP instances: `[CLS] A [SEP] B [SEP]` rows padded with `pad_id` to T."""

    input_ids: np.ndarray  # [N, T] int32
    token_type_ids: np.ndarray  # [N, T] int8
    lengths: np.ndarray  # [N] int16
    nsp_labels: np.ndarray  # [N] int8, the pair task's label: 1 = B is a random span (NSP) or swapped (SOP)

    def __len__(self) -> int:
        return len(self.lengths)


def truncated_lengths(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """The lengths BERT's longest-first `truncate_seq_pair` leaves (ties trim B first)."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return len_a, len_b
    if len_a - len_b >= excess:
        return len_a - excess, len_b
    if len_b - len_a >= excess:
        return len_a, len_b - excess
    return (max_num_tokens + 1) // 2, max_num_tokens // 2


def truncate_pair(
    a: np.ndarray, b: np.ndarray, max_num_tokens: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Longest-first truncation; each removed token leaves the front or the back with p = 1/2."""
    keep_a, keep_b = truncated_lengths(len(a), len(b), max_num_tokens)
    out = []
    for seg, keep in ((a, keep_a), (b, keep_b)):
        cut = len(seg) - keep
        front = int(rng.binomial(cut, 0.5)) if cut else 0
        out.append(seg[front : front + keep])
    return out[0], out[1]


def create_instances_from_document(
    documents: Sequence[TokenizedDocument],
    index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: np.random.Generator,
    short_seq_per: str = "instance",
    pair_task: str = "nsp",
) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """(A, B, label) triples from `documents[index]`; other documents supply random Bs.

    `pair_task` (PAIR_TASKS): "nsp", label 1 = B is a random span (BERT). "sop", ALBERT's sentence
    order: B is A's true continuation, and with p = 1/2 the two are swapped (label 1). "none" (MLM
    only): B is always the true continuation. A chunk of one sentence has no continuation to split
    off, so its B is a random span under every task, labelled 1, as in BERT's and ALBERT's code."""
    doc = documents[index]
    max_num_tokens = max_seq_length - 3

    def draw_target() -> int:
        if rng.random() < short_seq_prob:
            return int(rng.integers(2, max_num_tokens + 1))
        return max_num_tokens

    target = draw_target()
    bounds = doc.bounds
    n = doc.num_sentences
    instances = []
    chunk_start = 0
    i = 0
    while i < n:
        if i == n - 1 or bounds[i + 1] - bounds[chunk_start] >= target:
            m = i - chunk_start + 1
            a_end = chunk_start + (int(rng.integers(1, m)) if m >= 2 else 1)
            tokens_a = doc.ids[bounds[chunk_start] : bounds[a_end]]
            is_random_next = m == 1 or (pair_task == "nsp" and rng.random() < 0.5)
            if is_random_next:
                target_b = target - len(tokens_a)
                for _ in range(10):
                    other = int(rng.integers(0, len(documents)))
                    if other != index:
                        break
                rdoc = documents[other]
                start = int(rng.integers(0, rdoc.num_sentences))
                # The original adds sentences until B reaches target_b, and always at least one.
                end = int(np.searchsorted(rdoc.bounds, rdoc.bounds[start] + target_b))
                end = min(max(end, start + 1), rdoc.num_sentences)
                tokens_b = rdoc.ids[rdoc.bounds[start] : rdoc.bounds[end]]
                i = a_end - 1  # put the unused sentences back
            else:
                tokens_b = doc.ids[bounds[a_end] : bounds[i + 1]]
            label = is_random_next
            if pair_task == "sop" and not is_random_next and rng.random() < 0.5:
                tokens_a, tokens_b, label = tokens_b, tokens_a, True
            tokens_a, tokens_b = truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
            instances.append((tokens_a, tokens_b, label))
            chunk_start = i + 1
            if short_seq_per == "instance":
                target = draw_target()
        i += 1
    return instances


def create_instances(
    documents: Sequence[TokenizedDocument],
    max_seq_length: int,
    short_seq_prob: float,
    rng: np.random.Generator,
    *,
    cls_id: int,
    sep_id: int,
    pad_id: int,
    dupe_factor: int = 1,
    short_seq_per: str = "instance",
    pair_task: str = "nsp",
) -> Instances:
    """All instances of a pool of documents (`dupe_factor` passes, as the original), packed."""
    documents = [d for d in documents if d.num_sentences]
    triples = [
        t
        for _ in range(dupe_factor)
        for index in range(len(documents))
        for t in create_instances_from_document(
            documents, index, max_seq_length, short_seq_prob, rng, short_seq_per, pair_task
        )
    ]
    return pack(triples, max_seq_length, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id)


def pack(
    triples: Sequence[tuple[np.ndarray, np.ndarray, bool]],
    max_seq_length: int,
    *,
    cls_id: int,
    sep_id: int,
    pad_id: int,
) -> Instances:
    n, t = len(triples), max_seq_length
    input_ids = np.full((n, t), pad_id, dtype=np.int32)
    token_type_ids = np.zeros((n, t), dtype=np.int8)
    lengths = np.zeros(n, dtype=np.int16)
    nsp = np.zeros(n, dtype=np.int8)
    input_ids[:, 0] = cls_id
    for row, (a, b, is_random_next) in enumerate(triples):
        la, lb = len(a), len(b)
        input_ids[row, 1 : 1 + la] = a
        input_ids[row, 1 + la] = sep_id
        input_ids[row, 2 + la : 2 + la + lb] = b
        input_ids[row, 2 + la + lb] = sep_id
        token_type_ids[row, 2 + la : 3 + la + lb] = 1
        lengths[row] = 3 + la + lb
        nsp[row] = is_random_next
    return Instances(input_ids, token_type_ids, lengths, nsp)


# --- masking ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskingSpec:
    """What `mask_batch` needs to know about the vocabulary and the recipe."""

    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]  # never masked: [CLS], [SEP], [PAD]
    masked_lm_prob: float = 0.15
    max_predictions: int = 20
    subword: np.ndarray | None = None  # bool [vocab_size], True for `##` pieces: whole-word masking

    @classmethod
    def from_vocab(
        cls,
        vocab: Sequence[str],
        masked_lm_prob: float = 0.15,
        max_predictions: int = 20,
        whole_word: bool = False,
    ) -> MaskingSpec:
        index = {tok: i for i, tok in enumerate(vocab)}
        subword = np.fromiter((t.startswith("##") for t in vocab), bool, len(vocab))
        return cls(
            vocab_size=len(vocab),
            mask_id=index["[MASK]"],
            special_ids=(index["[CLS]"], index["[SEP]"], index["[PAD]"]),
            masked_lm_prob=masked_lm_prob,
            max_predictions=max_predictions,
            subword=subword if whole_word else None,
        )


def mask_batch(
    input_ids: np.ndarray, lengths: np.ndarray, spec: MaskingSpec, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Mask a batch [B, T]; returns the masked `input_ids` and `masked_{positions,ids,weights}`.

    Predictions are listed in position order and padded to P = `max_predictions` with position 0,
    id 0 and weight 0.
    """
    ids = np.asarray(input_ids, dtype=np.int32)
    b, t = ids.shape
    p = spec.max_predictions
    cand = (np.arange(t) < np.asarray(lengths)[:, None]) & ~np.isin(ids, spec.special_ids)
    n_cand = cand.sum(axis=1)
    budget = np.minimum(p, np.maximum(1, np.rint(n_cand * spec.masked_lm_prob).astype(np.int64)))
    budget = np.minimum(budget, n_cand)

    if spec.subword is None:
        starts = cand
    else:
        follows_cand = np.zeros_like(cand)
        follows_cand[:, 1:] = cand[:, :-1]
        starts = cand & ~(spec.subword[ids] & follows_cand)
    keys = rng.random((b, t))
    keys[~starts] = 2.0
    order = np.argsort(keys, axis=1)  # word starts in random order, then everything else

    if spec.subword is None:
        taken = np.arange(t) < budget[:, None]
        selected = np.zeros_like(cand)
        np.put_along_axis(selected, order, taken, axis=1)
    else:
        word = np.cumsum(starts, axis=1) - 1  # word index of each candidate position
        flat_word = (np.arange(b)[:, None] * t + np.maximum(word, 0))[cand]
        word_len = np.bincount(flat_word, minlength=b * t).reshape(b, t)
        start_len = np.where(starts, np.take_along_axis(word_len, np.maximum(word, 0), 1), 0)
        len_in_order = np.take_along_axis(start_len, order, axis=1)
        # The original's greedy pass (skip a word that overshoots, keep looking), vectorised over
        # the batch; it stops once every row has filled its budget or run out of words.
        total = np.zeros(b, dtype=np.int64)
        taken = np.zeros((b, t), dtype=bool)
        for r in range(t):
            length = len_in_order[:, r]
            take = (length > 0) & (total + length <= budget)
            taken[:, r] = take
            total += length * take
            if not np.any((total < budget) & (length > 0)):
                break
        chosen_start = np.zeros_like(cand)
        np.put_along_axis(chosen_start, order, taken, axis=1)
        chosen_word = np.zeros((b, t), dtype=bool)
        chosen_word.reshape(-1)[(np.arange(b)[:, None] * t + np.maximum(word, 0))[starts]] = chosen_start[starts]
        selected = cand & np.take_along_axis(chosen_word, np.maximum(word, 0), axis=1)

    count = selected.sum(axis=1)
    positions = np.zeros((b, p), dtype=np.int32)
    positions[:, : min(p, t)] = np.argsort(~selected, axis=1, kind="stable")[:, :p]
    weights = np.arange(p) < count[:, None]
    positions[~weights] = 0
    labels = np.where(weights, np.take_along_axis(ids, positions, axis=1), 0).astype(np.int32)

    u = rng.random((b, p))
    random_ids = rng.integers(0, spec.vocab_size, size=(b, p), dtype=np.int32)
    replacement = np.where(u < 0.8, spec.mask_id, np.where(u < 0.9, random_ids, labels))
    masked = ids.copy()
    rows = np.broadcast_to(np.arange(b)[:, None], (b, p))
    masked[rows[weights], positions[weights]] = replacement[weights]
    return {
        "input_ids": masked,
        "masked_positions": positions,
        "masked_ids": labels,
        "masked_weights": weights.astype(np.float32),
    }
