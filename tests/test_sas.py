"""SAS (Chen et al. 2023) against a slow transcription of the authors' `attention_depparse_probe.py`
on hand-made word-level attention; planted off-by-ones must be caught."""

from __future__ import annotations

import collections

import numpy as np
import pandas as pd
import pytest

from analysis.attention import sas
from sieves import depattn
from sieves.wordattn import WordAttention

LAYERS, HEADS = 2, 3


def random_sentence(rng: np.random.Generator, width: int) -> dict:
    """A random projective-or-not tree over `width` words (one root) with word-level attention over
    [CLS] + words + [SEP], in the authors' example layout: 1-based heads, 0 for ROOT."""
    root = int(rng.integers(width))
    heads = [0 if i == root else int(rng.choice([j for j in range(width) if j != i])) + 1 for i in range(width)]
    labels = ["nsubj", "obj", "amod", "punct", "nmod:poss"]
    relns = ["root" if i == root else str(rng.choice(labels)) for i in range(width)]
    attns = rng.dirichlet(np.ones(width + 2), size=(LAYERS, HEADS, width + 2))
    return {"words": [f"w{i}" for i in range(width)], "heads": heads, "relns": relns, "attns": attns}


def reference(data: list[dict]) -> dict[str, tuple]:
    """The authors' get_uas, loop by loop: per relation (uas, layer, head, direction) of the best
    head and (baseline uas, offset) of the best offset; "all" counts every word (root included).
    Their `poss` special case never fires on UD labels (`nmod:poss`), so it is left out."""

    def evaluate(predict) -> dict[str, float]:
        correct, total = collections.Counter(), collections.Counter()
        for example in data:
            for p, y, r in zip(predict(example), example["heads"], example["relns"], strict=True):
                for key in (r, "all"):
                    total[key] += 1
                    correct[key] += int(p == y)
        return {k: correct[k] / total[k] for k in total}

    def head_predictor(layer, head, transpose):
        def predict(example):
            attn = np.array(example["attns"][layer][head])
            if transpose:
                attn = attn.T
            attn[range(attn.shape[0]), range(attn.shape[0])] = 0
            return np.argmax(attn[1:-1, 1:-1], axis=-1) + 1

        return predict

    def offset_predictor(offset):
        return lambda ex: [max(0, min(i + offset + 1, len(ex["words"]))) for i in range(len(ex["words"]))]

    scores = {
        (layer, head, direction): evaluate(head_predictor(layer, head, direction == "head2dep"))
        for layer in range(LAYERS)
        for head in range(HEADS)
        for direction in ("dep2head", "head2dep")
    }
    baselines = {k: evaluate(offset_predictor(k)) for k in range(-3, 3)}
    out = {}
    for reln in scores[0, 0, "dep2head"]:
        if reln == "root":  # the authors skip its row; depheads keeps roots in "all" only
            continue
        out[reln] = (
            max((s[reln], *key) for key, s in scores.items()),
            max((s[reln], k) for k, s in baselines.items()),
        )
    return out


def word_attention(data: list[dict]) -> list[WordAttention]:
    return [
        WordAttention(
            maps=ex["attns"][:, :, 1:-1, 1:-1],
            to_special=None,
            from_special=None,
            embeddings=None,
            present=np.ones(len(ex["words"]), bool),
            word_dep=tuple(ex["relns"]),
            word_head=np.array([i if h == 0 else h - 1 for i, h in enumerate(ex["heads"])]),
            index=i,
        )
        for i, ex in enumerate(data)
    ]


def fast(data: list[dict]) -> pd.DataFrame:
    return depattn.sas_table(depattn.sas_counts(LAYERS, HEADS, word_attention(data)))


def assert_matches(table: pd.DataFrame, expected: dict[str, tuple]) -> None:
    assert sorted(table["relation"]) == sorted(expected)
    for row in table.itertuples():
        (uas, layer, head, direction), (baseline_uas, offset) = expected[row.relation]
        # Both are one division of the same two integers (float64): equal, not close.
        assert (row.uas, row.layer, row.head, row.direction) == (uas, layer, head, direction), row.relation
        assert (row.baseline_uas, row.baseline_offset) == (baseline_uas, offset), row.relation


@pytest.mark.parametrize("seed", range(4))
def test_sas_table_equals_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    data = [random_sentence(rng, int(rng.integers(2, 9))) for _ in range(6)]
    table = fast(data)
    assert_matches(table, reference(data))
    assert table["relation"].iloc[0] == "all" and depattn.sas(table) == table["uas"].iloc[0]
    assert table["count"].iloc[0] == sum(len(ex["words"]) for ex in data)  # every word, roots included


def test_ties_go_to_the_last_head_and_the_largest_offset():
    # Two words, w0 → w1: every head finds the arc both ways; offsets +1 and +2 (clipped onto w1)
    # find it too: the authors report layer 1, head 2, head<-dep, and offset +2.
    attns = np.ones((LAYERS, HEADS, 4, 4))
    data = [{"words": ["a", "b"], "heads": [2, 0], "relns": ["nsubj", "root"], "attns": attns}]
    row = fast(data).set_index("relation").loc["nsubj"]
    assert (row["uas"], row["layer"], row["head"], row["direction"]) == (1.0, 1, 2, "head2dep")
    assert (row["baseline_offset"], row["baseline_uas"]) == (2, 1.0)
    assert_matches(fast(data), reference(data))


def test_a_planted_off_by_one_in_the_prediction_fails(monkeypatch):
    rng = np.random.default_rng(0)
    data = [random_sentence(rng, int(rng.integers(3, 9))) for _ in range(6)]
    most_attended = depattn.most_attended
    monkeypatch.setattr(
        depattn, "most_attended", lambda maps, present, xp=np: (most_attended(maps, present, xp) + 1) % maps.shape[-1]
    )
    with pytest.raises(AssertionError):
        assert_matches(fast(data), reference(data))


def test_a_planted_off_by_one_in_the_offsets_fails(monkeypatch):
    rng = np.random.default_rng(1)
    data = [random_sentence(rng, int(rng.integers(3, 9))) for _ in range(6)]
    monkeypatch.setitem(depattn.BASELINE_OFFSETS, "authors", (-2, -1, 0, 1, 2, 3))
    with pytest.raises(AssertionError):
        assert_matches(fast(data), reference(data))


def test_counts_round_trip_through_arrays():
    rng = np.random.default_rng(2)
    counts = depattn.sas_counts(LAYERS, HEADS, word_attention([random_sentence(rng, 5) for _ in range(3)]))
    back = sas.counts_from_arrays(sas.counts_to_arrays(counts), LAYERS, HEADS)
    pd.testing.assert_frame_equal(depattn.sas_table(back), depattn.sas_table(counts))
