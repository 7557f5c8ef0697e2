"""Michel et al. 2019: the head-mask gradient against the per-head identity, importance against a
per-example loop, per-layer normalisation, the pruning schedule and orders, and the CLI."""

from __future__ import annotations

import itertools
import json
import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BertTokenizerFast

import bertjax
from analysis import prune
from analysis.ablation import evaluation, michel
from analysis.ablation import figures as ablation_figures
from bertjax.model import Capture, Interventions

N_LAYERS, N_HEADS, VOCAB = 2, 4, 50


@pytest.fixture(scope="module")
def model():
    config = bertjax.BertConfig(
        vocab_size=VOCAB, num_hidden_layers=N_LAYERS, hidden_size=32, num_attention_heads=N_HEADS,
        intermediate_size=64, max_position_embeddings=32, num_labels=3,
    )  # fmt: skip
    return bertjax.init_model(config, "BertForSequenceClassification", seed=5)


def _loss_through_head_outputs(model, ids, token_types, label, layer):
    """The classifier's loss, recomputed by hand from layer `layer`'s per-head outputs o [1, T, H, d].

    The attention of that layer is re-implemented here (q, k, v, softmax, P·V per head); everything
    else reuses the model's own sub-modules. Returns o and a function o ↦ loss.
    """
    bert, cfg = model.bert, model.config
    length = ids.shape[1]
    allowed = jnp.ones((1, 1, 1, length), bool)
    x = bert.embeddings(ids, token_types, jnp.arange(length)[None])
    for below in bert.encoder.layer[:layer]:
        x = below(x, allowed, Interventions(), Capture(), None)[0]
    block = bert.encoder.layer[layer]
    attention = block.attention.self
    split = lambda y: y.reshape(1, length, cfg.num_attention_heads, cfg.head_dim)
    q, k, v = split(attention.query(x)), split(attention.key(x)), split(attention.value(x))
    probs = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(cfg.head_dim), axis=-1)
    heads_out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)

    def loss(o):
        attended = block.attention.output(o.reshape(1, length, -1), x)
        y = block.output(block.intermediate(attended), attended)
        for above in bert.encoder.layer[layer + 1 :]:
            y = above(y, allowed, Interventions(), Capture(), None)[0]
        logits = model.classifier(bert.pooler(y))
        return optax.softmax_cross_entropy_with_integer_labels(logits, label)[0]

    return heads_out, loss


def test_mask_gradient_equals_sum_over_tokens_of_output_gradient_times_output(model):
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, VOCAB, size=(1, 11)), jnp.int32)
    token_types = jnp.asarray(np.r_[np.zeros(6), np.ones(5)][None], jnp.int32)
    label = jnp.array([2])

    def loss_of_mask(head_mask):
        logits = model(ids, None, token_types, head_mask=head_mask).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, label)[0]

    ones = jnp.ones((N_LAYERS, N_HEADS))
    mask_gradient = np.asarray(jax.jit(jax.grad(loss_of_mask))(ones))
    for layer in range(N_LAYERS):
        heads_out, loss = _loss_through_head_outputs(model, ids, token_types, label, layer)
        # The same float32 forward pass split in two: contractions of ≤ 64 terms, ≤ 2·64·u ≈ 7.6e-6.
        assert float(loss(heads_out)) == pytest.approx(float(loss_of_mask(ones)), rel=1e-5)
        identity = np.asarray((jax.jit(jax.grad(loss))(heads_out) * heads_out).sum(axis=(0, 1, 3)))
        # Two float32 routes to one gradient: backward through ≤ 2 layers of ≤ 64-term contractions,
        # then T·d = 11·8 signed products, (2·64 + 88)·u ≈ 1.3e-5 before their cancellation (≤ 10×
        # here), so 1e-4; the atol is for a gradient near 0. A wrong head slice is O(1) off.
        np.testing.assert_allclose(mask_gradient[layer], identity, rtol=1e-4, atol=1e-7)
    assert np.abs(mask_gradient).min() > 0  # every head matters a little: the identity is not 0 = 0


@pytest.fixture(scope="module")
def eval_set():
    """7 examples of different lengths with padding, labels in 0..2, batches of 4 (one dummy row)."""
    rng = np.random.default_rng(1)
    lengths = np.array([5, 9, 12, 7, 16, 3, 10])
    ids = np.zeros((7, 16), np.int32)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, VOCAB, size=n)
    arrays = {
        "input_ids": ids,
        "attention_mask": (ids != 0).astype(np.int32),
        "token_type_ids": np.zeros_like(ids),
        "labels": rng.integers(0, 3, size=7).astype(np.int32),
    }
    return arrays, evaluation.make_eval_set(arrays, 4, ("accuracy",))


def test_importance_is_the_mean_absolute_per_example_gradient(model, eval_set):
    arrays, batches = eval_set
    evaluator = evaluation.MaskedEvaluator(model, batches)

    # One example at a time, in file order, padded as given: no sorting, buckets or vmap.
    @jax.jit
    def gradient(mask, ids, attention_mask, label):
        def loss(mask):
            logits = model(ids, attention_mask, head_mask=mask).logits
            return optax.softmax_cross_entropy_with_integer_labels(logits, label)[0]

        return jax.grad(loss)(mask)

    unpruned = np.ones((N_LAYERS, N_HEADS), np.float32)
    pruned = unpruned.copy()
    pruned[1, [0, 3]] = 0.0
    for head_mask in (unpruned, pruned):
        slow, signed = np.zeros((N_LAYERS, N_HEADS)), np.zeros((N_LAYERS, N_HEADS))
        for i in range(len(arrays["labels"])):
            one = slice(i, i + 1)
            g = np.asarray(
                gradient(head_mask, arrays["input_ids"][one], arrays["attention_mask"][one], arrays["labels"][one])
            )
            slow, signed = slow + np.abs(g), signed + g
        # The same per-example float32 gradients (bound as above), batched: the mean of 7 |g| adds 7·u.
        np.testing.assert_allclose(
            evaluator.mask_gradients(head_mask), slow / len(arrays["labels"]), rtol=1e-4, atol=1e-8
        )
    # Planted bug: the absolute value of the mean gradient (signs cancel across examples), not the
    # mean of the absolute values, fails the same bound.
    assert not np.allclose(
        evaluator.mask_gradients(head_mask), np.abs(signed) / len(arrays["labels"]), rtol=1e-4, atol=1e-8
    )


def test_normalise_per_layer_gives_unit_l2_rows():
    importance = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    expected = np.array([[0.6, 0.8, 0.0], [0.0, 0.0, 0.0], [1 / math.sqrt(3)] * 3])
    # float64, 3 squares, a root and a division: a few 2⁻⁵³, far inside the default rtol 1e-7.
    np.testing.assert_allclose(michel.normalise_per_layer(importance), expected)


def test_pruning_counts_step_by_a_fraction_of_all_heads():
    assert michel.pruning_counts(72, 0.1) == [0, 7, 14, 22, 29, 36, 43, 50, 58, 65, 72]
    assert michel.pruning_counts(144, 0.05)[:4] == [0, 7, 14, 22] and michel.pruning_counts(144, 0.05)[-1] == 144
    assert len(michel.pruning_counts(144, 0.05)) == 21
    assert michel.pruning_counts(8, 0.3) == [0, 2, 5, 7, 8]


# Magnitudes a float32 gradient can take, whose squares neither underflow nor overflow in float64.
importance_matrices = hnp.arrays(
    np.float64,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=6),
    elements=st.one_of(st.just(0.0), st.floats(1e-30, 1e30), st.floats(-1e30, -1e-30)),
)


@settings(max_examples=100, deadline=None)
@given(importance_matrices)
def test_normalise_per_layer_scales_each_layer_to_the_unit_sphere(importance):
    """Importances of layers with very different gradient scales become comparable only if each
    layer is a positive rescaling of itself with L2 norm 1; an all-zero layer must stay a finite zero
    rather than 0/0 NaN, which would poison the pruning order."""
    normalised = michel.normalise_per_layer(importance)
    assert normalised.shape == importance.shape and np.isfinite(normalised).all()
    for row, out in zip(importance, normalised, strict=True):
        if not row.any():
            np.testing.assert_array_equal(out, 0.0)
            continue
        # float64 over ≤ 6 entries: a norm and a division err by ≤ ~10·2⁻⁵³ ≈ 1e-15, so 1e-12.
        np.testing.assert_allclose(np.linalg.norm(out), 1.0, rtol=1e-12)
        scale = np.linalg.norm(row)
        assert scale > 0
        np.testing.assert_allclose(out * scale, row, rtol=1e-12, atol=1e-12 * scale)
        np.testing.assert_array_equal(np.sign(out), np.sign(row))


@settings(max_examples=200, deadline=None)
@given(n_total=st.integers(1, 400), step=st.one_of(st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.5]), st.floats(0.01, 0.5)))
def test_pruning_counts_are_the_documented_schedule(n_total, step):
    """The curve starts unpruned, ends with every head pruned, measures each count once, and its
    counts are exactly round(k · step · n_total) for every k with k · step ≤ 1, nothing else."""
    counts = michel.pruning_counts(n_total, step)
    assert all(isinstance(c, int) for c in counts)
    assert counts[0] == 0 and counts[-1] == n_total
    assert all(a < b for a, b in itertools.pairwise(counts))
    last_k = math.floor(round(1.0 / step, 9))
    scheduled = {round(k * step * n_total) for k in range(last_k + 1)}
    assert scheduled <= set(counts)
    assert set(counts) - scheduled <= {n_total}
    assert all(b - a <= math.ceil(step * n_total) + 1 for a, b in itertools.pairwise(counts))


def test_pruning_by_importance_masks_the_least_important_remaining_heads():
    importance = np.array([[0.5, 0.1, 0.9], [0.3, 0.2, 0.8]])
    seen = []
    steps, estimates = michel.prune_by_importance(
        importance, [0, 2, 4, 6], lambda m: seen.append(m.copy()) or float(m.sum())
    )
    assert [s.heads_pruned for s in steps] == [0, 2, 4, 6] and [s.metric for s in steps] == [6, 4, 2, 0]
    assert len(estimates) == 1
    np.testing.assert_array_equal(seen[1], [[1, 0, 1], [1, 0, 1]])  # 0.1 and 0.2 go first
    np.testing.assert_array_equal(seen[2], [[0, 0, 1], [0, 0, 1]])  # then 0.3 and 0.5


def test_reestimation_uses_the_current_mask_and_only_ranks_remaining_heads():
    masks_given = []

    def reestimate(mask):
        masks_given.append(mask.copy())
        # Under the mask, head (1, 2) looks least important and an already-pruned head looks lowest of all.
        return np.array([[0.0, 0.7, 0.6], [0.8, 0.9, 0.05]])

    importance = np.array([[0.1, 0.5, 0.6], [0.7, 0.8, 0.9]])
    steps, estimates = michel.prune_by_importance(importance, [0, 1, 2, 3], lambda m: 0.0, reestimate)
    assert len(estimates) == 3 and len(masks_given) == 2
    np.testing.assert_array_equal(masks_given[0], [[0, 1, 1], [1, 1, 1]])
    np.testing.assert_array_equal(steps[2].mask, [[0, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(steps[3].mask, [[0, 1, 0], [1, 1, 0]])
    # The order written to <task>_pruning_order.csv: no single estimate ranks (0, 0) < (1, 2) < (0, 2).
    order = michel.pruning_order(steps, (2, 3))
    assert order.columns.tolist() == ["rank", "layer", "head", "heads_pruned"]
    assert order.to_numpy().tolist() == [[0, 0, 0, 1], [1, 1, 2, 2], [2, 0, 2, 3]]


def test_pruning_order_rebuilds_every_steps_mask():
    importance = np.array([[0.5, 0.1, 0.9, 0.4], [0.3, 0.2, 0.8, 0.6]])
    steps, _ = michel.prune_by_importance(importance, [0, 3, 5, 8], lambda m: 0.0)
    random_steps = michel.prune_in_order([5, 0, 7, 3, 1, 2, 6, 4], [0, 3, 5, 8], lambda m: 0.0, (2, 4))
    for run in (steps, random_steps):
        order = michel.pruning_order(run, (2, 4))
        for step in run:
            mask = np.ones((2, 4))
            done = order[order["heads_pruned"] <= step.heads_pruned]
            mask[done["layer"], done["head"]] = 0.0
            np.testing.assert_array_equal(mask, step.mask)


def test_prune_in_order_follows_the_given_order():
    steps = michel.prune_in_order([5, 0, 3, 1, 2, 4], [0, 1, 3, 6], lambda m: float(m.sum()), (2, 3))
    assert [s.metric for s in steps] == [6, 5, 3, 0]
    np.testing.assert_array_equal(steps[2].mask, [[0, 1, 1], [0, 1, 0]])


def test_heads_within_one_point_stops_at_the_first_drop():
    curve = pd.DataFrame({"heads_pruned": [0, 7, 14, 22, 29], "metric": [0.80, 0.805, 0.79, 0.78, 0.795]})
    assert michel.heads_within(curve) == 14  # 22 drops 2 points; the later recovery does not count
    assert michel.heads_within(curve, tolerance=0.0) == 7


def test_random_orders_are_judged_one_seed_at_a_time():
    # The mean of the two curves, 0.80, 0.7925, 0.7925, never drops a point; each seed does.
    runs = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 1], "heads_pruned": [0, 7, 14] * 2,
                         "metric": [0.80, 0.785, 0.80, 0.80, 0.80, 0.785]})  # fmt: skip
    assert michel.heads_within(runs.groupby("heads_pruned", as_index=False)["metric"].mean()) == 14
    assert michel.heads_within_per_seed(runs) == {"median": 3.5, "min": 0, "max": 7, "per_seed": [0, 7]}


def test_pruning_figure_names_the_split(monkeypatch, tmp_path):
    figures = []
    monkeypatch.setattr(ablation_figures, "save_figure", lambda fig, out_dir, stem: figures.append(fig) or [])
    curve = pd.DataFrame({"fraction_pruned": [0.0, 1.0], "heads_pruned": [0, 8], "metric": [0.8, 0.5],
                          "order": "importance"})  # fmt: skip
    ablation_figures.plot_pruning(curve, pd.DataFrame(), "accuracy", "mrpc", "train", tmp_path)
    assert figures[0].axes[0].get_ylabel() == "train accuracy"


def test_bad_flags_are_user_errors():
    with pytest.raises(bertjax.UserError, match="--metric"):
        michel.MichelConfig(ckpt="x", task="sst2", metric="f1")
    with pytest.raises(bertjax.UserError, match="--prune-step"):
        michel.MichelConfig(ckpt="x", prune_step=0.0)


def test_the_importance_set_defaults_to_the_metrics_examples():
    assert prune.parse_args(["--ckpt", "x", "--n", "8"]).importance_n == 8
    assert prune.parse_args(["--ckpt", "x"]).importance_n is None  # all of the split, for both
    assert prune.parse_args(["--ckpt", "x", "--n", "8", "--importance-split", "train"]).importance_n == 8
    assert prune.parse_args(["--ckpt", "x", "--n", "8", "--importance-n", "100"]).importance_n == 100


def _save_tiny_classifier(directory, shared_data, **overrides):
    config = bertjax.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, max_position_embeddings=128,
        **overrides,
    )  # fmt: skip
    bertjax.save_pretrained(bertjax.init_model(config, "BertForSequenceClassification", seed=2), directory)
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, shared_data):
    return _save_tiny_classifier(tmp_path_factory.mktemp("tiny_classifier"), shared_data)


def test_cli_writes_the_pruning_curve_importance_and_run_json(tiny_ckpt, shared_data, tmp_path):
    out = tmp_path / "out"
    glue_dir = shared_data / "glue"
    prune.main([
        "--ckpt", str(tiny_ckpt), "--task", "mrpc", "--glue-dir", str(glue_dir), "--n", "8",
        "--batch-size", "8", "--prune-step", "0.25", "--random-seeds", "2", "--reestimate", "--out", str(out),
        "--figure-format", "png,svg",
    ])  # fmt: skip
    curve = pd.read_csv(out / "pruning.csv")
    assert list(curve.columns) == ["fraction_pruned", "heads_pruned", "metric", "order"]
    assert curve["order"].tolist() == ["importance"] * 5 + ["random"] * 5
    assert curve["heads_pruned"].tolist()[:5] == [0, 2, 4, 6, 8]
    seeds = pd.read_csv(out / "mrpc_pruning_random_seeds.csv")
    # Means of 2 seeds' metrics, written as CSV text: only the float64 round trip (~2⁻⁵³) differs.
    np.testing.assert_allclose(curve["metric"][5:], seeds.groupby("heads_pruned")["metric"].mean())
    # Nothing pruned: every order starts from the unpruned metric; all pruned: one value for all.
    assert curve["metric"][0] == curve["metric"][5] and curve["metric"][4] == curve["metric"][9]
    importance = pd.read_csv(out / "mrpc_importance.csv")
    norms = importance.groupby("layer")["importance"].apply(lambda x: np.sqrt((x**2).sum()))
    # float32 importances normalised per layer of ≤ 12 heads: (12 squares + root + division)·u ≈ 8e-7.
    np.testing.assert_allclose(norms, 1.0, rtol=1e-6)
    # Without --importance-n the importance is estimated on the same 8 examples, not the whole split.
    model = bertjax.from_pretrained(tiny_ckpt, "BertForSequenceClassification")
    first_8, _ = evaluation.load_eval_set(bertjax.load_tokenizer(tiny_ckpt), "mrpc", "dev", glue_dir, 8, 128, 8)
    # The same float32 computation run again (another compilation), written as CSV: a few u.
    np.testing.assert_allclose(
        importance["importance_raw"], evaluation.MaskedEvaluator(model, first_8).mask_gradients().ravel(), rtol=1e-5
    )
    assert (out / "mrpc_pruning.png").is_file() and (out / "mrpc_importance.svg").is_file()
    order = pd.read_csv(out / "mrpc_pruning_order.csv")
    assert sorted(zip(order["layer"], order["head"], strict=True)) == list(itertools.product(range(2), range(4)))
    assert order["heads_pruned"].tolist() == [2, 2, 4, 4, 6, 6, 8, 8]
    info = json.loads((out / "run.json").read_text())
    result = info["result"]
    assert result["split"] == "dev" and result["examples"] == 8
    assert result["importance_set"] == {"split": "dev", "examples": 8}
    assert (
        result["importance_estimates"] == result["importance_passes"] == 4
    )  # at ξ = 1, then after each of 3 partial steps
    assert result["forward_passes"] == 1 + 5 * 3  # the baseline metrics, then 5 points of 3 curves
    within = result["heads_prunable_within_one_point"]
    per_seed = [michel.heads_within(runs) for _, runs in seeds.groupby("seed")]
    assert within["random"]["per_seed"] == per_seed and within["importance"] == michel.heads_within(curve[:5])
    assert [f["path"] for f in result["data_files"]] == [str(glue_dir / "MRPC" / "dev.tsv")]


def test_cli_with_its_own_importance_set_counts_both_sets_compiles(tiny_ckpt, shared_data, tmp_path):
    out, glue_dir = tmp_path / "out", shared_data / "glue"
    jax.clear_caches()  # run.json counts the run's compiles: none of an earlier test's
    prune.main([
        "--ckpt", str(tiny_ckpt), "--task", "mrpc", "--glue-dir", str(glue_dir), "--n", "8", "--importance-n", "5",
        "--batch-size", "8", "--prune-step", "0.5", "--random-seeds", "0", "--out", str(out),
    ])  # fmt: skip
    result = json.loads((out / "run.json").read_text())["result"]
    assert result["importance_set"] == {"split": "dev", "examples": 5}
    # One forward executable per batch shape of the 8, one gradient executable per shape of the 5.
    tokenizer = bertjax.load_tokenizer(tiny_ckpt)
    shapes = [evaluation.load_eval_set(tokenizer, "mrpc", "dev", glue_dir, n, 128, 8)[0].shapes for n in (8, 5)]
    assert result["compiled_executables"] == len(shapes[0]) + len(shapes[1])
    assert [f["path"] for f in result["data_files"]] == [str(glue_dir / "MRPC" / "dev.tsv")]  # read twice, listed once


def test_a_classifier_for_another_label_count_is_one_user_error(shared_data, tmp_path, cli_error):
    ckpt = _save_tiny_classifier(tmp_path / "three_labels", shared_data, num_labels=3)
    out = tmp_path / "out"
    line = cli_error(prune.main, [
        "--ckpt", str(ckpt), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "4",
        "--random-seeds", "0", "--out", str(out),
    ])  # fmt: skip
    assert str(ckpt) in line and "num_labels=3" in line and "task mrpc has 2 labels" in line
    assert not out.exists()
