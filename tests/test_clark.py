"""Clark et al. 2019 analyses: word-level attention, dependency heads, surface statistics, JS
divergence and MDS, attention gradients, probes, and the CLI end to end."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import jensenshannon
from transformers import BertTokenizerFast

import bertjax
from analysis import clark
from analysis.attention import depheads, gradients, probes, surface
from analysis.attention import pipeline as attention_pipeline
from bertjax.config import BertConfig
from sieves import depattn
from sieves.align import EncodedSequence
from sieves.wordattn import WordAttention, pooling_matrices, word_attention

# ---------------------------------------------------------------------------------------------
# Word-level attention


def test_word_attention_matches_a_hand_worked_example():
    # [CLS] w0 w1a w1b w2 [SEP]: word 1 is split into two pieces.
    word_ids = np.array([-1, 0, 1, 1, 2, -1])
    attention = np.array(
        [
            [0.5, 0.1, 0.1, 0.1, 0.1, 0.1],
            [0.1, 0.2, 0.3, 0.1, 0.2, 0.1],
            [0.0, 0.4, 0.2, 0.2, 0.1, 0.1],
            [0.2, 0.2, 0.0, 0.4, 0.0, 0.2],
            [0.1, 0.1, 0.3, 0.3, 0.1, 0.1],
            [0.1, 0.1, 0.1, 0.1, 0.1, 0.5],
        ]
    )
    from_words, to_words = pooling_matrices(word_ids, 3)
    # Row of w1 = mean of the rows of its pieces; column of w1 = sum of its pieces' columns.
    expected = np.array(
        [
            [0.2, 0.3 + 0.1, 0.2],
            [(0.4 + 0.2) / 2, ((0.2 + 0.2) + (0.0 + 0.4)) / 2, (0.1 + 0.0) / 2],
            [0.1, 0.3 + 0.3, 0.1],
        ]
    )
    # float64 matrix products of ≤ 6 terms each way: ~12·2⁻⁵³ ≈ 1.3e-15, so 1e-12.
    np.testing.assert_allclose(word_attention(attention, from_words, to_words), expected, atol=1e-12)
    first_from, _ = pooling_matrices(word_ids, 3, first_piece=True)
    np.testing.assert_allclose(word_attention(attention, first_from, to_words)[1], [0.4, 0.2 + 0.2, 0.1], atol=1e-12)


def test_a_word_without_pieces_gets_zero_rows_and_columns():
    from_words, to_words = pooling_matrices(np.array([-1, 0, 0, -1]), 2)
    assert not from_words[1].any() and not to_words[:, 1].any()
    np.testing.assert_allclose(from_words[0], [0, 0.5, 0.5, 0])


# ---------------------------------------------------------------------------------------------
# Dependency heads: a planted head finds every arc


def _random_tree(rng, width):
    """Heads of a random projective-or-not tree: word 0.. in order, one root."""
    order = rng.permutation(width)
    heads = np.empty(width, np.int32)
    heads[order[0]] = order[0]
    for k in range(1, width):
        heads[order[k]] = order[rng.integers(0, k)]
    return heads


def _planted_words(rng, heads_of, relations, layers=2, n_heads=3, planted=(1, 2), first_piece=False):
    """Sequences whose planted head's piece rows put their maximum on the syntactic head's pieces
    (on [CLS] for the root and for [CLS]/[SEP] themselves)."""
    for heads in heads_of:
        width = len(heads)
        pieces_per_word = rng.integers(1, 3, size=width)
        word_ids = np.concatenate([[-1], np.repeat(np.arange(width), pieces_per_word), [-1]])
        length = len(word_ids)
        attention = rng.dirichlet(np.ones(length), size=(layers, n_heads, length))
        layer, head = planted
        for t in range(length):
            row = np.full(length, 0.1 / length)
            w = word_ids[t]
            if w >= 0 and heads[w] != w:
                row[word_ids == heads[w]] += 1.0
            else:
                row[0] += 1.0
            attention[layer, head, t] = row / row.sum()
        from_words, to_words = pooling_matrices(word_ids, width, first_piece)
        special = (word_ids == -1).astype(float)
        yield WordAttention(
            maps=word_attention(attention, from_words, to_words),
            to_special=from_words @ attention @ special,
            from_special=special @ attention @ to_words / special.sum(),
            embeddings=np.zeros((width, 4)),
            present=np.ones(width, bool),
            word_dep=tuple(rng.choice(relations, size=width)),
            word_head=heads,
            index=0,
        )


@pytest.mark.parametrize("first_piece", [False, True])
def test_a_head_whose_argmax_is_the_syntactic_head_scores_100_percent(first_piece):
    rng = np.random.default_rng(0)
    relations = ["nsubj", "dobj", "amod", "det"]
    trees = [_random_tree(rng, int(rng.integers(3, 12))) for _ in range(40)]
    dev = depattn.DependencyCounts(2, 3).consume(_planted_words(rng, trees[:20], relations, first_piece=first_piece))
    test = depattn.DependencyCounts(2, 3).consume(_planted_words(rng, trees[20:], relations, first_piece=first_piece))
    table = depheads.dependency_table(dev, test)
    assert list(table.columns) == list(depheads.TABLE_COLUMNS)
    found = table[table["direction"] == "dep2head"]
    assert set(found["relation"]) == {*relations, depattn.ALL_RELATIONS}
    assert (found["layer"] == 1).all() and (found["head"] == 2).all()
    assert (found["dev_accuracy"] == 1.0).all() and (found["test_accuracy"] == 1.0).all()
    arcs = sum(int(np.sum(t != np.arange(len(t)))) for t in trees[20:])
    assert found.set_index("relation").loc[depattn.ALL_RELATIONS, "count"] == arcs


def test_heads_and_offsets_are_chosen_on_dev_and_scored_on_test():
    """Clark et al. pick each relation's head (per direction) and baseline offset on dev and report
    their test accuracy. Here every choice made on test would differ from the one made on dev, so
    choosing on test, or reporting a dev number as the test one, changes the table."""
    dev, test = depattn.DependencyCounts(2, 2), depattn.DependencyCounts(2, 2)
    dev.count = {"amod": 10, "nsubj": 10, "advmod": 3, "all": 23}
    test.count = {"amod": 20, "nsubj": 20, "all": 40}
    # found[relation][direction, layer, head]: the dev argmax, then the test one, of each block.
    dev.found = {
        "amod": np.array([[[1, 8], [6, 2]], [[2, 3], [4, 7]]]),  # (0, 1), (1, 1)
        "nsubj": np.array([[[9, 1], [2, 3]], [[1, 2], [8, 4]]]),  # (0, 0), (1, 0)
        "advmod": np.array([[[0, 0], [0, 3]], [[0, 0], [0, 3]]]),
        "all": np.array([[[10, 9], [8, 8]], [[3, 5], [12, 14]]]),  # (0, 0), (1, 1)
    }
    test.found = {
        "amod": np.array([[[3, 5], [15, 4]], [[16, 2], [6, 9]]]),  # (1, 0), (0, 0)
        "nsubj": np.array([[[4, 2], [3, 17]], [[2, 18], [5, 1]]]),  # (1, 1), (0, 1)
        "all": np.array([[[7, 7], [18, 21]], [[18, 20], [11, 10]]]),  # (1, 1), (0, 1)
    }
    # offset_found[relation][offset index] over OFFSETS = (-3, -2, -1, 1, 2, 3).
    dev.offset_found = {
        "amod": np.array([0, 1, 7, 2, 0, 0]),  # -1
        "nsubj": np.array([0, 0, 1, 2, 5, 0]),  # +2
        "advmod": np.array([3, 0, 0, 0, 0, 0]),
        "all": np.array([3, 1, 8, 4, 5, 0]),  # -1
    }
    test.offset_found = {
        "amod": np.array([0, 2, 3, 12, 0, 0]),  # +1
        "nsubj": np.array([0, 0, 5, 2, 4, 0]),  # -1
        "all": np.array([0, 2, 8, 14, 4, 0]),  # +1
    }
    table = depheads.dependency_table(dev, test)
    expected = pd.DataFrame(
        [
            ("amod", 0, 1, "dep2head", 8 / 10, 5 / 20, -1, 3 / 20, 20),
            ("amod", 1, 1, "head2dep", 7 / 10, 9 / 20, -1, 3 / 20, 20),
            ("nsubj", 0, 0, "dep2head", 9 / 10, 4 / 20, 2, 4 / 20, 20),
            ("nsubj", 1, 0, "head2dep", 8 / 10, 5 / 20, 2, 4 / 20, 20),
            ("all", 0, 0, "dep2head", 10 / 23, 7 / 40, -1, 8 / 40, 40),
            ("all", 1, 1, "head2dep", 14 / 23, 10 / 40, -1, 8 / 40, 40),
        ],
        columns=list(depheads.TABLE_COLUMNS),
    )
    pd.testing.assert_frame_equal(table, expected, check_dtype=False)


def test_head_to_dependent_finds_every_dependent_of_a_head():
    # A star: word 0 heads words 1-4 and attends to each of them far more than anyone else does.
    # Clark's head → dependent asks, per dependent, who attends to it most, so all four arcs are
    # found, where "the head's own argmax" could find only one.
    rng = np.random.default_rng(2)
    heads = np.zeros(5, np.int32)
    maps = rng.uniform(0, 0.1, size=(1, 1, 5, 5))
    maps[0, 0, 0, 1:] = 1.0
    counts = depattn.DependencyCounts(1, 1)
    counts.update(WordAttention(maps, maps[..., 0], maps[..., 0], np.zeros((5, 2)), np.ones(5, bool),
                                ("dep",) * 5, heads, 0))  # fmt: skip
    assert counts.count["dep"] == 4
    np.testing.assert_array_equal(counts.accuracy("dep")[list(depattn.DIRECTIONS).index("head2dep"), 0, 0], 1.0)


def test_head_to_dependent_direction_on_chains():
    # In a chain every head has one dependent, so a head attending to its dependent finds all arcs.
    rng = np.random.default_rng(1)
    chains = [np.append(np.arange(1, w), w - 1).astype(np.int32) for w in range(3, 10)]  # i → i + 1
    layers, n_heads = 1, 2
    counts = depattn.DependencyCounts(layers, n_heads)
    for heads in chains:
        width = len(heads)
        maps = rng.uniform(0, 0.1, size=(layers, n_heads, width, width))
        for dependent in range(width - 1):
            maps[0, 1, heads[dependent], dependent] = 1.0  # head 1: each word attends to its dependent
        counts.update(WordAttention(maps, maps[..., 0], maps[..., 0], np.zeros((width, 2)),
                                    np.ones(width, bool), ("dep",) * width, heads, 0))  # fmt: skip
    np.testing.assert_array_equal(counts.accuracy("dep")[1, 0, 1], 1.0)
    np.testing.assert_array_equal(counts.offset_found["dep"], [0, 0, 0, counts.count["dep"], 0, 0])


def test_most_attended_skips_self_and_words_without_pieces():
    maps = np.array([[0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.1, 0.5, 0.4]])
    present = np.array([True, False, True])
    np.testing.assert_array_equal(depattn.most_attended(maps, present), [2, 0, 0])


# ---------------------------------------------------------------------------------------------
# Surface statistics and head distances


def _random_attention(rng, layers, batch, heads, length, lengths):
    scores = rng.normal(size=(layers, batch, heads, length, length)) * 2
    real = np.arange(length)[None, :] < np.array(lengths)[:, None]
    scores = np.where(real[None, :, None, None, :], scores, -np.inf)
    attention = np.exp(scores - scores.max(-1, keepdims=True))
    return attention / attention.sum(-1, keepdims=True), real


def test_surface_sums_match_a_slow_loop():
    rng = np.random.default_rng(2)
    attention, real = _random_attention(rng, 2, 3, 2, 7, [7, 5, 3])
    is_cls = np.zeros_like(real)
    is_cls[:, 0] = True
    is_sep = np.zeros_like(real)
    is_sep[[0, 0, 1, 2], [3, 6, 4, 2]] = True
    is_punct = np.zeros_like(real)
    is_punct[[0, 1], [2, 1]] = True
    sums, counts = surface.surface_sums(jnp.asarray(attention), jnp.asarray(real), is_cls, is_sep, is_punct)
    slow = np.zeros((2, 2, len(surface.STATISTICS)))
    rows = np.zeros(len(surface.STATISTICS))
    for b, n in enumerate([7, 5, 3]):
        for t in range(n):
            a = attention[:, b, :, t, :n]  # [L, H, n]
            values = {
                "cls": a[..., is_cls[b, :n]].sum(-1), "sep": a[..., is_sep[b, :n]].sum(-1),
                "punct": a[..., is_punct[b, :n]].sum(-1), "self": a[..., t],
                "prev": a[..., t - 1] if t >= 1 else None, "next": a[..., t + 1] if t <= n - 2 else None,
                "entropy": -(a * np.log(a)).sum(-1), "entropy_cls": -(a * np.log(a)).sum(-1) if t == 0 else None,
                "uniform_entropy": np.full((2, 2), np.log(n)),
                "uniform_entropy_cls": np.full((2, 2), np.log(n)) if t == 0 else None,
            }  # fmt: skip
            for s, name in enumerate(surface.STATISTICS):
                if values[name] is not None:
                    slow[..., s] += values[name]
                    rows[s] += 1
    # float32 on the device against float64: per row ≤ 7 terms (with a float32 log, ~2u each), then
    # sums over ≤ 15 rows: (2·7 + 15)·u ≈ 1.7e-6 relative at worst; entropies in bits (×1/ln 2) or a
    # row left out are ≥ 1e-2 off.
    np.testing.assert_allclose(np.asarray(sums), slow, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(counts), rows)


def test_js_divergence_is_scipys_jensenshannon_squared():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(9), size=2)
    q[4] = 0.0  # zeros must not give NaN
    q /= q.sum()
    attention = np.stack([p, q])[None, None, :, None, :]  # one layer, one sequence, two heads, one row
    js = np.asarray(surface.js_sums(jnp.asarray(attention, jnp.float32), jnp.ones((1, 1))))
    # float32: 2·9 terms p·log(p/m) with a float32 log (~2u each) and their sum, (2·2·9 + 18)·u ≈
    # 3.2e-6 relative, on a JS ≈ 0.1 here (no cancellation to amplify it); so 1e-5.
    np.testing.assert_allclose(js[0, 1], jensenshannon(p, q) ** 2, rtol=1e-5)
    # Planted bug: JS in bits (log₂, a wrong scale by 1/ln 2) fails the same bound.
    assert not np.allclose(js[0, 1], jensenshannon(p, q, base=2) ** 2, rtol=1e-5)
    # A head against itself: 9 terms ≤ log 9 in size, each 0 up to its rounding: 9·u·log 9 ≈ 1.2e-6.
    np.testing.assert_allclose(np.diag(js), 0.0, atol=9 * 2.0**-24 * np.log(9))


def test_js_matrix_matches_scipy_pair_by_pair():
    rng = np.random.default_rng(4)
    attention, real = _random_attention(rng, 2, 2, 2, 5, [5, 3])
    js = np.asarray(surface.js_sums(jnp.asarray(attention, jnp.float32), jnp.asarray(real)))
    heads = [(layer, head) for layer in range(2) for head in range(2)]
    expected = np.zeros((4, 4))
    for i, (li, hi) in enumerate(heads):
        for j, (lj, hj) in enumerate(heads):
            for b, n in enumerate([5, 3]):
                for t in range(n):
                    expected[i, j] += jensenshannon(attention[li, b, hi, t], attention[lj, b, hj, t]) ** 2
    # 8 rows' float32 JS (each ≤ ln 2, 10 terms with logs: ~30·u·ln 2) summed: 8·30·u·ln 2 ≈ 1e-5.
    np.testing.assert_allclose(js, expected, atol=1e-5)


def test_classical_mds_recovers_planar_distances():
    rng = np.random.default_rng(5)
    points = rng.normal(size=(10, 2))
    distance = np.linalg.norm(points[:, None] - points[None], axis=-1)
    coords = surface.classical_mds(distance)
    # float64 eigendecomposition of a 10 × 10 Gram matrix of points |x| ≲ 3: ~10·2⁻⁵³·10 ≈ 1e-14;
    # 1e-9 leaves room for the small eigenvalues LAPACK returns as ±1e-15 instead of 0.
    np.testing.assert_allclose(np.linalg.norm(coords[:, None] - coords[None], axis=-1), distance, atol=1e-9)


def test_wikitext_pairs_are_consecutive_paragraphs_of_one_article():
    text = "\n = A = \n\n p1 \n p2 \n = = S = = \n p3 @-@ x \n\n = B = \n\n q1 \n q2 \n"
    # p3-x has no partner in its article, and pairs never cross articles.
    assert attention_pipeline.wikitext_segment_pairs(text, 10) == [("p1", "p2"), ("q1", "q2")]
    assert attention_pipeline.wikitext_segment_pairs(text, 1) == [("p1", "p2")]


# ---------------------------------------------------------------------------------------------
# Gradients of the MLM loss with respect to the attention probabilities


@pytest.fixture(scope="module")
def small_pretraining_model():
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16,
                        initializer_range=0.1)  # fmt: skip  # gradients well above float32 round-off
    return bertjax.init_model(config, "BertForPreTraining", seed=3)


def _masked_inputs(rng, batch=2, length=8):
    ids = rng.integers(5, 50, size=(batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[1, 6:] = 0
    maskable = mask.astype(bool)
    maskable[:, 0] = False
    masked, positions, labels, weights = gradients.mask_batch(ids, maskable, rng, mask_id=4, vocab_size=50)
    return masked, mask, np.zeros_like(mask), positions, labels, weights


def test_zero_attention_offsets_change_nothing(small_pretraining_model):
    model = small_pretraining_model
    ids, mask, types, *_ = _masked_inputs(np.random.default_rng(6))
    plain = model(ids, mask, types)
    offsets = jnp.zeros((2, 2, 2, 8, 8))
    shifted = model(ids, mask, types, attention_offsets=offsets, output_attentions=True)
    # The same float32 model in another compiled program (the explicit attention path): L = 2
    # layers, ≤ 64-term contractions, |h| ≲ 4: L·√64·u·4 ≈ 4e-6 (test_model's bound), so 1e-5.
    np.testing.assert_allclose(shifted.prediction_logits, plain.prediction_logits, atol=1e-5)
    reference = model(ids, mask, types, output_attentions=True)
    for a, b in zip(shifted.attentions, reference.attentions, strict=True):
        np.testing.assert_array_equal(a, b)


def test_attention_gradient_matches_finite_differences(small_pretraining_model):
    model = small_pretraining_model
    inputs = _masked_inputs(np.random.default_rng(7))
    loss = jax.jit(lambda offsets: gradients.mlm_loss(model, offsets, *inputs))
    zeros = jnp.zeros((2, 2, 2, 8, 8))
    grad = np.asarray(jax.grad(loss)(zeros))
    rng = np.random.default_rng(8)
    # Central differences in float32: a step of norm 0.1 keeps the round-off (loss ulp / step)
    # about 100x below the derivatives checked, and the truncation error below that.
    eps = 0.1
    for _ in range(3):
        direction = rng.normal(size=zeros.shape).astype(np.float32)
        direction /= np.linalg.norm(direction)
        numeric = (float(loss(eps * direction)) - float(loss(-eps * direction))) / (2 * eps)
        np.testing.assert_allclose(np.sum(grad * direction), numeric, rtol=2e-3, atol=1e-5)
    # Single cells, a padded key among them: its offset still reaches the output through V.
    for cell in [(0, 0, 1, 3, 2), (1, 1, 0, 5, 0), (1, 1, 1, 2, 7)]:
        bump = np.zeros(zeros.shape, np.float32)
        bump[cell] = eps
        numeric = (float(loss(bump)) - float(loss(-bump))) / (2 * eps)
        np.testing.assert_allclose(grad[cell], numeric, rtol=2e-3, atol=1e-5)


def test_gradient_importance_is_the_mean_over_heads_real_rows_and_keys_of_each_kind(
    small_pretraining_model, monkeypatch
):
    """The importance of a key kind in a layer is the mean |∂loss/∂α| over every head, real query
    row and real key of that kind. A slow loop that takes each sequence alone, masked as the
    function masked it, and reads only its real cells must agree: summing over heads instead, or
    counting the padding rows of short sequences or of the filler row that completes the batch,
    does not. (The loop pads every sequence to one width, so it compiles once.)"""
    model = small_pretraining_model
    punct_ids = (7, 8)
    seqs = []
    for ids in ([2, 10, 7, 11, 12, 3], [2, 13, 14, 8, 3, 15, 7, 16, 3], [2, 20, 21, 7, 22, 23, 8, 25, 26, 7, 3]):
        ids = np.array(ids, np.int32)
        is_cls, is_sep = ids == 2, ids == 3
        seqs.append(EncodedSequence(ids, np.minimum(np.cumsum(is_sep) - is_sep, 1).astype(np.int32), is_cls | is_sep,
                                    is_cls, is_sep, np.full(len(ids), -1, np.int32), (), np.zeros(0, np.int32),
                                    int(is_sep.sum()), len(seqs)))  # fmt: skip
    drawn, mask_batch = [], gradients.mask_batch

    def recorded_mask_batch(*args, **kwargs):
        drawn.append((args[0], *mask_batch(*args, **kwargs)))
        return drawn[-1][1:]

    monkeypatch.setattr(gradients, "mask_batch", recorded_mask_batch)
    importance = gradients.gradient_importance(model, seqs, punct_ids, mask_id=4, batch_size=4, max_length=16)
    ((unmasked, masked, positions, labels, weights),) = drawn
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    totals = np.zeros((layers, len(gradients.KEY_KINDS)))
    cells = np.zeros((layers, len(gradients.KEY_KINDS)))
    width = max(seq.length for seq in seqs)
    grad_fn = jax.jit(jax.grad(lambda offsets, *inputs: gradients.mlm_loss(model, offsets, *inputs)))
    for b, seq in enumerate(seqs):
        n = seq.length
        np.testing.assert_array_equal(unmasked[b, :n], seq.input_ids)
        ids, mask, types = np.zeros((3, 1, width), np.int32)
        ids[0, :n], mask[0, :n], types[0, :n] = masked[b, :n], 1, seq.token_type_ids
        inputs = (ids, mask, types, positions[b : b + 1], labels[b : b + 1], weights[b : b + 1])
        grad = np.asarray(grad_fn(jnp.zeros((layers, 1, heads, width, width)), *inputs))[:, 0]
        for key in range(n):
            if seq.is_cls[key]:
                kind = "cls"
            elif seq.is_sep[key]:
                kind = "sep"
            elif seq.input_ids[key] in punct_ids:
                kind = "punct"
            else:
                kind = "other"
            for layer in range(layers):
                for head in range(heads):
                    for query in range(n):
                        totals[layer, gradients.KEY_KINDS.index(kind)] += abs(grad[layer, head, query, key])
                        cells[layer, gradients.KEY_KINDS.index(kind)] += 1
    # The same float32 gradients, their |·| averaged over the cells of a kind in float32 (random-walk
    # √N·u over ≤ 2·8·8·8 = 1,024 cells ≈ 2e-6) against a float64 mean.
    np.testing.assert_allclose(importance, totals / cells, rtol=1e-5)


def test_bert_masking_picks_15_percent_of_maskable_tokens():
    rng = np.random.default_rng(9)
    ids = rng.integers(5, 50, size=(4, 40)).astype(np.int32)
    maskable = np.ones_like(ids, bool)
    maskable[:, :3] = False
    masked, positions, labels, weights = gradients.mask_batch(ids, maskable, rng, mask_id=4, vocab_size=50)
    assert (weights.sum(axis=1) == round(0.15 * 37)).all()
    chosen = positions[weights > 0]
    assert (chosen >= 3).all()
    np.testing.assert_array_equal(labels[weights > 0], ids[np.nonzero(weights > 0)[0], chosen])
    untouched = np.ones_like(ids, bool)
    untouched[np.nonzero(weights > 0)[0], chosen] = False
    np.testing.assert_array_equal(masked[untouched], ids[untouched])


# ---------------------------------------------------------------------------------------------
# Probes


def test_distance_features_are_one_hot_offsets_and_root():
    features = probes.distance_features(4)
    assert features.shape == (4, 5, 2 * probes.MAX_DISTANCE + 2)
    np.testing.assert_array_equal(features.sum(-1), 1)
    assert features[1, 3, probes.MAX_DISTANCE + 2] == 1 and features[2, 4, -1] == 1


def test_attention_probe_learns_a_planted_head():
    rng = np.random.default_rng(10)
    trees = [_random_tree(rng, int(rng.integers(3, 10))) for _ in range(60)]
    sentences = [probes.probe_sentence(w) for w in _planted_words(rng, trees, ["dep"])]
    params = probes.train_probe(sentences[:40], "attention", False, epochs=30, batch_size=8, learning_rate=0.1)
    score, words = probes.uas(params, sentences[40:], "attention", batch_size=8)
    assert words == sum(len(t) for t in trees[40:])
    assert score == 1.0


# ---------------------------------------------------------------------------------------------
# The CLI end to end on a tiny random BERT (with its random MLM head) and the staged data


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, shared_data):
    directory = tmp_path_factory.mktemp("tiny_pretraining")
    model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128), "BertForPreTraining", seed=1)
    bertjax.save_pretrained(model, directory)
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(directory)
    return directory


@pytest.mark.slow
def test_cli_writes_every_output(tiny_ckpt, shared_data, tmp_path, capsys, ud_english_ewt):
    out = tmp_path / "clark"
    clark.main(["--ckpt", str(tiny_ckpt), "--out", str(out), "--data-dir", str(shared_data), "--n", "12",
                "--cluster-n", "8", "--gradient-n", "8", "--ewt-n", "24", "--gap-n", "16", "--probe-train-n", "16",
                "--probe-epochs", "1", "--batch-size", "8", "--min-count", "1", "--figure-format", "png,svg"])  # fmt: skip
    written = {p.name for p in out.iterdir()}
    for stem in ("surface_by_layer", "entropy_by_layer", "head_mds", "gradient_importance", "coref_accuracy"):
        assert {f"{stem}.png", f"{stem}.svg"} <= written
    table = pd.read_csv(out / "dependency_heads.csv")
    assert list(table.columns) == list(depheads.TABLE_COLUMNS)
    assert table["dev_accuracy"].between(0, 1).all() and table["test_accuracy"].between(0, 1).all()
    js = pd.read_csv(out / "head_js_divergence.csv", index_col=0).to_numpy()
    # Sums of float32 JS over 8 sequences: 0 and symmetric up to their rounding (as in the tests above).
    assert js.shape == (4, 4) and np.allclose(np.diag(js), 0, atol=1e-6) and np.allclose(js, js.T, atol=1e-6)
    grads = pd.read_csv(out / "gradient_importance.csv")
    assert list(grads.columns) == ["layer", *gradients.KEY_KINDS] and (grads[list(gradients.KEY_KINDS)] > 0).all().all()
    assert len(pd.read_csv(out / "probes.csv")) == 3
    surface_table = pd.read_csv(out / "surface.csv")
    # Two float32 means of weights that sum to ≤ 1 per row: ≤ 1 up to a few u·(T ≤ 128) ≈ 1e-6.
    assert (surface_table[["cls", "sep"]].sum(axis=1) <= 1 + 1e-6).all()
    info = json.loads((out / "run.json").read_text())
    assert info["results"]["skipped"] == {}
    assert "all" in capsys.readouterr().out


def test_gradients_refuse_a_checkpoint_without_an_mlm_head(minilm_path, tmp_path, cli_error):
    out = tmp_path / "clark"
    error = cli_error(clark.main, ["--ckpt", str(minilm_path), "--out", str(out), "--analyses", "gradients"])
    assert error.startswith("error: ") and "no trained MLM head" in error
    assert not out.exists()


def test_n_bounds_every_analysis_and_an_analysis_own_count_wins():
    from analysis.attention.options import ClarkConfig

    default = ClarkConfig(ckpt="c")
    limits = lambda c: (c.surface_n, c.ewt_limit, c.probe_train_limit, c.gap_limit)
    assert limits(default) == (1000, None, 2000, None)
    bounded = ClarkConfig(ckpt="c", n=5)
    assert limits(bounded) == (5, 5, 5, 5)
    own = ClarkConfig(ckpt="c", n=5, ewt_n=7, probe_train_n=9, gap_n=3)
    assert limits(own) == (5, 7, 9, 3)
    assert ClarkConfig(ckpt="c", n=5000).probe_train_limit == 2000  # a bound, not a count


@pytest.mark.slow
def test_cli_n_bounds_the_examples_of_every_analysis(tiny_ckpt, shared_data, tmp_path, monkeypatch):
    """Before: `--n 5` bounded the surface inputs only; EWT dev and test were read whole, the probes
    trained on 2000 EWT train sentences and GAP was read whole (`--n 100` took 8 min)."""
    read = []
    every = attention_pipeline.ewt_sequences

    def counted(config, tokenizer, split, limit):
        seqs = every(config, tokenizer, split, limit)
        read.append((split, len(seqs)))
        return seqs

    monkeypatch.setattr(attention_pipeline, "ewt_sequences", counted)
    out = tmp_path / "clark"
    clark.main(["--ckpt", str(tiny_ckpt), "--out", str(out), "--data-dir", str(shared_data), "--n", "5",
                "--cluster-n", "8", "--probe-epochs", "1", "--batch-size", "8", "--max-length", "64",
                "--min-count", "1", "--figure-format", "png"])  # fmt: skip
    assert read == [("dev", 5), ("test", 5), ("train", 5)]
    results = json.loads((out / "run.json").read_text())["results"]
    assert results["skipped"] == {}
    assert [results[k] for k in ("surface_sequences", "cluster_sequences", "gradient_sequences")] == [5, 5, 5]
    assert results["coref_dev"]["rows"] == results["coref_test"]["rows"] == 5
    assert (pd.read_csv(out / "probes.csv")["train_sentences"] == 5).all()
