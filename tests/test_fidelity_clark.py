"""The authors' variants of Clark et al.'s analyses (docs/fidelity.md) against hand computations:
per-sequence surface averages, the notebook's clipped offset baseline and root arcs, and the
`" ".join(words)` text of `--word-text joined`."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from analysis import clark
from analysis.attention import pipeline as attention_pipeline
from analysis.attention import surface
from bertjax.errors import UserError
from sieves import depattn
from sieves.align import encode_batch
from sieves.parse import Word
from sieves.wordattn import WordAttention

STAT = {name: s for s, name in enumerate(surface.STATISTICS)}


def two_sequences_of_different_lengths():
    """Sequence 0 (n = 3) attends only to [CLS]; sequence 1 (n = 6) attends uniformly."""
    attention = np.zeros((1, 2, 1, 6, 6))
    attention[0, 0, 0, :3, 0] = 1.0
    attention[0, 1, 0] = 1.0 / 6
    real = np.arange(6)[None] < np.array([[3], [6]])
    is_cls = np.zeros((2, 6), bool)
    is_cls[:, 0] = True
    nothing = np.zeros((2, 6), bool)
    return attention, real, is_cls, nothing


@pytest.mark.parametrize(
    ("weighting", "cls", "entropy", "uniform"),
    [
        # 3 rows with [CLS] attention 1 and entropy 0; 6 rows with 1/6 and ln 6.
        ("tokens", (3 * 1 + 6 / 6) / 9, 6 * math.log(6) / 9, (3 * math.log(3) + 6 * math.log(6)) / 9),
        ("sequences", (1 + 1 / 6) / 2, (0 + math.log(6)) / 2, (math.log(3) + math.log(6)) / 2),
    ],
)
def test_surface_weighting_by_hand(weighting, cls, entropy, uniform):
    attention, real, is_cls, nothing = two_sequences_of_different_lengths()
    with jax.enable_x64(True):
        sums, counts = surface.surface_sums(jnp.asarray(attention), real, is_cls, nothing, nothing, weighting)
        means = np.asarray(sums)[0, 0] / np.asarray(counts)
    # float64 sums of ≤ 9 terms: 1e-12 is ~10⁴ times the rounding, and 10⁻³ of the gap between
    # the two weightings.
    assert means[STAT["cls"]] == pytest.approx(cls, rel=1e-12, abs=0)
    assert means[STAT["entropy"]] == pytest.approx(entropy, rel=1e-12, abs=0)
    # log n is taken in float32 whatever the attention's type: a few ulps on each of ≤ 9 terms.
    assert means[STAT["uniform_entropy"]] == pytest.approx(uniform, rel=9 * 4 * 2.0**-24, abs=0)
    # One [CLS] row per sequence: both weightings agree on it.
    assert means[STAT["entropy_cls"]] == pytest.approx(math.log(6) / 2, rel=1e-12, abs=0)
    expected_counts = {"tokens": 9, "sequences": 2}[weighting]
    assert np.asarray(counts)[STAT["cls"]] == expected_counts


def test_surface_weightings_agree_when_all_sequences_have_one_length():
    rng = np.random.default_rng(3)
    attention = rng.random((2, 3, 2, 5, 5))
    attention /= attention.sum(-1, keepdims=True)
    real = np.ones((3, 5), bool)
    flags = np.zeros((3, 5), bool)
    flags[:, 0] = True
    with jax.enable_x64(True):
        by = {w: surface.surface_sums(jnp.asarray(attention), real, flags, flags, flags, w) for w in surface.WEIGHTINGS}
        means = {w: np.asarray(s) / np.asarray(c) for w, (s, c) in by.items()}
    # float64 except the float32 log n of the uniform entropies (a few ulps).
    np.testing.assert_allclose(means["tokens"], means["sequences"], rtol=4 * 2.0**-24, atol=0)


def planted_words(heads: list[int], deps: list[str]) -> WordAttention:
    """One layer and head whose every word attends most to word 0 (the heads' guesses do not
    matter to the baseline)."""
    width = len(heads)
    maps = np.full((1, 1, width, width), 0.1)
    maps[..., 0] = 0.5
    return WordAttention(
        maps=maps, to_special=np.zeros((1, 1, width)), from_special=np.zeros((1, 1, width)),
        embeddings=np.zeros((width, 2)), present=np.ones(width, bool), word_dep=tuple(deps),
        word_head=np.asarray(heads), index=0,
    )  # fmt: skip


def test_authors_offsets_are_clipped_into_root_and_the_last_word():
    counts = depattn.DependencyCounts(1, 1, "authors")
    assert counts.offsets == (-3, -2, -1, 0, 1, 2)
    predicted = counts.offset_predictions(np.arange(4), 4)
    # Rows: words 0..3; columns: offsets −3..2; −1 is ROOT, 3 the last word.
    np.testing.assert_array_equal(
        predicted, [[-1, -1, -1, 0, 1, 2], [-1, -1, 0, 1, 2, 3], [-1, 0, 1, 2, 3, 3], [0, 1, 2, 3, 3, 3]]
    )
    unclipped = depattn.DependencyCounts(1, 1).offset_predictions(np.arange(4), 4)
    outside = depattn.OUTSIDE
    np.testing.assert_array_equal(unclipped[0], [outside, outside, outside, 1, 2, 3])


# w0 → w1 (nsubj), w1 root, w2 → w1 (dobj), w3 → w1 (punct).
HEADS, DEPS = [1, 1, 1, 1], ["nsubj", "root", "dobj", "punct"]


@pytest.mark.parametrize(
    ("offsets", "include_root", "count", "offset_found"),
    [
        # Unclipped ±1..3: w0 at +1, w2 at −1, w3 at −2.
        ("paper", False, 3, [0, 1, 1, 1, 0, 0]),
        # −3..2 clipped: the same arcs at +1, −1, −2; w2 at −3 lands on ROOT, which is not its head.
        ("authors", False, 3, [0, 1, 1, 0, 1, 0]),
        # ... and the root w1 at −3 and −2 is clipped onto ROOT: found.
        ("authors", True, 4, [1, 2, 1, 0, 1, 0]),
        # Unclipped offsets never reach ROOT: the root arc is counted and missed.
        ("paper", True, 4, [0, 1, 1, 1, 0, 0]),
    ],
)
def test_all_relations_row_by_hand(offsets, include_root, count, offset_found):
    counts = depattn.DependencyCounts(1, 1, offsets, include_root)
    counts.update(planted_words(HEADS, DEPS))
    assert counts.count["all"] == count
    np.testing.assert_array_equal(counts.offset_found["all"], offset_found)
    # Every word attends most to word 0 (itself excluded), so dep → head finds no arc (w0's
    # guess is w1: found) — one arc of the non-root ones, whatever happens to root arcs.
    assert counts.found["all"][0, 0, 0] == 1
    assert counts.accuracy("all")[0, 0, 0] == pytest.approx(1 / count)  # one float64 division: 1 ulp
    assert "root" not in counts.count  # roots join the "all" row only


def test_joined_word_text_gives_the_authors_tokenisation_of_a_contraction(minilm_tokenizer):
    text = "I don't know."
    words = (Word(0, 1, "nsubj", 3), Word(2, 4, "aux", 3), Word(4, 7, "advmod", 3),
             Word(8, 12, "root", 3), Word(12, 13, "punct", 3))  # fmt: skip
    joined, respanned = attention_pipeline.joined_words(text, words)
    assert joined == "I do n't know ."
    assert [joined[w.start : w.end] for w in respanned] == ["I", "do", "n't", "know", "."]

    def pieces_per_word(sentence, parse):
        (seq,) = encode_batch(minilm_tokenizer, [(sentence,)], [(parse,)])
        tokens = minilm_tokenizer.convert_ids_to_tokens(seq.input_ids.tolist())
        return [[t for t, w in zip(tokens, seq.word_ids, strict=True) if w == i] for i in range(len(parse))]

    # The authors' bpe_utils.tokenize_and_align splits "n't" on punctuation: n ' t.
    assert pieces_per_word(joined, respanned) == [["i"], ["do"], ["n", "'", "t"], ["know"], ["."]]
    # From the real text, BERT's "don" straddles both words and goes to "do".
    assert pieces_per_word(text, words) == [["i"], ["don"], ["'", "t"], ["know"], ["."]]


def test_clark_variant_flags_are_checked_and_recorded():
    config = clark.parse_args(
        ["--ckpt", "x", "--out", "o", "--surface-weighting", "sequences", "--baseline-offsets", "authors",
         "--all-relations-include-root", "--word-text", "joined"]
    )  # fmt: skip
    assert (config.surface_weighting, config.baseline_offsets) == ("sequences", "authors")
    assert config.all_relations_include_root and config.word_text == "joined"
    default = clark.parse_args(["--ckpt", "x", "--out", "o"])
    assert (default.surface_weighting, default.baseline_offsets, default.word_text) == ("tokens", "paper", "original")
    assert not default.all_relations_include_root
    with pytest.raises(UserError, match="--word-text"):
        attention_pipeline.ClarkConfig(ckpt="x", out="o", word_text="spaced")


# ---------------------------------------------------------------------------------------------
# --segment-ids zeros: the token type ids of the authors' extract_attention.py


def test_zero_segment_ids_change_the_surface_numbers_of_a_pair(tiny_hf, minilm_tokenizer):
    import bertjax

    model = bertjax.from_pretrained(tiny_hf)
    # A segment-B token type far from segment A's (not a constant vector, which LayerNorm would
    # remove), so feeding 0 instead of 1 must move attention.
    types = model.embeddings.token_type_embeddings.embedding
    types[...] = types[...].at[1].set(jnp.where(jnp.arange(types.shape[1]) % 2 == 0, 3.0, -3.0))
    (pair,) = encode_batch(minilm_tokenizer, [("The cat sat on the mat.", "It was warm there.")], None, 32)
    (zeros,) = attention_pipeline.with_segment_ids([pair], "zeros")
    assert pair.token_type_ids.any() and not zeros.token_type_ids.any()
    assert (zeros.is_sep == pair.is_sep).all() and (zeros.input_ids == pair.input_ids).all()
    assert attention_pipeline.with_segment_ids([pair], "pairs") == [pair]
    punct = minilm_tokenizer.convert_tokens_to_ids([".", ","])
    by_pairs, by_zeros = (surface.surface_statistics(model, [s], punct, 1, 32) for s in (pair, zeros))
    # Means of ≤ 32 float32 rows, each agreeing to ~32·2⁻²⁴ ≈ 2e-6 between two runs of one input;
    # the two inputs must differ by far more than that.
    assert np.abs(by_pairs - by_zeros)[..., : STAT["entropy_cls"] + 1].max() > 1e-3
    again = surface.surface_statistics(model, [zeros], punct, 1, 32)
    np.testing.assert_allclose(again, by_zeros, rtol=0, atol=32 * 2.0**-24)


def test_segment_ids_flag_is_checked_and_recorded():
    assert clark.parse_args(["--ckpt", "x", "--out", "o", "--segment-ids", "zeros"]).segment_ids == "zeros"
    assert clark.parse_args(["--ckpt", "x", "--out", "o"]).segment_ids == "pairs"
    with pytest.raises(UserError, match="--segment-ids"):
        attention_pipeline.ClarkConfig(ckpt="x", out="o", segment_ids="none")
