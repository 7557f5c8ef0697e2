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

Chosen on the trees it is scored on, the best of 2·L·H heads is flattered against the best of six
offsets. `sas_against_offsets` chooses both on one half of the sentences and scores them on the
other, with an interval from resampling that half's sentences: a relation's attention is called
syntactic only where the head beats the offset there (the interval's low end above 0). It reads
each sentence's counts, which `DependencyCounts` keeps beside the totals (`sentence_counts`).

The counts are fed either word maps (`DependencyCounts.update`: the analyses) or each word's
predicted heads computed elsewhere, e.g. on the device (`DependencyCounts.add`: the probes inside
pre-training); both predictions are `predicted_heads`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from sieves.wordattn import WordAttention

DIRECTIONS = ("dep2head", "head2dep")
BASELINE_OFFSETS = {"paper": (-3, -2, -1, 1, 2, 3), "authors": (-3, -2, -1, 0, 1, 2)}
ROOT = -1  # the head of a root word, for the arcs counted with include_root
OUTSIDE = np.iinfo(np.int64).min  # an unclipped prediction off the sentence: neither a word nor ROOT
ALL_RELATIONS = "all"
MARGIN_COLUMNS = ("relation", "layer", "head", "direction", "head_uas_b", "offset", "offset_uas_b", "margin", "low",
                  "high", "beats_offsets", "in_sample_margin")  # fmt: skip
MARGIN_INTERVAL = (0.05, 0.95)  # the quantiles of the margin's interval, as the track's other intervals
SAS_COLUMNS = ("relation", "count", "uas", "layer", "head", "direction", "baseline_offset", "baseline_uas")


class SentenceCounts(NamedTuple):
    """A relation's counts per sentence, row i for sentence `sentence[i]` (its place in the feed):
    its arcs (`count` int32 [m]), arcs found by each head (`found` int16 [m, 2, L, H], as
    `DependencyCounts.found`) and by each offset (`offset_found` int16 [m, offsets])."""

    sentence: np.ndarray
    # Shadows tuple.count on purpose (the arcs' count, as DependencyCounts.count); nothing calls it.
    count: np.ndarray  # type: ignore[assignment]
    found: np.ndarray
    offset_found: np.ndarray


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
        self.sentences = 0  # fed so far; a sentence's index is its place in the feed
        # Per relation, the rows of the sentences holding its arcs (`sentence_counts`), in chunks.
        self._rows: dict[str, list[SentenceCounts]] = {}

    def offset_predictions(self, words: np.ndarray, num_words: int) -> np.ndarray:
        """int [len(words), offsets]: each offset's predicted head of each word: clipped into
        [ROOT = −1, last word], or OUTSIDE where an unclipped one leaves the sentence."""
        predicted = words[:, None] + np.array(self.offsets)[None, :]
        if self.clip:
            return np.clip(predicted, ROOT, num_words - 1)
        return np.where((predicted >= 0) & (predicted < num_words), predicted, OUTSIDE)

    def _add(self, relation: str, sentence: int, count: int, found: np.ndarray, offset_found: np.ndarray) -> None:
        if relation not in self.count:
            self.count[relation] = 0
            self.found[relation] = np.zeros(self.shape, np.int64)
            self.offset_found[relation] = np.zeros(len(self.offsets), np.int64)
            self._rows[relation] = []
        self.count[relation] += count
        self.found[relation] += found
        self.offset_found[relation] += offset_found
        if count > np.iinfo(np.int16).max:  # found ≤ count: the int16 rows below would wrap
            raise ValueError(f"{count} arcs of {relation!r} in one sentence: more than the per-sentence rows hold")
        self._rows[relation].append(
            SentenceCounts(
                np.array([sentence], np.int32), np.array([count], np.int32),
                found.astype(np.int16)[None], offset_found.astype(np.int16)[None],
            )
        )  # fmt: skip

    def sentence_counts(self, relation: str) -> SentenceCounts:
        """The relation's arcs and arcs found per sentence, one row per sentence holding any."""
        rows = self._rows[relation]
        if len(rows) != 1:  # stacked once, kept stacked
            self._rows[relation] = rows = [SentenceCounts(*(np.concatenate(part) for part in zip(*rows, strict=True)))]
        return rows[0]

    def set_sentence_counts(self, relation: str, rows: SentenceCounts) -> None:
        """Restores a relation's per-sentence rows (its totals are set beside them)."""
        self._rows[relation] = [rows]

    def update(self, word: WordAttention) -> None:
        """Count one sequence's arcs from its word maps (a sentence without words has none, but
        takes its place in the feed)."""
        if len(word.word_head):
            self.add(word.word_dep, word.word_head, word.present, predicted_heads(word.maps, word.present))
        else:
            self.sentences += 1

    def add(self, word_dep, word_head: np.ndarray, present: np.ndarray, predicted: np.ndarray) -> None:
        """Count one sentence's arcs; `predicted` [2, L, H, ≥ W] is each word's predicted head
        (`predicted_heads`; slots past W are padding)."""
        sentence, num_words = self.sentences, len(word_head)
        self.sentences += 1
        # relation → (arcs, found [2, L, H], offset_found): one row per relation and sentence
        rows: dict[str, tuple] = {}
        if self.include_root:
            roots = np.flatnonzero((word_head == np.arange(num_words)) & present)
            if roots.size:
                missed = np.zeros(self.shape, np.int64)  # a head predicts a word, never ROOT
                on_root = (self.offset_predictions(roots, num_words) == ROOT).sum(axis=0)
                rows[ALL_RELATIONS] = (int(roots.size), missed, on_root)
        dependents = np.flatnonzero(word_head != np.arange(num_words))
        dependents = dependents[present[dependents] & present[word_head[dependents]]]
        if dependents.size:
            heads = word_head[dependents]
            found = predicted[..., dependents] == heads
            offsets_found = self.offset_predictions(dependents, num_words) == heads[:, None]
            labels = np.array([word_dep[i] for i in dependents])
            for relation in (*map(str, np.unique(labels)), ALL_RELATIONS):
                arcs = np.ones(len(dependents), bool) if relation == ALL_RELATIONS else labels == relation
                row = (int(arcs.sum()), found[..., arcs].sum(axis=-1), offsets_found[arcs].sum(axis=0))
                before = rows.get(relation)
                rows[relation] = row if before is None else tuple(x + y for x, y in zip(before, row, strict=True))
        for relation, (count, found_here, offset_here) in rows.items():
            self._add(relation, sentence, count, found_here, offset_here)

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


def table_order(counts: DependencyCounts) -> list[str]:
    """The relations as the SAS tables list them: "all" first, then by arc count, most first."""
    return sorted(counts.count, key=lambda r: (r != ALL_RELATIONS, -counts.count[r], r))


def sas_table(counts: DependencyCounts) -> pd.DataFrame:
    """One row per relation ("all" first, then by arc count, most first): its arc count, the UAS
    of the best (layer, head, direction) and that head, the best offset and its UAS."""
    import pandas as pd  # here, not at the top: analysis.clark's parser reads BASELINE_OFFSETS

    rows = []
    for relation in table_order(counts):
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


def split_halves(sentences: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The sentences 0 … sentences − 1 in two halves by a permutation from `rng`: (A, B), B
    taking the odd one."""
    order = rng.permutation(sentences)
    return order[: sentences // 2], order[sentences // 2 :]


def sas_against_offsets(counts: DependencyCounts, seed: int, replicates: int) -> pd.DataFrame:
    """Per relation (as `sas_table` lists them), the best head against the best fixed offset,
    each chosen on one half of the sentences (A, by found arcs, ties as `sas_table` breaks them)
    and scored on the other (B): `margin` = head_uas_b − offset_uas_b, its `low`–`high` interval
    the MARGIN_INTERVAL quantiles (inverted CDF) of the margin over `replicates` resamples of B's
    sentences (the same resamples for every relation; one without the relation's arcs is left
    out), `beats_offsets` = low > 0. `in_sample_margin` is `sas_table`'s reading, both chosen and
    scored on every sentence: it is biased up by the choice among many heads. A relation whose
    arcs are all in one half has no margin (its row is empty beside `in_sample_margin`)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    half_a, half_b = split_halves(counts.sentences, rng)
    draws = half_b[rng.integers(0, len(half_b), size=(replicates, len(half_b)))]
    # weights[r, s]: how often resample r drew sentence s
    weights = np.zeros((replicates, counts.sentences), np.int32)
    np.add.at(weights, (np.arange(replicates)[:, None], draws), 1)
    in_a, in_b = np.zeros(counts.sentences, bool), np.zeros(counts.sentences, bool)
    in_a[half_a], in_b[half_b] = True, True
    rows = []
    for relation in table_order(counts):
        in_sample = float(
            counts.accuracy(relation).max() - counts.offset_found[relation].max() / counts.count[relation]
        )
        per = counts.sentence_counts(relation)
        side_a, side_b = in_a[per.sentence], in_b[per.sentence]
        count_a, count_b = int(per.count[side_a].sum()), int(per.count[side_b].sum())
        if not count_a or not count_b:
            rows.append({"relation": relation, "beats_offsets": False, "in_sample_margin": in_sample})
            continue
        # [L, H, direction] and the last maximum: sas_table's choice, on half A's counts.
        found_a = np.moveaxis(per.found[side_a].sum(axis=0, dtype=np.int64), 0, -1)
        layer, head, direction = np.unravel_index(last_argmax(found_a), found_a.shape)
        offset = last_argmax(per.offset_found[side_a].sum(axis=0, dtype=np.int64))
        head_found = per.found[:, direction, layer, head].astype(np.int64)
        offset_found = per.offset_found[:, offset].astype(np.int64)
        head_uas = int(head_found[side_b].sum()) / count_b
        offset_uas = int(offset_found[side_b].sum()) / count_b
        drawn = weights[:, per.sentence]
        arcs = drawn @ per.count.astype(np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            margins = (drawn @ head_found) / arcs - (drawn @ offset_found) / arcs
        margins = margins[arcs > 0]
        low, high = np.quantile(margins, MARGIN_INTERVAL, method="inverted_cdf") if margins.size else (np.nan, np.nan)
        rows.append(
            {
                "relation": relation, "layer": int(layer), "head": int(head), "direction": DIRECTIONS[direction],
                "head_uas_b": head_uas, "offset": counts.offsets[offset], "offset_uas_b": offset_uas,
                "margin": head_uas - offset_uas, "low": float(low), "high": float(high),
                "beats_offsets": bool(low > 0), "in_sample_margin": in_sample,
            }
        )  # fmt: skip
    table = pd.DataFrame(rows, columns=list(MARGIN_COLUMNS))
    return table.astype({"layer": "Int64", "head": "Int64", "offset": "Int64", "beats_offsets": bool})
