"""Kovaleva et al. §4.4: how much attention every head pays to nouns, verbs, pronouns, subjects,
objects, negation words, [CLS] and [SEP] (the words' features from a spaCy parse).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sieves.align import EncodedSequence

FEATURES = ("noun", "verb", "pronoun", "subject", "object", "negation", "[CLS]", "[SEP]")

NOUN_TAGS = frozenset({"NOUN", "PROPN"})

SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass", "nsubj:pass"})

# UD `obj` is read as `dobj`; spaCy marks indirect objects `dative`.
OBJECT_DEPS = frozenset({"dobj", "iobj", "dative"})

NEGATIONS = frozenset({"not", "n't", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "cannot"})


def word_features(text: str, pos: str, dep: str) -> set[str]:
    """The word-level features of one parsed word; negation by whole-word match on its text."""
    found = set()
    if pos in NOUN_TAGS:
        found.add("noun")
    if pos == "VERB":
        found.add("verb")
    if pos == "PRON":
        found.add("pronoun")
    if dep in SUBJECT_DEPS:
        found.add("subject")
    if dep in OBJECT_DEPS:
        found.add("object")
    if text.lower().replace("’", "'") in NEGATIONS:
        found.add("negation")
    return found


def feature_occurrences(seq: EncodedSequence, word_texts: Sequence[str]) -> dict[str, list[np.ndarray]]:
    """Per feature, the piece positions of each occurrence (a word's pieces; each [CLS]/[SEP]).

    Words cut away by truncation own no piece and are skipped.
    """
    found: dict[str, list[np.ndarray]] = {f: [] for f in FEATURES}
    for word, (text, pos, dep) in enumerate(zip(word_texts, seq.word_pos, seq.word_dep, strict=True)):
        pieces = np.flatnonzero(seq.word_ids == word)
        if pieces.size:
            for feature in word_features(text, pos, dep):
                found[feature].append(pieces)
    found["[CLS]"] = [np.array([i]) for i in np.flatnonzero(seq.is_cls)]
    found["[SEP]"] = [np.array([i]) for i in np.flatnonzero(seq.is_sep)]
    return found


def feature_scores(columns: np.ndarray, occurrences: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    """Kovaleva's §4.4 score of one sequence: for each occurrence, the attention all real tokens
    pay to its pieces, over n (`column_mass`, [L, H, T]); the maximum over occurrences, [L, H].
    Features absent from the sequence are left out."""
    return {
        feature: np.max([columns[..., pieces].sum(-1) for pieces in where], axis=0)
        for feature, where in occurrences.items()
        if where
    }
