"""Sieve builders (the sieve table of docs/roles.md) and the role registry.

A builder turns one `EncodedSequence` into `(rows, sieve)`: `rows[t]` marks the scored rows and
`sieve[t, s]` marks S(t). Adding a role is one builder decorated with `register_role`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

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
    `needs_parse`: scores nothing without a dependency parse. `coarse` is the group it reports in."""

    name: str
    build: Builder
    coarse: str
    needs_pair: bool = False
    needs_parse: bool = False


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
    for r, name in enumerate(roles):
        role = get_role(name)
        for b, seq in enumerate(seqs):
            n = seq.length
            if n > length:
                raise ValueError(f"sequence {seq.index} has {n} tokens, more than length={length}")
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
