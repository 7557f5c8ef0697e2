"""Dependency heads (Clark et al. 2019, §4.2): whether the word a dependent attends to most is its
syntactic head (dependent → head), or the word attending most to a dependent is its head
(head → dependent), per relation.

Definitions (docs/fidelity.md sets each against the paper and the authors' `Syntax_Analysis`
notebook): over the words j ≠ i that kept a piece ([CLS]/[SEP] are not words, so they are
excluded), head k predicts for word i argmax_j α_k(i, j) in direction `dep2head` and argmax_j
α_k(j, i) in `head2dep` — the notebook's `attn_head_predictor` in modes "normal" and "transpose".
An arc (dependent w, head h), w ≠ h, of relation r counts as found in a direction when w's
prediction there is h: every arc is scored once per direction, so a head word with several
dependents can find them all. The baseline predicts h = w + k for one offset k per relation, by
default k ∈ {−3, …, −1, 1, …, 3} and unclipped (a prediction outside the sentence is wrong);
`baseline_offsets="authors"` uses the notebook's `offset_predictor` instead: k ∈ {−3, …, 2}
(k = 0 predicts the word itself), predictions clipped into [ROOT, last word]. The "all" row leaves
out root arcs by default; `include_root=True` counts them, as the notebook does (no head ever
predicts ROOT, so they count as misses, except for a clipped offset baseline landing on ROOT).
Heads and offsets are chosen on dev and reported on test.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from analysis.attention.wordattn import WordAttention

DIRECTIONS = ("dep2head", "head2dep")
BASELINE_OFFSETS = {"paper": (-3, -2, -1, 1, 2, 3), "authors": (-3, -2, -1, 0, 1, 2)}
ROOT = -1  # the head of a root word, for the arcs counted with include_root
OUTSIDE = np.iinfo(np.int64).min  # an unclipped prediction off the sentence: neither a word nor ROOT
ALL_RELATIONS = "all"
TABLE_COLUMNS = (
    "relation", "layer", "head", "direction", "dev_accuracy", "test_accuracy",
    "baseline_offset", "baseline_accuracy", "count",
)  # fmt: skip


def most_attended(maps: np.ndarray, present: np.ndarray) -> np.ndarray:
    """maps [..., W, W] → int [..., W]: each word's most-attended other word that owns a piece."""
    width = maps.shape[-1]
    allowed = present[None, :] & ~np.eye(width, dtype=bool)
    return np.argmax(np.where(allowed, maps, -np.inf), axis=-1)


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
        num_words = len(word.word_head)
        if self.include_root:
            roots = np.flatnonzero((word.word_head == np.arange(num_words)) & word.present)
            if roots.size:
                missed = np.zeros(self.shape, np.int64)  # a head predicts a word, never ROOT
                on_root = (self.offset_predictions(roots, num_words) == ROOT).sum(axis=0)
                self._add(ALL_RELATIONS, int(roots.size), missed, on_root)
        dependents = np.flatnonzero(word.word_head != np.arange(num_words))
        dependents = dependents[word.present[dependents] & word.present[word.word_head[dependents]]]
        if not dependents.size:
            return
        heads = word.word_head[dependents]
        attends_most = most_attended(word.maps, word.present)  # [L, H, W]
        attended_most_by = most_attended(np.swapaxes(word.maps, -1, -2), word.present)
        found = np.stack([attends_most[..., dependents] == heads, attended_most_by[..., dependents] == heads])
        offsets_found = self.offset_predictions(dependents, num_words) == heads[:, None]
        labels = np.array([word.word_dep[i] for i in dependents])
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


def dependency_table(dev: DependencyCounts, test: DependencyCounts) -> pd.DataFrame:
    """One row per (relation, direction) seen in both splits: the head best on dev, its dev and
    test accuracy, the offset best on dev and its test accuracy, and the test arc count."""
    rows = []
    for relation in sorted(set(dev.count) & set(test.count), key=lambda r: (r == ALL_RELATIONS, r)):
        dev_accuracy = dev.accuracy(relation)
        test_accuracy = test.accuracy(relation)
        offset = int(np.argmax(dev.offset_found[relation]))
        baseline = test.offset_found[relation][offset] / test.count[relation]
        for d, direction in enumerate(DIRECTIONS):
            layer, head = np.unravel_index(np.argmax(dev_accuracy[d]), dev_accuracy[d].shape)
            rows.append(
                {
                    "relation": relation,
                    "layer": int(layer),
                    "head": int(head),
                    "direction": direction,
                    "dev_accuracy": float(dev_accuracy[d, layer, head]),
                    "test_accuracy": float(test_accuracy[d, layer, head]),
                    "baseline_offset": dev.offsets[offset],
                    "baseline_accuracy": float(baseline),
                    "count": test.count[relation],
                }
            )
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def best_per_relation(table: pd.DataFrame) -> pd.DataFrame:
    """Per relation, the direction whose head is best on dev (the paper's one number per relation)."""
    chosen = table.loc[table.groupby("relation", sort=False)["dev_accuracy"].idxmax()]
    return chosen.reset_index(drop=True)


def format_summary(table: pd.DataFrame, min_count: int) -> str:
    """The paper's Table 1 layout: relation, best head (layer-head, 0-based), test accuracy and the
    offset baseline; relations with fewer than `min_count` test arcs are left out."""
    best = best_per_relation(table)
    best = best[(best["count"] >= min_count) | (best["relation"] == ALL_RELATIONS)]
    lines = [
        f"dependency heads (head and offset chosen on dev; accuracy on test; relations with ≥ {min_count} test arcs)",
        f"{'relation':<14}{'head':>8}  {'direction':<10}{'test acc':>9}{'baseline':>10}  {'offset':>6}{'arcs':>7}",
    ]
    for row in best.itertuples():
        mark = "  *" if row.test_accuracy > row.baseline_accuracy else ""
        lines.append(
            f"{row.relation:<14}{f'{row.layer}-{row.head}':>8}  {row.direction:<10}{100 * row.test_accuracy:>8.1f}%"
            f"{100 * row.baseline_accuracy:>9.1f}%  {row.baseline_offset:>+6d}{row.count:>7d}{mark}"
        )
    lines.append("* the head beats the best fixed-offset baseline on test")
    return "\n".join(lines)
