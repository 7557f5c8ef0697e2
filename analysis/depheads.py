"""Dependency heads (Clark et al. 2019, §4.2): whether the word a dependent attends to most is its
syntactic head (dependent → head), or the word attending most to a dependent is its head
(head → dependent), per relation.

Definitions, as in the authors' code (`attn_head_predictor`, modes "normal" and "transpose"): over
the words j ≠ i that kept a piece ([CLS]/[SEP] are not words, so they are excluded), head k
predicts for word i argmax_j α_k(i, j) in direction `dep2head` and argmax_j α_k(j, i) in
`head2dep`. An arc (dependent w, head h), w ≠ h, of relation r counts as found in a direction when
w's prediction there is h: every arc is scored once per direction, so a head word with several
dependents can find them all. The baseline predicts h = w + k for one offset k ∈ {−3, …, −1, 1,
…, 3} per relation. Heads and offsets are chosen on dev and reported on test.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from analysis.wordattn import WordAttention

DIRECTIONS = ("dep2head", "head2dep")
OFFSETS = (-3, -2, -1, 1, 2, 3)
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

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (len(DIRECTIONS), num_layers, num_heads)
        self.count: dict[str, int] = {}
        self.found: dict[str, np.ndarray] = {}
        self.offset_found: dict[str, np.ndarray] = {}

    def update(self, word: WordAttention) -> None:
        dependents = np.flatnonzero(word.word_head != np.arange(len(word.word_head)))
        dependents = dependents[word.present[dependents] & word.present[word.word_head[dependents]]]
        if not dependents.size:
            return
        heads = word.word_head[dependents]
        attends_most = most_attended(word.maps, word.present)  # [L, H, W]
        attended_most_by = most_attended(np.swapaxes(word.maps, -1, -2), word.present)
        found = np.stack([attends_most[..., dependents] == heads, attended_most_by[..., dependents] == heads])
        offsets_found = (dependents[:, None] + np.array(OFFSETS)[None, :]) == heads[:, None]
        labels = np.array([word.word_dep[i] for i in dependents])
        for relation in (*map(str, np.unique(labels)), ALL_RELATIONS):
            arcs = np.ones(len(dependents), bool) if relation == ALL_RELATIONS else labels == relation
            if relation not in self.count:
                self.count[relation] = 0
                self.found[relation] = np.zeros(self.shape, np.int64)
                self.offset_found[relation] = np.zeros(len(OFFSETS), np.int64)
            self.count[relation] += int(arcs.sum())
            self.found[relation] += found[..., arcs].sum(axis=-1)
            self.offset_found[relation] += offsets_found[arcs].sum(axis=0)

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
                    "baseline_offset": OFFSETS[offset],
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
