"""Coreference heads on GAP (Clark et al. 2019 §4.3, analysis/attention/coref.py): offsets → pieces
on hand-made texts, truncation around the pronoun, the per-head choice against a slow loop, accuracy
and its CI against a slow reference, the dev-chosen/test-scored split, and the CLI end to end."""

import json
import math
import statistics

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis import clark
from analysis.attention import coref
from bertjax.errors import UserError

F32 = 2.0**-24

TEXT = "Café owner Annabelle Kowalczyk met Bo Ng. Later she called Zoë Ångström."
BEFORE = "Before she left, Tsvetana Pironkova thanked Ólafur Arnalds."


def example(text: str, pronoun: str, a: str, b: str, label: int | None, nth_pronoun: int = 0) -> coref.GapExample:
    """A GAP example from the first occurrence of each name (and the given one of the pronoun)."""
    start = -1
    for _ in range(nth_pronoun + 1):
        start = text.index(pronoun, start + 1)
    spans = tuple((text.index(name), text.index(name) + len(name)) for name in (a, b))
    return coref.GapExample("x", text, (start, start + len(pronoun)), (a, b), spans, label)


def pieces_of(tokenizer, item: coref.CorefInput, which: np.ndarray) -> list[str]:
    return tokenizer.convert_ids_to_tokens(item.seq.input_ids[which].tolist())


# ---------------------------------------------------------------------------------------------
# Offsets → pieces


def test_span_pieces_follow_the_offsets_of_multi_piece_and_unicode_names(minilm_tokenizer):
    encoded = minilm_tokenizer(TEXT, add_special_tokens=False, return_offsets_mapping=True)
    offsets = np.asarray(encoded["offset_mapping"])
    tokens = minilm_tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    name = lambda s: [tokens[i] for i in coref.span_pieces(offsets, TEXT.index(s), TEXT.index(s) + len(s))]
    assert name("Annabelle Kowalczyk") == ["annabelle", "ko", "##wal", "##cz", "##yk"]
    # The accents are stripped from the pieces, not from the offsets: "Zoë Ångström" is 12 characters.
    assert name("Zoë Ångström") == ["zoe", "ang", "##strom"]
    assert name("Bo Ng") == ["bo", "ng"]
    # A span inside a piece still owns it; a span over the space between two words owns nothing.
    assert name("wal") == ["##wal"]
    gap = TEXT.index(" Kowalczyk")
    assert coref.span_pieces(offsets, gap, gap + 1).size == 0


@pytest.mark.parametrize(
    ("target", "a_pieces", "b_pieces"),
    [
        ("head", ["ko", "##wal", "##cz", "##yk"], ["ang", "##strom"]),
        ("sum", ["annabelle", "ko", "##wal", "##cz", "##yk"], ["zoe", "ang", "##strom"]),
        ("first", ["annabelle"], ["zoe"]),
    ],
)
def test_encoded_pronoun_and_candidates_are_their_pieces_after_cls(minilm_tokenizer, target, a_pieces, b_pieces):
    # Both names before the pronoun.
    item = coref.encode_gap(
        minilm_tokenizer, [example(TEXT, "she", "Annabelle Kowalczyk", "Zoë Ångström", 0)], 128, target
    )[0][0]
    assert pieces_of(minilm_tokenizer, item, np.array([0])) == ["[CLS]"]
    assert pieces_of(minilm_tokenizer, item, item.pronoun) == ["she"]
    assert pieces_of(minilm_tokenizer, item, item.targets[0]) == a_pieces
    assert pieces_of(minilm_tokenizer, item, item.targets[1]) == b_pieces
    assert pieces_of(minilm_tokenizer, item, item.mentions[1]) == ["zoe", "ang", "##strom"]
    assert not item.truncated and item.label == 0


def test_names_after_the_pronoun(minilm_tokenizer):
    item = coref.encode_gap(minilm_tokenizer, [example(BEFORE, "she", "Tsvetana Pironkova", "Ólafur Arnalds", 1)], 128)[
        0
    ][0]
    assert item.pronoun.tolist() == [2]  # [CLS] before she
    assert pieces_of(minilm_tokenizer, item, item.targets[0]) == ["pi", "##ron", "##kova"]
    assert pieces_of(minilm_tokenizer, item, item.targets[1]) == ["ar", "##nal", "##ds"]
    assert pieces_of(minilm_tokenizer, item, item.mentions[0]) == ["ts", "##vet", "##ana", "pi", "##ron", "##kova"]


# ---------------------------------------------------------------------------------------------
# Any mention of a candidate (Clark et al.) or the marked one

REPEATED = "Bo Ng met Ann Lee. Ann Lee waved, Bo smiled, and she left; Ann Lee's car and Bo Ng's stayed."


def test_every_word_bounded_occurrence_of_a_name_is_a_mention_and_ambiguous_ones_are_not():
    item = example(REPEATED, "she", "Bo Ng", "Ann Lee", 1)
    a, b = coref.name_occurrences(item)
    at = lambda spans: [REPEATED[s:e] + f"@{s}" for s, e in spans]
    # The marked occurrence first; "Bo" alone is not the name, "Bo Ng's" is (a word boundary at ').
    assert at(a) == ["Bo Ng@0", f"Bo Ng@{REPEATED.rindex('Bo Ng')}"]
    assert at(b) == ["Ann Lee@10", "Ann Lee@19", f"Ann Lee@{REPEATED.rindex('Ann Lee')}"]
    # "Ann Lee" inside "Ann Leeward" is no word-bounded occurrence.
    assert len(coref.name_occurrences(example(REPEATED + " Ann Leeward", "she", "Bo Ng", "Ann Lee", 1))[1]) == 3
    # A shorter name inside the other candidate's longer one is the longer one's.
    text = "Ng met Bo Ng. Later Ng said she would stay with Bo Ng."
    short, long = coref.name_occurrences(example(text, "she", "Ng", "Bo Ng", 0))
    assert [text[s:e] + f"@{s}" for s, e in short] == ["Ng@0", "Ng@20"]
    assert [text[s:e] + f"@{s}" for s, e in long] == ["Bo Ng@7", f"Bo Ng@{text.rindex('Bo Ng')}"]
    # The same name for both candidates: only the marked occurrences.
    twin = "Lee met Lee, and Lee said she was glad."
    gap = coref.GapExample("x", twin, (twin.index("she"), twin.index("she") + 3), ("Lee", "Lee"), ((0, 3), (8, 11)), 0)
    assert coref.name_occurrences(gap) == ([(0, 3)], [(8, 11)])


def test_all_mentions_sum_every_occurrence_and_marked_only_the_marked_one(minilm_tokenizer):
    item = example(REPEATED, "she", "Bo Ng", "Ann Lee", 1)
    (every,), counts = coref.encode_gap(minilm_tokenizer, [item], 128, "head", "all")
    (marked,), marked_counts = coref.encode_gap(minilm_tokenizer, [item], 128, "head", "marked")
    assert pieces_of(minilm_tokenizer, every, every.targets[0]) == ["ng", "ng"]
    assert pieces_of(minilm_tokenizer, every, every.targets[1]) == ["lee", "lee", "lee"]
    assert pieces_of(minilm_tokenizer, marked, marked.targets[1]) == ["lee"]
    assert every.targets[1][0] == marked.targets[1][0]  # the marked one is among them
    assert (counts["other_mentions"], counts["antecedent_repeated"]) == (3, 1)
    assert all(type(v) is int for v in counts.values())  # run.json writes them as numbers
    assert (marked_counts["other_mentions"], marked_counts["antecedent_repeated"]) == (0, 0)
    (first,), _ = coref.encode_gap(minilm_tokenizer, [item], 128, "first", "all")
    assert pieces_of(minilm_tokenizer, first, first.targets[1]) == ["ann", "ann", "ann"]
    with pytest.raises(ValueError, match="mentions must be one of"):
        coref.encode_gap(minilm_tokenizer, [item], 128, "head", "some")


def test_a_head_attending_to_an_unmarked_mention_is_right_only_when_any_mention_counts(minilm_tokenizer):
    # The pronoun gives 0.6 to the second, unmarked "Ann Lee" (the antecedent) and 0.4 to the
    # marked "Bo Ng": Clark et al.'s reading counts it right, the marked-only one wrong.
    item = example(REPEATED, "she", "Bo Ng", "Ann Lee", 1)
    choices = {}
    for mentions in coref.MENTIONS:
        (encoded,), _ = coref.encode_gap(minilm_tokenizer, [item], 128, "head", mentions)
        length = encoded.seq.length
        unmarked = encoded.seq.input_ids.tolist().index(
            minilm_tokenizer.convert_tokens_to_ids("lee"), encoded.targets[1][0] + 1
        )
        attention = np.full((1, 1, 1, length, length), 1.0 / length, np.float32)
        attention[..., encoded.pronoun, :] = 0.0
        attention[..., encoded.pronoun, unmarked] = 0.6
        attention[..., encoded.pronoun, encoded.targets[0][0]] = 0.4
        to, owners = coref.mention_masks([encoded], length, 1)
        weights = coref.pronoun_weights(encoded, length)[None]
        scores = np.asarray(coref.candidate_attention(*map(jnp.asarray, (attention, weights, to, owners))))
        choices[mentions] = bool(coref.correct_choices(scores[0], np.array([1]))[0, 0])
    assert choices == {"all": True, "marked": False}


def test_baselines_read_every_counted_occurrence(minilm_tokenizer):
    # Bo Ng's marked occurrence is farther from "she" than Ann Lee's (3 pieces), but its second
    # occurrence is 2 pieces after it.
    text = "Bo Ng met Ann Lee. Then she and Bo Ng left."
    item = example(text, "she", "Bo Ng", "Ann Lee", 0)
    every, _ = coref.encode_gap(minilm_tokenizer, [item], 128, "head", "all")
    marked, _ = coref.encode_gap(minilm_tokenizer, [item], 128, "head", "marked")
    assert coref.baseline_correct(every)["nearest"].tolist() == [True]
    assert coref.baseline_correct(marked)["nearest"].tolist() == [False]


# ---------------------------------------------------------------------------------------------
# Truncation around the pronoun


@pytest.mark.parametrize("length", range(1, 9))
@pytest.mark.parametrize("width", range(1, 9))
def test_window_holds_the_mentions_as_central_as_allowed(length, width):
    for lo in range(length):
        for hi in range(lo, length):
            for centre in range(length):
                start = coref.window(length, width, lo, hi, centre)
                feasible = [s for s in range(max(length - width, 0) + 1) if s <= lo and hi < s + width]
                if not feasible:
                    assert start is None
                    continue
                # The slow reference: of the windows holding lo … hi, the one whose start is
                # nearest the start that centres the pronoun (the earlier on a tie).
                assert start == min(feasible, key=lambda s: (abs(s - (centre - width // 2)), s))


def test_truncation_keeps_both_candidates_and_counts_what_is_cut_or_skipped(minilm_tokenizer):
    filler = "The weather was fine that day. " * 30
    far = "Zoë Ångström arrived. " + filler + "Then she called Bo Ng."
    # Zoë Ångström's second occurrence lies beyond the window: cut, and counted as cut.
    near = filler + "Annabelle Kowalczyk met Bo Ng, and later she called Zoë Ångström. " + filler + "Zoë Ångström left."
    examples = [
        example(near, "she", "Annabelle Kowalczyk", "Zoë Ångström", 1),
        example(far, "she", "Zoë Ångström", "Bo Ng", 0),
        example(TEXT, "she", "Annabelle Kowalczyk", "Zoë Ångström", None),
        example(TEXT, "she", "Annabelle Kowalczyk", "Zoë Ångström", 0),
    ]
    inputs, counts = coref.encode_gap(minilm_tokenizer, examples, 32, "sum")
    assert counts == {"rows": 4, "neither": 1, "truncated": 1, "skipped_too_long": 1, "scored": 2,
                      "other_mentions": 0, "other_mentions_cut": 1, "antecedent_repeated": 0}  # fmt: skip
    cut = inputs[0]
    assert cut.truncated and cut.seq.length == 32 and not inputs[1].truncated
    assert pieces_of(minilm_tokenizer, cut, np.array([0, 31])) == ["[CLS]", "[SEP]"]
    assert pieces_of(minilm_tokenizer, cut, cut.pronoun) == ["she"]
    assert pieces_of(minilm_tokenizer, cut, cut.targets[0]) == ["annabelle", "ko", "##wal", "##cz", "##yk"]
    assert pieces_of(minilm_tokenizer, cut, cut.targets[1]) == ["zoe", "ang", "##strom"]
    # The window is the feasible one nearest to centring the pronoun, so text stays on both sides.
    assert cut.mentions[0].min() > 1 and cut.mentions[1].max() < 30


# ---------------------------------------------------------------------------------------------
# The heads' choices, accuracy and its CI


def test_candidate_attention_matches_a_slow_loop():
    rng = np.random.default_rng(0)
    batch, layers, heads, length = 3, 2, 3, 7
    attention = rng.dirichlet(np.ones(length), size=(batch, layers, heads, length)).astype(np.float32)
    from_weights = np.zeros((batch, length), np.float32)
    to_masks = np.zeros((batch, 2, length), np.float32)
    from_weights[0, 2] = 1
    from_weights[1, [3, 4]] = 0.5
    from_weights[2, 6] = 1
    to_masks[0, 0, [4, 5]], to_masks[0, 1, 1] = 1, 1
    to_masks[1, 0, 1], to_masks[1, 1, [5, 6]] = 1, 1
    to_masks[2, 0, 0], to_masks[2, 1, [1, 2, 3]] = 1, 1
    owners = np.tile(np.arange(2, dtype=np.int32), (batch, 1))  # one mention per candidate
    got = np.asarray(
        coref.candidate_attention(
            jnp.asarray(attention), jnp.asarray(from_weights), jnp.asarray(to_masks), jnp.asarray(owners)
        )
    )
    expected = np.zeros((batch, layers, heads, 2))
    for b in range(batch):
        for layer in range(layers):
            for head in range(heads):
                for c in range(2):
                    for t in range(length):
                        for s in range(length):
                            expected[b, layer, head, c] += (
                                from_weights[b, t] * attention[b, layer, head, t, s] * to_masks[b, c, s]
                            )
    # float32 sums of T² = 49 products of numbers ≤ 1: ≤ 49 · 2⁻²⁴ ≈ 3e-6.
    np.testing.assert_allclose(got, expected, rtol=0, atol=length**2 * F32)


def test_a_candidate_scores_its_most_attended_mention_not_the_sum():
    """Clark et al.: right when the most-attended mention is the antecedent's. Candidate 0 has two
    mentions of 0.3 each, candidate 1 one of 0.4: the sum would choose 0, the maximum chooses 1;
    a padding row (owner −1) counts for neither."""
    length = 6
    attention = np.zeros((1, 1, 1, length, length), np.float32)
    attention[..., 0, [1, 2, 3, 4]] = [0.3, 0.3, 0.4, 0.0]
    attention[..., 0, 5] = 0.0
    from_weights = np.zeros((1, length), np.float32)
    from_weights[0, 0] = 1.0
    to_masks = np.zeros((1, 4, length), np.float32)
    to_masks[0, 0, 1], to_masks[0, 1, 2], to_masks[0, 2, 3], to_masks[0, 3, 1:4] = 1, 1, 1, 1
    owners = np.array([[0, 0, 1, -1]], np.int32)
    got = np.asarray(coref.candidate_attention(*map(jnp.asarray, (attention, from_weights, to_masks, owners))))
    np.testing.assert_allclose(got[0, 0, 0], [0.3, 0.4], rtol=0, atol=4 * F32)
    assert coref.correct_choices(got[0], np.array([1]))[0, 0]


def test_a_tie_is_wrong_and_the_label_picks_the_candidate():
    scores = np.array([[0.3, 0.1], [0.3, 0.1], [0.2, 0.2]])
    assert coref.correct_choices(scores, np.array([0, 1, 0])).tolist() == [True, False, False]


def test_accuracy_and_ci_match_a_slow_reference():
    rng = np.random.default_rng(1)
    outcomes = rng.random((40, 2, 3)) < np.array([0.5, 0.7, 0.8])
    assert not (outcomes == outcomes[:1]).all(axis=0).any()  # constant outcomes are the next test's
    got = coref.accuracy(outcomes)
    for layer in range(2):
        for head in range(3):
            x = [float(v) for v in outcomes[:, layer, head]]
            mean, sd = statistics.fmean(x), statistics.stdev(x)
            half = stats.t.ppf(0.975, len(x) - 1) * sd / math.sqrt(len(x))
            # float64 sums of 40 terms ≤ 1: ~40 · 2⁻⁵³; 1e-12 is far above that and far below an error.
            assert got["accuracy"][layer, head] == pytest.approx(mean, abs=1e-12)
            assert got["ci_low"][layer, head] == pytest.approx(mean - half, abs=1e-12)
            assert got["ci_high"][layer, head] == pytest.approx(mean + half, abs=1e-12)
            p = stats.ttest_1samp(x, 0.5, alternative="greater").pvalue
            assert got["p_chance"][layer, head] == pytest.approx(p, rel=1e-9)
    assert (got["n"] == 40).all()


def test_all_right_gives_a_zero_width_interval_and_no_p():
    # The t interval of one_sided_test: a constant sample has SD 0 and no t statistic.
    got = coref.accuracy(np.ones((5, 1), bool))
    assert (got["accuracy"][0], got["ci_low"][0], got["ci_high"][0]) == (1.0, 1.0, 1.0)
    assert math.isnan(got["p_chance"][0])


def test_heads_are_chosen_on_dev_and_scored_on_test():
    dev = np.zeros((10, 2, 3), bool)
    test = np.zeros((10, 2, 3), bool)
    dev[:8, 1, 2] = True  # best on dev: 1-2 (80 %) ...
    dev[:6, 0, 0] = True  # ... and 0-0 in layer 0 (60 %)
    test[:4, 1, 2] = True  # ... but on test 1-2 has 40 % ...
    test[:, 1, 0] = True  # ... and 1-0, never chosen, has 100 %
    test[:7, 0, 0] = True
    table = coref.head_table(dev, test)
    best = coref.best_head(table)
    assert (best["layer"], best["head"], best["dev_accuracy"], best["test_accuracy"]) == (1, 2, 0.8, 0.4)
    per_layer = coref.best_per_layer(table)
    assert per_layer[["layer", "head"]].values.tolist() == [[0, 0], [1, 2]]
    assert per_layer["test_accuracy"].tolist() == [0.7, 0.4]


def test_baselines_nearest_and_earlier(minilm_tokenizer):
    # "she" is 6 pieces after the end of A and 1 (2) before the start (end) of B: B is nearest;
    # in the second text B ends 2 pieces before it. A comes first in both.
    texts = [example(TEXT, "she", "Annabelle Kowalczyk", "Zoë Ångström", 0),
             example("Annabelle Kowalczyk met Zoë Ångström and she smiled.", "she", "Annabelle Kowalczyk", "Zoë Ångström", 1)]  # fmt: skip
    inputs, _ = coref.encode_gap(minilm_tokenizer, texts, 128)
    got = coref.baseline_correct(inputs)
    assert got["nearest"].tolist() == [False, True]
    assert got["earlier"].tolist() == [True, False]


def choices_of_planted_head(minilm_tokenizer, weights_of) -> list[bool]:
    """A head whose pronoun row attends to the candidate that corefers and whose every other row
    attends to the other one; `weights_of(item, length)` gives the pronoun's row weights."""
    examples = [example(TEXT, "she", "Annabelle Kowalczyk", "Zoë Ångström", label) for label in (0, 1)]
    examples.append(example(BEFORE, "she", "Tsvetana Pironkova", "Ólafur Arnalds", 1))
    inputs, _ = coref.encode_gap(minilm_tokenizer, examples, 128)
    correct = []
    for item in inputs:
        length = item.seq.length
        attention = np.zeros((1, 1, 1, length, length), np.float32)
        attention[..., :, item.targets[1 - item.label][0]] = 1.0
        attention[..., item.pronoun, :] = 0.0
        attention[..., item.pronoun, item.targets[item.label][0]] = 1.0
        to, owners = coref.mention_masks([item], length, 1)
        scores = coref.candidate_attention(
            jnp.asarray(attention), jnp.asarray(weights_of(item, length)[None]), jnp.asarray(to), jnp.asarray(owners)
        )
        correct.append(bool(coref.correct_choices(np.asarray(scores)[0], np.array([item.label]))[0, 0]))
    return correct


def test_the_pronoun_row_is_the_one_read_and_a_shifted_row_fails(minilm_tokenizer):
    assert choices_of_planted_head(minilm_tokenizer, coref.pronoun_weights) == [True, True, True]
    assert (
        choices_of_planted_head(minilm_tokenizer, lambda i, n: coref.pronoun_weights(i, n, first_piece=True))
        == [True] * 3
    )

    # Planted bug: the pronoun's piece index without the [CLS] shift (the row before it).
    def unshifted(item, length):
        weights = np.zeros(length, np.float32)
        weights[item.pronoun - 1] = 1.0
        return weights

    assert choices_of_planted_head(minilm_tokenizer, unshifted) == [False, False, False]


# ---------------------------------------------------------------------------------------------
# Reading GAP, and the CLI


def write_gap(path, rows):
    header = "\t".join(coref.GAP_COLUMNS)
    path.write_text("\n".join([header, *("\t".join(map(str, r)) for r in rows)]) + "\n", encoding="utf-8")


def test_read_gap_names_the_bad_row(tmp_path):
    good = [
        "d-1",
        TEXT,
        "she",
        TEXT.index("she"),
        "Bo Ng",
        TEXT.index("Bo Ng"),
        "TRUE",
        "Zoë Ångström",
        TEXT.index("Zoë"),
        "FALSE",
        "u",
    ]
    write_gap(tmp_path / "g.tsv", [good])
    (read,) = coref.read_gap(tmp_path / "g.tsv")
    assert read.label == 0 and TEXT[slice(*read.spans[1])] == "Zoë Ångström"
    shifted = [*good[:5], TEXT.index("Bo Ng") + 1, *good[6:]]
    write_gap(tmp_path / "g.tsv", [good, shifted])
    with pytest.raises(UserError, match=r"g\.tsv, line 3: A 'Bo Ng' is not at offset"):
        coref.read_gap(tmp_path / "g.tsv")
    write_gap(tmp_path / "g.tsv", [[*good[:6], "yes", *good[7:]]])
    with pytest.raises(UserError, match="line 2: A-coref must be TRUE or FALSE"):
        coref.read_gap(tmp_path / "g.tsv")


@pytest.mark.slow
def test_cli_writes_the_coref_outputs(tiny_hf, shared_data, tmp_path, capsys):
    out = tmp_path / "coref"
    clark.main(["--ckpt", str(tiny_hf), "--out", str(out), "--data-dir", str(shared_data), "--analyses", "coref",
                "--gap-n", "24", "--max-length", "64", "--batch-size", "8"])  # fmt: skip
    assert {"coref_heads.csv", "coref_best_per_layer.csv", "coref_baselines.csv", "coref_accuracy.png"} <= {
        p.name for p in out.iterdir()
    }
    heads = pd.read_csv(out / "coref_heads.csv")
    assert list(heads.columns) == list(coref.HEAD_COLUMNS) and len(heads) == 2 * 2
    assert heads["test_accuracy"].between(0, 1).all()
    assert list(pd.read_csv(out / "coref_baselines.csv")["baseline"]) == list(coref.BASELINES)
    results = json.loads((out / "run.json").read_text())["results"]
    for split in ("dev", "test"):
        counts = results[f"coref_{split}"]
        # 64 positions cut most GAP texts: every scored one is kept in a window or counted as skipped.
        assert counts["rows"] == 24 and counts["truncated"] > 0
        assert counts["scored"] + counts["skipped_too_long"] + counts["neither"] == 24
        assert heads[f"{split}_n"].eq(counts["scored"]).all()
    assert "best head" in capsys.readouterr().out


def test_coref_without_gap_is_one_error_line(tiny_hf, tmp_path, cli_error):
    out = tmp_path / "out"
    error = cli_error(
        clark.main, ["--ckpt", str(tiny_hf), "--out", str(out), "--data-dir", str(tmp_path), "--analyses", "coref"]
    )
    assert (
        error == f"error: {tmp_path / 'gap' / 'gap-development.tsv'}: no such file (GAP is expected under --data-dir)"
    )
    assert not out.exists()
