"""Syntactic attention structure (SAS; Chen et al. 2023, "Sudden Drops in the Loss") of a
checkpoint: its word-level attention (`analysis.attention.wordattn`) fed to the counts that SAS is
read from, and those counts (totals and per-sentence rows) as named arrays for `analysis.track`'s
cache.

The definition and the table (`sas_counts`, `sas_table`, `sas`) are `sieves.depattn`'s, shared
with the probes inside pre-training (`train.probe`); docs/tracking.md sets each choice against the
authors' code.
"""

from __future__ import annotations

import numpy as np

from analysis.attention.wordattn import iter_word_attention, make_word_attention_fn
from sieves.depattn import DependencyCounts, SentenceCounts, sas_counts


def score_sas(model, seqs, batch_size: int, max_length: int, allowed: bool = False) -> DependencyCounts:
    """The SAS counts of `model` (a bare encoder) on encoded CoNLL-U sentences, batch by batch; a
    word attention that is not finite stops the run (`iter_word_attention`, `allowed` its)."""
    words = iter_word_attention(
        make_word_attention_fn(model), seqs, batch_size, max_length, desc="SAS", allowed=allowed
    )
    return sas_counts(model.config.num_hidden_layers, model.config.num_attention_heads, words)


def counts_to_arrays(counts: DependencyCounts, prefix: str = "sas") -> dict[str, np.ndarray]:
    """The counts as named arrays (for an .npz); `counts_from_arrays` reads them back."""
    arrays = {f"{prefix}/relations": np.array(list(counts.count)), f"{prefix}/sentences": np.array(counts.sentences)}
    for i, relation in enumerate(counts.count):
        arrays[f"{prefix}/{i}/count"] = np.array(counts.count[relation])
        arrays[f"{prefix}/{i}/found"] = counts.found[relation]
        arrays[f"{prefix}/{i}/offset_found"] = counts.offset_found[relation]
        for field, values in counts.sentence_counts(relation)._asdict().items():
            arrays[f"{prefix}/{i}/sentence_{field}"] = values
    return arrays


def counts_from_arrays(arrays, num_layers: int, num_heads: int, prefix: str = "sas") -> DependencyCounts:
    counts = sas_counts(num_layers, num_heads)
    counts.sentences = int(arrays[f"{prefix}/sentences"])
    for i, relation in enumerate(arrays[f"{prefix}/relations"].tolist()):
        counts.count[relation] = int(arrays[f"{prefix}/{i}/count"])
        counts.found[relation] = np.asarray(arrays[f"{prefix}/{i}/found"])
        counts.offset_found[relation] = np.asarray(arrays[f"{prefix}/{i}/offset_found"])
        rows = {field: np.asarray(arrays[f"{prefix}/{i}/sentence_{field}"]) for field in SentenceCounts._fields}
        counts.set_sentence_counts(relation, SentenceCounts(**rows))
    return counts
