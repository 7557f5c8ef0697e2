"""Dependency arcs found by attention heads: Clark et al. 2019 §4.2's counts, and SAS (Chen et al.
2023's syntactic attention structure) read off them.

Counts. Over the words j ≠ i that kept a piece ([CLS]/[SEP] are not words, so they are excluded),
head k predicts for word i argmax_j α_k(i, j) in direction `dep2head` and argmax_j α_k(j, i) in
`head2dep` — Clark et al.'s notebook's `attn_head_predictor` in modes "normal" and "transpose". An
arc (dependent w, head h), w ≠ h, of relation r counts as found in a direction when w's prediction
there is h: every arc is scored once per direction, so a head word with several dependents can
find them all. The baseline predicts h = w + k for one offset k per relation, by default
k ∈ {−3, …, −1, 1, …, 3} and unclipped (a prediction outside the sentence is wrong);
`baseline_offsets="authors"` uses the notebook's `offset_predictor` instead: k ∈ {−3, …, 2}
(k = 0 predicts the word itself), predictions clipped into [ROOT, last word]. The "all" row leaves
out root arcs by default; `include_root=True` counts them, as the notebook does (no head ever
predicts ROOT, so they count as misses, except for a clipped offset baseline landing on ROOT).
docs/fidelity.md sets each choice against the paper and the notebook; `analysis.clark` chooses
heads on dev and reports them on test (`analysis.attention.depheads`).

SAS (syntactic attention structure, Chen et al. 2023, "Sudden Drops in the Loss") is the
unlabeled attachment score of the parse that the best head implies, per relation and over all
words, beside the best fixed-offset baseline. The definition is the authors'
`attention_depparse_probe.py` (github angie-chen55/sudden-drops-in-the-loss, itself Clark et al.'s
notebook), i.e. these counts in the notebook's variant (`sas_counts`); docs/tracking.md sets each
choice against their code:

- word-level attention: to a word the sum over its pieces, from a word the mean over its pieces'
  rows (their `get_word_word_attention(..., mode="mean")`; `sieves.wordattn`'s default);
- a head predicts, for each word, the most-attended word other than itself, [CLS] and [SEP]
  ("dep2head", their "dep->head"), or the word attending most to it ("head2dep", their
  "head<-dep", the transposed map); ROOT is never predicted;
- every word is scored once: the "all" row counts root words (always missed by a head) and
  punctuation, and is the SAS of a checkpoint; the per-relation rows count that relation's arcs;
- the baselines predict word i + k for k ∈ {−3, …, 2}, clipped into [ROOT, last word];
- the best (layer, head, direction) and the best offset are chosen on the data scored (no dev/test
  split, unlike `analysis.clark`), ties going as the authors' `sorted(...)[-1]` and `max(...)` send
  them: to the last (layer, head, direction) and the largest offset (`sas_table`).

The counts are fed either word maps (`DependencyCounts.update`: the analyses) or each word's
predicted heads computed elsewhere, e.g. on the device (`DependencyCounts.add`: the probes inside
pre-training); both predictions are `predicted_heads`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from sieves.wordattn import WordAttention

DIRECTIONS = ("dep2head", "head2dep")
BASELINE_OFFSETS = {"paper": (-3, -2, -1, 1, 2, 3), "authors": (-3, -2, -1, 0, 1, 2)}
ROOT = -1  # the head of a root word, for the arcs counted with include_root
OUTSIDE = np.iinfo(np.int64).min  # an unclipped prediction off the sentence: neither a word nor ROOT
ALL_RELATIONS = "all"
SAS_COLUMNS = ("relation", "count", "uas", "layer", "head", "direction", "baseline_offset", "baseline_uas")


def most_attended(maps, present, xp=np):
    """maps [..., W, W] → int [..., W]: each word's most-attended other word that owns a piece.

    `present` [..., W] (bool) broadcasts against maps' leading axes; `xp` is numpy or jax.numpy
    (the probes take the argmax on the device, over padded word slots that own no piece)."""
    width = maps.shape[-1]
    allowed = present[..., None, :] & ~xp.eye(width, dtype=bool)
    return xp.argmax(xp.where(allowed, maps, -xp.inf), axis=-1)


def predicted_heads(maps, present, xp=np):
    """[2 (DIRECTIONS), ..., W]: each word's predicted head from its row (dep2head) and from the
    transposed map (head2dep)."""
    return xp.stack([most_attended(maps, present, xp), most_attended(xp.swapaxes(maps, -1, -2), present, xp)])


class DependencyCounts:
    """Running counts, per relation, of arcs found by every head in both directions and by every
    offset; fed one sequence at a time."""

    def __init__(
        self, num_layers: int, num_heads: int, baseline_offsets: str = "paper", include_root: bool = False
    ) -> None:
        if baseline_offsets not in BASELINE_OFFSETS:
            raise ValueError(f"baseline_offsets must be one of {list(BASELINE_OFFSETS)}, got {baseline_offsets!r}")
        self.shape = (len(DIRECTIONS), num_layers, num_heads)
        self.offsets = BASELINE_OFFSETS[baseline_offsets]
        self.clip = baseline_offsets == "authors"
        self.include_root = include_root
        self.count: dict[str, int] = {}
        self.found: dict[str, np.ndarray] = {}
        self.offset_found: dict[str, np.ndarray] = {}

    def offset_predictions(self, words: np.ndarray, num_words: int) -> np.ndarray:
        """int [len(words), offsets]: each offset's predicted head of each word: clipped into
        [ROOT = −1, last word], or OUTSIDE where an unclipped one leaves the sentence."""
        predicted = words[:, None] + np.array(self.offsets)[None, :]
        if self.clip:
            return np.clip(predicted, ROOT, num_words - 1)
        return np.where((predicted >= 0) & (predicted < num_words), predicted, OUTSIDE)

    def _add(self, relation: str, count: int, found: np.ndarray, offset_found: np.ndarray) -> None:
        if relation not in self.count:
            self.count[relation] = 0
            self.found[relation] = np.zeros(self.shape, np.int64)
            self.offset_found[relation] = np.zeros(len(self.offsets), np.int64)
        self.count[relation] += count
        self.found[relation] += found
        self.offset_found[relation] += offset_found

    def update(self, word: WordAttention) -> None:
        """Count one sequence's arcs from its word maps (a sentence without words has none)."""
        if len(word.word_head):
            self.add(word.word_dep, word.word_head, word.present, predicted_heads(word.maps, word.present))

    def add(self, word_dep, word_head: np.ndarray, present: np.ndarray, predicted: np.ndarray) -> None:
        """Count one sentence's arcs; `predicted` [2, L, H, ≥ W] is each word's predicted head
        (`predicted_heads`; slots past W are padding)."""
        num_words = len(word_head)
        if self.include_root:
            roots = np.flatnonzero((word_head == np.arange(num_words)) & present)
            if roots.size:
                missed = np.zeros(self.shape, np.int64)  # a head predicts a word, never ROOT
                on_root = (self.offset_predictions(roots, num_words) == ROOT).sum(axis=0)
                self._add(ALL_RELATIONS, int(roots.size), missed, on_root)
        dependents = np.flatnonzero(word_head != np.arange(num_words))
        dependents = dependents[present[dependents] & present[word_head[dependents]]]
        if not dependents.size:
            return
        heads = word_head[dependents]
        found = predicted[..., dependents] == heads
        offsets_found = self.offset_predictions(dependents, num_words) == heads[:, None]
        labels = np.array([word_dep[i] for i in dependents])
        for relation in (*map(str, np.unique(labels)), ALL_RELATIONS):
            arcs = np.ones(len(dependents), bool) if relation == ALL_RELATIONS else labels == relation
            self._add(relation, int(arcs.sum()), found[..., arcs].sum(axis=-1), offsets_found[arcs].sum(axis=0))

    def consume(self, words: Iterable[WordAttention]) -> DependencyCounts:
        for word in words:
            self.update(word)
        return self

    def accuracy(self, relation: str) -> np.ndarray:
        """[direction, L, H] fraction of the relation's arcs found."""
        return self.found[relation] / self.count[relation]


def sas_counts(num_layers: int, num_heads: int, words: Iterable[WordAttention] = ()) -> DependencyCounts:
    """The running counts SAS is read from (the authors' offsets, root arcs in "all"), fed `words`."""
    return DependencyCounts(num_layers, num_heads, baseline_offsets="authors", include_root=True).consume(words)


def last_argmax(values: np.ndarray) -> int:
    """The flat index of the last maximum: the authors take `sorted(...)[-1]` of (score, ...) tuples."""
    flat = np.ravel(values)
    return flat.size - 1 - int(np.argmax(flat[::-1]))


def sas_table(counts: DependencyCounts) -> pd.DataFrame:
    """One row per relation ("all" first, then by arc count, most first): its arc count, the UAS
    of the best (layer, head, direction) and that head, the best offset and its UAS."""
    import pandas as pd  # here, not at the top: analysis.clark's parser reads BASELINE_OFFSETS

    relations = sorted(counts.count, key=lambda r: (r != ALL_RELATIONS, -counts.count[r], r))
    rows = []
    for relation in relations:
        # [L, H, direction]: the flat order is the authors' tuple order (layer, head, direction).
        accuracy = np.moveaxis(counts.accuracy(relation), 0, -1)
        layer, head, direction = np.unravel_index(last_argmax(accuracy), accuracy.shape)
        offset = last_argmax(counts.offset_found[relation])
        rows.append(
            {
                "relation": relation,
                "count": counts.count[relation],
                "uas": float(accuracy[layer, head, direction]),
                "layer": int(layer),
                "head": int(head),
                "direction": DIRECTIONS[direction],
                "baseline_offset": counts.offsets[offset],
                "baseline_uas": float(counts.offset_found[relation][offset] / counts.count[relation]),
            }
        )
    return pd.DataFrame(rows, columns=list(SAS_COLUMNS))


def sas(table: pd.DataFrame) -> float:
    """A checkpoint's SAS: the best head's UAS over all words (the first row the authors write)."""
    return float(table.loc[table["relation"] == ALL_RELATIONS, "uas"].iloc[0])
