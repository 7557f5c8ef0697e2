"""Sieve builders (the sieve table of docs/roles.md) and the role registry.

A builder turns one `EncodedSequence` into `(rows, sieve)`: `rows[t]` marks the scored rows and
`sieve[t, s]` marks S(t). Adding a role is one builder decorated with `register_role`. The
built-in roles also build a whole padded batch at once (`register_batch`), the same masks with a
few array operations instead of a Python loop over the sequences: the masks are the host's share
of the scoring, which on a GPU is most of it (tests/test_sieves_builders.py holds each to its
one-sequence builder).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from bertjax.errors import UserError
from sieves.align import EncodedSequence

Masks = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class SieveOptions:
    """`window` is the local window k; `special_rows=False` stops scoring [CLS]/[SEP] rows for the
    positional roles (local, prev, next, block, cls, sep, delimiter); `first_sep_in_b` scores the
    block row of the first [SEP] against segment B, as the authors' `block_score` notebook does
    (`tok_id < sep1_idx` is segment A), instead of its own token type's segment A."""

    window: int = 2
    special_rows: bool = True
    first_sep_in_b: bool = False

    def __post_init__(self) -> None:
        if self.window < 1:
            raise UserError(f"the local sieve window must be at least 1, got {self.window}")


Builder = Callable[[EncodedSequence, SieveOptions], Masks]


@dataclass(frozen=True)
class Role:
    """A named sieve. `needs_pair`: undefined on single-segment inputs (report it absent there);
    `needs_parse`: scores nothing without a dependency parse. `coarse` is the group it reports in.
    `batch`: the same masks for a whole `Padded` batch at once (rows [B, T], sieves [B, T, T]),
    where the role has one."""

    name: str
    build: Builder
    coarse: str
    needs_pair: bool = False
    needs_parse: bool = False
    batch: Callable[[Padded, SieveOptions], Masks] | None = None


ROLES: dict[str, Role] = {}

DEFAULT_ROLES = (
    "local", "prev", "next", "block", "cls", "sep", "delimiter",
    "nsubj", "dobj", "amod", "advmod", "syntactic",
)  # fmt: skip

RELATIONS = ("nsubj", "dobj", "amod", "advmod")


def register_role(
    name: str, coarse: str, needs_pair: bool = False, needs_parse: bool = False
) -> Callable[[Builder], Builder]:
    """Decorator adding a builder to `ROLES` under `name`."""

    def register(build: Builder) -> Builder:
        if name in ROLES:
            raise ValueError(f"role {name!r} is already registered")
        ROLES[name] = Role(name, build, coarse, needs_pair, needs_parse)
        return build

    return register


def register_batch(name: str) -> Callable[[Callable[[Padded, SieveOptions], Masks]], Callable]:
    """Decorator adding the batch builder of the registered role `name`."""

    def register(batch: Callable[[Padded, SieveOptions], Masks]) -> Callable:
        ROLES[name] = replace(ROLES[name], batch=batch)
        return batch

    return register


class Padded:
    """A batch of sequences as arrays [B, T] padded to `length` (False, 0 or -1 past each end), for
    the batch builders; what only the relation roles read is computed on first use."""

    def __init__(self, seqs: Sequence[EncodedSequence], length: int):
        self.seqs, self.length = seqs, length
        self.n = np.array([seq.length for seq in seqs])
        positions = np.arange(length)
        self.valid = positions[None, :] < self.n[:, None]
        self.pairs = self.valid[:, :, None] & self.valid[:, None, :]
        self.special = self.stack(lambda seq: seq.special, False)
        self.is_cls = self.stack(lambda seq: seq.is_cls, False)
        self.is_sep = self.stack(lambda seq: seq.is_sep, False)
        self.offsets = positions[None, :] - positions[:, None]  # [T, T]: s - t

    def stack(self, field: Callable[[EncodedSequence], np.ndarray], fill) -> np.ndarray:
        first = field(self.seqs[0]) if self.seqs else np.zeros(0, bool)
        out = np.full((len(self.seqs), self.length), fill, dtype=first.dtype)
        for b, seq in enumerate(self.seqs):
            out[b, : seq.length] = field(seq)
        return out

    def positional_rows(self, options: SieveOptions) -> np.ndarray:
        return self.valid if options.special_rows else self.valid & ~self.special

    @functools.cached_property
    def arcs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(word_ids, each piece's head word, its relation label, whether it can be a relation
        row: aligned, not its own head, the head owning a piece), [B, T] each, as
        `relation_masks` reads them."""
        word_ids = self.stack(lambda seq: seq.word_ids, -1)
        head = np.full(word_ids.shape, -1, dtype=word_ids.dtype)
        label = np.full(word_ids.shape, "", dtype=object)
        candidate = np.zeros(word_ids.shape, dtype=bool)
        for b, seq in enumerate(self.seqs):
            if not seq.word_dep:
                continue
            n = seq.length
            aligned = seq.word_ids >= 0
            word = np.where(aligned, seq.word_ids, 0)
            head[b, :n] = seq.word_head[word]
            has_piece = np.zeros(len(seq.word_dep), dtype=bool)
            has_piece[seq.word_ids[aligned]] = True
            label[b, :n] = np.asarray(seq.word_dep, dtype=object)[word]
            candidate[b, :n] = aligned & (head[b, :n] != word) & has_piece[head[b, :n]]
        return word_ids, head, label, candidate


def _positional_rows(seq: EncodedSequence, options: SieveOptions) -> np.ndarray:
    return np.ones(seq.length, dtype=bool) if options.special_rows else ~seq.special


def _offsets(seq: EncodedSequence) -> np.ndarray:
    """offsets[t, s] = s - t."""
    positions = np.arange(seq.length)
    return positions[None, :] - positions[:, None]


@register_role("local", coarse="local")
def local_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    return _positional_rows(seq, options), np.abs(_offsets(seq)) <= options.window


@register_role("prev", coarse="local")
def prev_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    offsets = _offsets(seq)
    rows = _positional_rows(seq, options) & (np.arange(seq.length) >= 1)
    return rows, (offsets >= -options.window) & (offsets <= -1)


@register_role("next", coarse="local")
def next_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    offsets = _offsets(seq)
    rows = _positional_rows(seq, options) & (np.arange(seq.length) <= seq.length - 2)
    return rows, (offsets >= 1) & (offsets <= options.window)


@register_role("block", coarse="block", needs_pair=True)
def block_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    if seq.num_segments != 2:
        return np.zeros(seq.length, dtype=bool), np.zeros((seq.length, seq.length), dtype=bool)
    # From the separators, not the token-type ids, which RoBERTa and ModernBERT do not have.
    segments = seq.segments
    row_segment = segments.copy()
    if options.first_sep_in_b:
        row_segment[np.argmax(seq.is_sep)] = 1
    same_segment = row_segment[:, None] == segments[None, :]
    return _positional_rows(seq, options), same_segment & ~seq.special[None, :]


def _column_sieve(seq: EncodedSequence, options: SieveOptions, keys: np.ndarray) -> Masks:
    return _positional_rows(seq, options), np.broadcast_to(keys[None, :], (seq.length, seq.length))


@register_role("cls", coarse="delimiter")
def cls_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    return _column_sieve(seq, options, seq.is_cls)


@register_role("sep", coarse="delimiter")
def sep_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    return _column_sieve(seq, options, seq.is_sep)


@register_role("delimiter", coarse="delimiter")
def delimiter_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    return _column_sieve(seq, options, seq.is_cls | seq.is_sep)


def relation_masks(seq: EncodedSequence, relations: Sequence[str]) -> Masks:
    """Rows: pieces of a word whose label is in `relations` and whose head is another word, both
    owning at least one piece; S(t): every piece of that head."""
    n = seq.length
    if not seq.word_dep:
        return np.zeros(n, dtype=bool), np.zeros((n, n), dtype=bool)
    aligned = seq.word_ids >= 0
    word = np.where(aligned, seq.word_ids, 0)
    head = seq.word_head[word]
    has_piece = np.zeros(len(seq.word_dep), dtype=bool)
    has_piece[seq.word_ids[aligned]] = True
    labelled = np.isin(np.asarray(seq.word_dep)[word], list(relations))
    rows = aligned & labelled & (head != word) & has_piece[head]
    sieve = rows[:, None] & (seq.word_ids[None, :] == head[:, None])
    return rows, sieve


@register_role("nsubj", coarse="syntactic", needs_parse=True)
def nsubj_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    return relation_masks(seq, ("nsubj",))


@register_role("dobj", coarse="syntactic", needs_parse=True)
def dobj_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    return relation_masks(seq, ("dobj",))


@register_role("amod", coarse="syntactic", needs_parse=True)
def amod_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    return relation_masks(seq, ("amod",))


@register_role("advmod", coarse="syntactic", needs_parse=True)
def advmod_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    return relation_masks(seq, ("advmod",))


@register_role("syntactic", coarse="syntactic", needs_parse=True)
def syntactic_sieve(seq: EncodedSequence, options: SieveOptions) -> Masks:
    # A piece belongs to one word, hence one relation, so each row keeps its own relation's sieve.
    return relation_masks(seq, RELATIONS)


# -- the same masks, a batch at a time (each held to the builder above by the tests) -------------


def _within(padded: Padded, sieve: np.ndarray) -> np.ndarray:
    """`sieve` cut to each sequence's own tokens (both axes)."""
    return padded.pairs & sieve


@register_batch("local")
def _local_batch(padded: Padded, options: SieveOptions) -> Masks:
    return padded.positional_rows(options), _within(padded, np.abs(padded.offsets) <= options.window)


@register_batch("prev")
def _prev_batch(padded: Padded, options: SieveOptions) -> Masks:
    rows = padded.positional_rows(options) & (np.arange(padded.length) >= 1)
    offsets = padded.offsets
    return rows, _within(padded, (offsets >= -options.window) & (offsets <= -1))


@register_batch("next")
def _next_batch(padded: Padded, options: SieveOptions) -> Masks:
    rows = padded.positional_rows(options) & (np.arange(padded.length)[None, :] <= padded.n[:, None] - 2)
    offsets = padded.offsets
    return rows, _within(padded, (offsets >= 1) & (offsets <= options.window))


@register_batch("block")
def _block_batch(padded: Padded, options: SieveOptions) -> Masks:
    paired = np.array([seq.num_segments == 2 for seq in padded.seqs])
    segments = padded.stack(lambda seq: seq.segments, -1)
    row_segment = segments.copy()
    if options.first_sep_in_b:
        first_sep = np.argmax(padded.is_sep, axis=1)
        has_sep = padded.is_sep.any(axis=1)
        # As the one-sequence builder: argmax of no separator is position 0.
        row_segment[np.arange(len(row_segment)), np.where(has_sep, first_sep, 0)] = 1
    same_segment = row_segment[:, :, None] == segments[:, None, :]
    sieve = _within(padded, same_segment & ~padded.special[:, None, :]) & paired[:, None, None]
    return padded.positional_rows(options) & paired[:, None], sieve


def _column_batch(padded: Padded, options: SieveOptions, keys: np.ndarray) -> Masks:
    return padded.positional_rows(options), _within(padded, np.broadcast_to(keys[:, None, :], padded.pairs.shape))


@register_batch("cls")
def _cls_batch(padded: Padded, options: SieveOptions) -> Masks:
    return _column_batch(padded, options, padded.is_cls)


@register_batch("sep")
def _sep_batch(padded: Padded, options: SieveOptions) -> Masks:
    return _column_batch(padded, options, padded.is_sep)


@register_batch("delimiter")
def _delimiter_batch(padded: Padded, options: SieveOptions) -> Masks:
    return _column_batch(padded, options, padded.is_cls | padded.is_sep)


def _relation_batch(padded: Padded, relations: Sequence[str]) -> Masks:
    word_ids, head, label, candidate = padded.arcs
    rows = candidate & np.isin(label, list(relations))
    return rows, rows[:, :, None] & (word_ids[:, None, :] == head[:, :, None])


def _relation_builder(relations: Sequence[str]) -> Callable[[Padded, SieveOptions], Masks]:
    def batch(padded: Padded, options: SieveOptions) -> Masks:
        return _relation_batch(padded, relations)

    return batch


for _relation in RELATIONS:
    register_batch(_relation)(_relation_builder((_relation,)))
register_batch("syntactic")(_relation_builder(RELATIONS))


def get_role(name: str) -> Role:
    if name not in ROLES:
        raise UserError(f"unknown role {name!r}; known roles: {', '.join(ROLES)}")
    return ROLES[name]


def present_roles(num_segments: Iterable[int], roles: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the roles inputs with these segment counts define, those they do not): pair roles need
    two segments in every input."""
    paired = all(n == 2 for n in num_segments)
    present = [r for r in roles if paired or not get_role(r).needs_pair]
    return present, [r for r in roles if r not in present]


def build_batch(seqs: Sequence[EncodedSequence], roles: Sequence[str], options: SieveOptions, length: int) -> Masks:
    """Masks for every role and sequence, padded to `length`: rows bool[R, B, length] and sieves
    bool[R, B, length, length]. Padding rows and columns are False.

    Rows with an empty sieve are dropped whatever the builder says, since docs/roles.md defines the
    scored rows as those with non-empty S(t) and the kernel divides by |S(t)|.
    """
    rows = np.zeros((len(roles), len(seqs), length), dtype=bool)
    sieves = np.zeros((len(roles), len(seqs), length, length), dtype=bool)
    for seq in seqs:
        if seq.length > length:
            raise ValueError(f"sequence {seq.index} has {seq.length} tokens, more than length={length}")
    padded = Padded(seqs, length)
    for r, name in enumerate(roles):
        role = get_role(name)
        if role.batch is not None:
            built_rows, sieves[r] = role.batch(padded, options)
            rows[r] = built_rows & sieves[r].any(axis=-1)
            continue
        for b, seq in enumerate(seqs):
            n = seq.length
            seq_rows, seq_sieve = role.build(seq, options)
            sieves[r, b, :n, :n] = seq_sieve
            rows[r, b, :n] = seq_rows & seq_sieve.any(axis=1)
    return rows, sieves


def arc_row_weights(seqs: Sequence[EncodedSequence], roles: Sequence[str], length: int) -> np.ndarray:
    """float[R, B, length] row weights that make the kernel's mean over a relation role's rows a
    mean over arcs: each row weighs 1 / (its word's piece count), so every dependent word counts
    once, as the syntactic notebook of Pande et al.'s code averages (docs/fidelity.md). Rows of
    the other roles weigh 1 (their plain mean)."""
    weights = np.ones((len(roles), len(seqs), length), dtype=np.float32)
    for b, seq in enumerate(seqs):
        aligned = seq.word_ids >= 0
        pieces = np.bincount(seq.word_ids[aligned], minlength=len(seq.word_dep))
        per_row = np.ones(seq.length, dtype=np.float32)
        per_row[aligned] = 1.0 / pieces[seq.word_ids[aligned]]
        for r, name in enumerate(roles):
            if get_role(name).needs_parse:
                weights[r, b, : seq.length] = per_row
    return weights
