"""Syntactic attention structure (SAS; Chen et al. 2023, "Sudden Drops in the Loss"): the unlabeled
attachment score of the parse that the best attention head implies, per relation and over all
words, beside the best fixed-offset baseline.

The definition is the authors' `attention_depparse_probe.py` (github angie-chen55/sudden-drops-in-
the-loss, itself Clark et al.'s `Syntax_Analysis` notebook), which is Clark et al.'s dependency-head
count (`depheads`) in its authors' variant; docs/tracking.md sets each choice against their code:

- word-level attention: attention to a word is the sum over its pieces, from a word the mean over
  its pieces' rows (their `get_word_word_attention(..., mode="mean")`; `wordattn`, the default);
- a head predicts, for each word, the most-attended word other than itself, [CLS] and [SEP]
  ("dep2head", their "dep->head"), or the word attending most to it ("head2dep", their
  "head<-dep", the transposed map); ROOT is never predicted;
- every word is scored once: the "all" row counts root words (always missed by a head) and
  punctuation, and is the SAS of a checkpoint; the per-relation rows count that relation's arcs;
- the baselines predict word i + k for k ∈ {−3, …, 2}, clipped into [ROOT, last word];
- the best (layer, head, direction) and the best offset are chosen on the data scored (no dev/test
  split, unlike `analysis.clark`), ties going as the authors' `sorted(...)[-1]` and `max(...)` send
  them: to the last (layer, head, direction) and the largest offset.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from analysis.attention.depheads import ALL_RELATIONS, DIRECTIONS, DependencyCounts
from analysis.attention.wordattn import WordAttention, iter_word_attention, make_word_attention_fn

SAS_COLUMNS = ("relation", "count", "uas", "layer", "head", "direction", "baseline_offset", "baseline_uas")


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


def score_sas(model, seqs, batch_size: int, max_length: int) -> DependencyCounts:
    """The SAS counts of `model` (a bare encoder) on encoded CoNLL-U sentences, batch by batch."""
    words = iter_word_attention(make_word_attention_fn(model), seqs, batch_size, max_length, desc="SAS")
    return sas_counts(model.config.num_hidden_layers, model.config.num_attention_heads, words)


def counts_to_arrays(counts: DependencyCounts, prefix: str = "sas") -> dict[str, np.ndarray]:
    """The counts as named arrays (for an .npz); `counts_from_arrays` reads them back."""
    arrays = {f"{prefix}/relations": np.array(list(counts.count))}
    for i, relation in enumerate(counts.count):
        arrays[f"{prefix}/{i}/count"] = np.array(counts.count[relation])
        arrays[f"{prefix}/{i}/found"] = counts.found[relation]
        arrays[f"{prefix}/{i}/offset_found"] = counts.offset_found[relation]
    return arrays


def counts_from_arrays(arrays, num_layers: int, num_heads: int, prefix: str = "sas") -> DependencyCounts:
    counts = sas_counts(num_layers, num_heads)
    for i, relation in enumerate(arrays[f"{prefix}/relations"].tolist()):
        counts.count[relation] = int(arrays[f"{prefix}/{i}/count"])
        counts.found[relation] = np.asarray(arrays[f"{prefix}/{i}/found"])
        counts.offset_found[relation] = np.asarray(arrays[f"{prefix}/{i}/offset_found"])
    return counts
