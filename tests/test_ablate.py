"""Kovaleva et al. 2019: exact uniform disabling, the once-compiled masked evaluator, the disabling
sweep, and the CLI contract; Michel et al. 2019 §3 (one head masked, one head kept per layer) and
the McNemar tests against a slow reference; on tiny random classifiers."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import jax
import numpy as np
import orbax.checkpoint as ocp
import pandas as pd
import pytest
from flax import nnx
from matplotlib.patches import Rectangle
from scipy import stats
from transformers import BertTokenizerFast

import bertjax
from analysis import ablate
from analysis.ablation import disabling, evaluation, features, kovaleva, patterns
from analysis.ablation import figures as ablation_figures
from bertjax import checkpoint as ckpt
from bertjax import glue
from bertjax.pretrained import open_checkpoint, trained_task
from sieves import align
from sieves.align import encode_batch
from sieves.parse import Word

N_LAYERS, N_HEADS = 2, 4


def tiny_classifier(seed: int = 3, **overrides) -> bertjax.BertForSequenceClassification:
    config = bertjax.BertConfig(
        num_hidden_layers=N_LAYERS, hidden_size=64, num_attention_heads=N_HEADS, intermediate_size=128,
        max_position_embeddings=128, **{"num_labels": 2, **overrides},
    )  # fmt: skip
    return bertjax.init_model(config, "BertForSequenceClassification", seed=seed)


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    return BertTokenizerFast(vocab=str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def model():
    return tiny_classifier()


@pytest.fixture(scope="module")
def mrpc_arrays(tokenizer, shared_data):
    """The first 20 MRPC dev pairs, encoded: lengths 30–80, so all fall in one 32-multiple bucket or more."""
    examples = glue.load_glue("mrpc", "dev", shared_data / "glue", 20)
    return glue.encode(examples, tokenizer, 96, "mrpc dev")


@pytest.fixture(scope="module")
def evaluator(model, mrpc_arrays):
    return evaluation.MaskedEvaluator(model, evaluation.make_eval_set(mrpc_arrays, 8, ("accuracy", "f1")))


def test_a_disabled_head_attends_exactly_uniformly_over_real_tokens(model):
    ids = np.array([[101, 7592, 2088, 102, 2023, 2003, 102, 0, 0], [101, 2057, 102, 2009, 102, 0, 0, 0, 0]], np.int32)
    mask = (ids != 0).astype(np.int32)
    disable = np.zeros((N_LAYERS, N_HEADS), bool)
    disable[1, 2] = True
    forward = jax.jit(lambda m, d: m(ids, mask, output_attentions=True, disable_heads=d).attentions)
    disabled, normal = forward(model, disable), forward(model, np.zeros_like(disable))
    for b, n in enumerate(mask.sum(1)):
        probs = np.asarray(disabled[1][b, 2])
        expected = np.zeros(ids.shape[1], np.float32)
        expected[:n] = np.float32(1.0) / np.float32(n)
        np.testing.assert_array_equal(probs[:n], np.broadcast_to(expected, (n, ids.shape[1])))
    # The other heads of that layer, and the layer below, are untouched.
    np.testing.assert_array_equal(np.asarray(disabled[0]), np.asarray(normal[0]))
    others = [h for h in range(N_HEADS) if h != 2]
    np.testing.assert_array_equal(np.asarray(disabled[1])[:, others], np.asarray(normal[1])[:, others])


def test_eval_set_sorts_by_length_pads_to_buckets_and_marks_dummy_rows(mrpc_arrays):
    eval_set = evaluation.make_eval_set(mrpc_arrays, 8, ("accuracy",))
    lengths = mrpc_arrays["attention_mask"].sum(1)
    assert eval_set.size == 20 and [b["valid"].sum() for b in eval_set.batches] == [8, 8, 4]
    assert np.array_equal(eval_set.labels, mrpc_arrays["labels"][np.argsort(lengths, kind="stable")])
    for batch in eval_set.batches:
        width = batch["input_ids"].shape[1]
        real = batch["attention_mask"][batch["valid"]].sum(1)
        assert width % align.LENGTH_BUCKET == 0 and real.max() <= width < real.max() + align.LENGTH_BUCKET
        assert (batch["attention_mask"][~batch["valid"]].sum(1) == 1).all()


def test_metrics_under_masks_equal_a_direct_forward_of_each_example(evaluator, model, mrpc_arrays):
    disable = np.zeros((N_LAYERS, N_HEADS), bool)
    disable[0, 1] = True
    head_mask = np.ones((N_LAYERS, N_HEADS), np.float32)
    head_mask[1, 3] = 0.0
    order = np.argsort(mrpc_arrays["attention_mask"].sum(1), kind="stable")
    # All 20 examples in file order, padded to 96 as encoded: no sorting, no buckets, no dummy rows.
    inputs = [mrpc_arrays[k] for k in ("input_ids", "attention_mask", "token_type_ids")]
    forward = jax.jit(lambda m, *a: m(*a, head_mask=head_mask, disable_heads=disable).logits)
    direct = np.asarray(forward(model, *inputs))[order]
    ours = evaluator.logits(head_mask, disable)
    # The same float32 forward in other batches and paddings: L = 2 layers of ≤ 128-term contractions
    # on logits ≲ 1, about L·√128·u ≈ 1.3e-6 (but see _check_row for this model's sharp attention).
    np.testing.assert_allclose(ours, direct, atol=1e-5)
    # Accuracy and F1 are counts over 20 examples (exact unless a logit ties); the atol is float64's.
    expected = glue.classification_metrics(direct, mrpc_arrays["labels"][order], ("accuracy", "f1"))
    assert evaluator.metrics(head_mask, disable) == pytest.approx(expected, abs=1e-6)


def test_masks_are_inputs_so_new_masks_never_recompile(evaluator):
    # The evaluation functions are shared by every evaluator of the architecture in the process:
    # from empty caches, the counts are this evaluator's alone.
    jax.clear_caches()
    before = evaluator.compiled_shapes()
    evaluator.metrics()
    compiled = evaluator.logits_fn._cache_size()
    assert compiled == len(evaluator.eval_set.shapes)  # one executable per batch shape, not per mask
    assert evaluator.compiled_shapes() - before == compiled
    rng = np.random.default_rng(0)
    for _ in range(4):
        evaluator.metrics(rng.random((N_LAYERS, N_HEADS)).astype(np.float32), rng.random((N_LAYERS, N_HEADS)) < 0.3)
    assert evaluator.logits_fn._cache_size() == compiled == evaluator.compiled_shapes() - before


def test_one_shape_eval_set_compiles_exactly_once(model, mrpc_arrays):
    jax.clear_caches()
    short = {k: v[:6] for k, v in mrpc_arrays.items()}
    one = evaluation.MaskedEvaluator(model, evaluation.make_eval_set(short, 8, ("accuracy",)))
    masks = [np.eye(N_LAYERS, N_HEADS, k=k, dtype=bool) for k in range(3)]
    for disable in masks:
        one.metrics(disable=disable)
    assert one.logits_fn._cache_size() == one.compiled_shapes() == 1
    # A second evaluator of the same architecture and shape compiles nothing.
    again = evaluation.MaskedEvaluator(model, evaluation.make_eval_set(short, 8, ("accuracy",)))
    again.metrics()
    assert again.logits_fn is one.logits_fn and again.compiled_shapes() == 0


def test_disable_sweep_rows_are_single_heads_and_whole_layers(evaluator):
    baseline, heads, layers = disabling.disable_sweep(evaluator)
    assert baseline == evaluator.metrics()
    assert len(heads) == N_LAYERS * N_HEADS and len(layers) == N_LAYERS
    one = np.zeros((N_LAYERS, N_HEADS), bool)
    one[1, 2] = True
    row = heads[(heads["layer"] == 1) & (heads["head"] == 2)].iloc[0]
    # The same compiled float32 computation on the same batches (a mean of 20 losses: 20·u ≈ 1.2e-6).
    assert row["loss"] == pytest.approx(evaluator.metrics(disable=one)["loss"], rel=2e-6)
    assert row["loss_change"] == pytest.approx(row["loss"] - baseline["loss"], abs=1e-9)  # float64 difference
    whole = np.zeros((N_LAYERS, N_HEADS), bool)
    whole[0] = True
    assert layers.iloc[0]["accuracy"] == evaluator.metrics(disable=whole)["accuracy"]
    grid = ablation_figures.head_grid(heads, "f1", N_LAYERS, N_HEADS)
    assert grid[1, 2] == row["f1"]
    # Every row carries the paired test of accuracy against the baseline, Holm over its own table.
    expected = evaluation.mcnemar(evaluator.score().correct, evaluator.score(disable=one).correct)
    assert (row["correct_to_wrong"], row["wrong_to_correct"], row["mcnemar_p_accuracy"]) == expected
    for table in (heads, layers):
        holm = _slow_holm(table["mcnemar_p_accuracy"].tolist())
        # float64 products of ≤ 12 p-values by integers, then running maxima: a few 2⁻⁵³ (rtol 1e-7).
        np.testing.assert_allclose(table["mcnemar_p_accuracy_holm"], holm)
        assert table["significant_holm"].tolist() == [p < 0.05 for p in holm]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, tokenizer):
    directory = tmp_path_factory.mktemp("tiny_classifier")
    bertjax.save_pretrained(tiny_classifier(), directory)
    tokenizer.save_pretrained(directory)
    return directory


TEST_COLUMNS = "correct_to_wrong,wrong_to_correct,mcnemar_p_accuracy,mcnemar_p_accuracy_holm,significant_holm"


def test_cli_writes_tables_figures_and_run_json(tiny_ckpt, shared_data, tmp_path, cli_error):
    out = tmp_path / "out"
    argv = ["--ckpt", str(tiny_ckpt), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "12",
            "--batch-size", "8", "--analyses", "disable,mask", "--out", str(out), "--figure-format", "png,svg"]  # fmt: skip
    jax.clear_caches()  # run.json counts the run's compiles: none of an earlier test's
    ablate.main(argv)
    metric_columns = "accuracy,f1,loss,accuracy_change,f1_change,loss_change"
    for name, rows in (
        ("disable_heads", N_LAYERS * N_HEADS),
        ("mask_one_head", N_LAYERS * N_HEADS),
        ("best_head_only", N_LAYERS),
    ):
        lines = (out / f"mrpc_{name}.csv").read_text().splitlines()
        assert lines[0] == f"layer,head,{metric_columns},{TEST_COLUMNS}" and len(lines) == 1 + rows
    assert (out / "mrpc_disable_heads_f1_change.png").is_file() and (
        out / "mrpc_disable_layers_accuracy_change.svg"
    ).is_file()
    assert (out / "mrpc_mask_one_head_accuracy_change.png").is_file() and (
        out / "mrpc_mask_one_head_f1_change.svg"
    ).is_file()
    info = json.loads((out / "run.json").read_text())
    task = info["tasks"]["mrpc"]
    assert task["split"] == "dev" and task["examples"] == 12
    evaluation = task["masked_evaluation"]
    # One baseline pass shared by both analyses; disable: L·H heads + L layers; mask: L·H + L·H.
    assert evaluation["forward_passes"] == 1 + N_LAYERS * N_HEADS + N_LAYERS + 2 * N_LAYERS * N_HEADS
    assert evaluation["compiled_executables"] == len(evaluation["batch_shapes"])
    assert set(evaluation["disable"]) == {"heads", "layers"} and set(evaluation["mask"]) == {
        "one_head_masked",
        "best_head_only",
    }
    assert not list(tmp_path.glob(".out.tmp-*"))
    # A second run into the same non-empty directory is a one-line user error.
    assert "--overwrite" in cli_error(ablate.main, argv)


def test_unknown_analysis_and_bad_alpha_are_user_errors(tiny_ckpt):
    with pytest.raises(bertjax.UserError, match="--analyses"):
        ablate.parse_args(["--ckpt", str(tiny_ckpt), "--analyses", "disable,dance"])
    with pytest.raises(bertjax.UserError, match="--alpha"):
        ablate.parse_args(["--ckpt", str(tiny_ckpt), "--alpha", "1"])


@pytest.mark.parametrize("analysis", kovaleva.CLASSIFIER_ANALYSES)
def test_a_classifier_for_another_label_count_is_one_user_error(analysis, tokenizer, shared_data, tmp_path, cli_error):
    ckpt = tmp_path / "three_labels"
    bertjax.save_pretrained(tiny_classifier(num_labels=3), ckpt)
    tokenizer.save_pretrained(ckpt)
    out = tmp_path / "out"
    line = cli_error(ablate.main, [
        "--ckpt", str(ckpt), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "4",
        "--analyses", analysis, "--out", str(out),
    ])  # fmt: skip
    assert str(ckpt) in line and "num_labels=3" in line and "task mrpc has 2 labels" in line
    assert not out.exists()


# -- paired tests and Michel et al. §3 ---------------------------------------------------------


def _slow_mcnemar_p(b: int, c: int) -> float:
    """Two-sided exact binomial p of b among b + c at 1/2: twice the smaller tail, in exact fractions."""
    n = b + c
    tail = sum(Fraction(math.comb(n, k), 2**n) for k in range(min(b, c) + 1))
    return float(min(Fraction(1), 2 * tail))


def _slow_holm(p: list[float]) -> list[float]:
    """Holm's step-down adjustment, one p at a time in increasing order."""
    m, running, adjusted = len(p), 0.0, [0.0] * len(p)
    for rank, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def test_mcnemar_counts_discordant_pairs_and_matches_scipy_and_a_hand_count():
    rng = np.random.default_rng(4)
    cases = [(rng.random(n) < 0.7, rng.random(n) < q) for n, q in [(1, 0.5), (10, 0.5), (57, 0.3), (408, 0.8)]]
    cases += [
        (np.ones(5, bool), np.ones(5, bool)),  # no discordant pair
        (np.array([1, 1, 0, 0], bool), np.array([0, 0, 1, 1], bool)),  # b = c
        (np.zeros(9, bool), np.r_[np.ones(6), np.zeros(3)].astype(bool)),  # b = 0, c = 6: p = 2 / 2^6
    ]
    for baseline, ablated in cases:
        b, c, p = evaluation.mcnemar(baseline, ablated)
        assert b == sum(1 for x, y in zip(baseline, ablated, strict=True) if x and not y)
        assert c == sum(1 for x, y in zip(baseline, ablated, strict=True) if y and not x)
        # float64 binomial tails of ≤ 2¹² terms either side: ≤ 2¹²·2⁻⁵³ ≈ 5e-13, so 1e-12.
        assert p == pytest.approx(_slow_mcnemar_p(b, c), rel=1e-12)
        if b + c:
            assert p == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-12)
    assert evaluation.mcnemar(*cases[-3])[2] == 1.0 and evaluation.mcnemar(*cases[-2])[2] == 1.0
    assert evaluation.mcnemar(*cases[-1]) == (0, 6, pytest.approx(1 / 32))


def test_holm_over_a_table_and_the_counts_of_raised_and_lowered_accuracy():
    rng = np.random.default_rng(8)
    p = np.r_[rng.uniform(0, 0.002, 4), rng.uniform(0, 1, 8), 1.0]
    changes = np.r_[0.03, -0.02, -0.01, 0.0, rng.uniform(-0.05, 0.05, 9)]
    table = evaluation.add_holm(pd.DataFrame({"accuracy_change": changes, "mcnemar_p_accuracy": p}), alpha=0.05)
    holm = _slow_holm(p.tolist())
    np.testing.assert_allclose(table["mcnemar_p_accuracy_holm"], holm, rtol=1e-12)
    significant = [x < 0.05 for x in holm]
    assert table["significant_holm"].tolist() == significant and 0 < sum(significant) < len(p)
    up, down = changes > 0, changes <= -0.01 + 1e-12  # a change of exactly one point counts as one point
    assert evaluation.change_counts(table) == {
        "raise_accuracy": up.sum(), "raise_accuracy_significant": (up & significant).sum(),
        "lower_accuracy_by_one_point": down.sum(), "lower_accuracy_by_one_point_significant": (down & significant).sum(),
        "significant": sum(significant),
    }  # fmt: skip


def test_a_classifier_fine_tuned_on_another_task_is_one_user_error(tokenizer, shared_data, tmp_path, cli_error):
    """Both tasks have 2 labels, so only the task the checkpoint records can tell them apart."""
    ckpt = tmp_path / "sst2_classifier"
    bertjax.save_pretrained(tiny_classifier(), ckpt)
    tokenizer.save_pretrained(ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "finetuning_task": "SST-2"}))  # as older run_glue wrote it
    out = tmp_path / "out"
    line = cli_error(ablate.main, [
        "--ckpt", str(ckpt), "--task", "all", "--glue-dir", str(shared_data / "glue"), "--n", "4",
        "--analyses", "disable", "--out", str(out),
    ])  # fmt: skip
    assert str(ckpt) in line and "fine-tuned on sst2, not qnli: give --task sst2" in line
    assert not out.exists()


def test_the_trained_task_is_read_from_a_finetune_run_and_absent_elsewhere(tmp_path):
    model = tiny_classifier()
    for name, run_config in (("finetuned", {"task": "qnli", "init": "x"}), ("pretrained", {"train": {"steps": 3}})):
        manager = ocp.CheckpointManager(tmp_path / name / ckpt.CHECKPOINTS, item_names=(ckpt.PARAMS, ckpt.META))
        params = ckpt.flatten_params(nnx.state(model, nnx.Param))
        manager.save(1, args=ocp.args.Composite(**ckpt.save_args(params, ckpt.make_meta(model, "tok", run_config))))
        manager.wait_until_finished()
        manager.close()
    assert trained_task(open_checkpoint(tmp_path / "finetuned")) == "qnli"
    assert trained_task(open_checkpoint(tmp_path / "pretrained")) is None
    bertjax.save_pretrained(model, tmp_path / "hf")
    assert trained_task(open_checkpoint(tmp_path / "hf")) is None


@pytest.fixture(scope="module")
def sensitive_model():
    """Large random weights: predictions differ between examples and move when heads are masked,
    so the paired counts below are not all zero (at the default init every prediction is one class)."""
    return tiny_classifier(seed=3, initializer_range=0.5)


@pytest.fixture(scope="module")
def sensitive_evaluator(sensitive_model, mrpc_arrays):
    return evaluation.MaskedEvaluator(sensitive_model, evaluation.make_eval_set(mrpc_arrays, 8, ("accuracy", "f1")))


@pytest.fixture(scope="module")
def by_hand(sensitive_model, mrpc_arrays):
    """head_mask ↦ (metrics, per-example correctness) from one direct forward of all 20 examples in
    file order: no sorting, buckets or dummy rows."""
    inputs = [mrpc_arrays[k] for k in ("input_ids", "attention_mask", "token_type_ids")]
    labels = mrpc_arrays["labels"]
    forward = jax.jit(lambda m, mask, *a: m(*a, head_mask=mask).logits)

    def run(head_mask):
        logits = np.asarray(forward(sensitive_model, head_mask, *inputs), np.float64)
        predictions = logits.argmax(-1)
        tp = np.sum((predictions == 1) & (labels == 1))
        log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        metrics = {
            "accuracy": np.mean(predictions == labels),
            "f1": 2 * tp / (2 * tp + np.sum(predictions != labels)),
            "loss": -np.mean(log_p[np.arange(len(labels)), labels]),
        }
        return metrics, predictions == labels

    return run


def _check_row(row, metrics, correct, baseline_metrics, baseline_correct) -> float:
    """One table row against the hand-computed pass; returns the hand-computed p.

    The evaluator pads to its buckets, the hand pass to the longest of the 20, and in float32 this
    sharp-attention model moves an example's logits by up to ~1.3e-4 between two padded lengths
    (measured on an Intel Xeon; an AMD EPYC happened to stay within 1e-5). Hence 1e-4 on the loss:
    masking another head than the row names moves it by at least 0.012 here.
    """
    for name, value in metrics.items():
        tolerance = 1e-4 if name == "loss" else 1e-12
        assert row[name] == pytest.approx(value, abs=tolerance)
        assert row[f"{name}_change"] == pytest.approx(value - baseline_metrics[name], abs=tolerance)
    b = int(sum(1 for x, y in zip(baseline_correct, correct, strict=True) if x and not y))
    c = int(sum(1 for x, y in zip(baseline_correct, correct, strict=True) if y and not x))
    assert (row["correct_to_wrong"], row["wrong_to_correct"]) == (b, c)
    p = _slow_mcnemar_p(b, c)
    assert row["mcnemar_p_accuracy"] == pytest.approx(p, rel=1e-9)
    return p


def _check_holm(table: pd.DataFrame, p: list[float], alpha: float) -> None:
    holm = _slow_holm(p)
    np.testing.assert_allclose(table["mcnemar_p_accuracy_holm"], holm, rtol=1e-9)
    assert table["significant_holm"].tolist() == [x < alpha for x in holm]


def test_mask_one_head_equals_masking_each_head_by_hand(sensitive_evaluator, by_hand):
    baseline_metrics, baseline_correct = by_hand(np.ones((N_LAYERS, N_HEADS), np.float32))
    table = disabling.mask_one_head(sensitive_evaluator, sensitive_evaluator.score(), alpha=0.5)
    assert list(zip(table["layer"], table["head"], strict=True)) == list(np.ndindex(N_LAYERS, N_HEADS))
    p = []
    for (layer, head), (_, row) in zip(np.ndindex(N_LAYERS, N_HEADS), table.iterrows(), strict=True):
        mask = np.ones((N_LAYERS, N_HEADS), np.float32)
        mask[layer, head] = 0.0
        p.append(_check_row(row, *by_hand(mask), baseline_metrics, baseline_correct))
    _check_holm(table, p, alpha=0.5)
    assert (table["correct_to_wrong"] + table["wrong_to_correct"]).gt(0).all()  # not a vacuous 0 = 0


def test_best_head_only_keeps_each_layers_best_single_head_by_hand(sensitive_evaluator, by_hand):
    baseline_metrics, baseline_correct = by_hand(np.ones((N_LAYERS, N_HEADS), np.float32))
    table = disabling.best_head_only(sensitive_evaluator, sensitive_evaluator.score(), "accuracy", alpha=0.5)
    assert table["layer"].tolist() == list(range(N_LAYERS))
    p = []
    for layer in range(N_LAYERS):
        kept = []
        for head in range(N_HEADS):
            mask = np.ones((N_LAYERS, N_HEADS), np.float32)
            mask[layer] = 0.0
            mask[layer, head] = 1.0
            kept.append(by_hand(mask))
        accuracies = [metrics["accuracy"] for metrics, _ in kept]
        best = accuracies.index(max(accuracies))  # ties: the lowest head index
        row = table.iloc[layer]
        assert row["head"] == best
        p.append(_check_row(row, *kept[best], baseline_metrics, baseline_correct))
    _check_holm(table, p, alpha=0.5)


def _titles(monkeypatch) -> list[str]:
    """Replaces `ablation.figures.head_heatmap` with a recorder of the titles it is given."""
    titles: list[str] = []
    monkeypatch.setattr(
        ablation_figures, "head_heatmap", lambda values, title, *args, **kwargs: titles.append(title) or []
    )
    return titles


def test_figures_name_the_split_they_were_measured_on(monkeypatch, tmp_path):
    layers, heads = np.indices((N_LAYERS, N_HEADS))
    table = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "accuracy": 0.5, "accuracy_change": 0.0,
                          "significant_holm": False})  # fmt: skip
    per_layer = pd.DataFrame({"layer": range(N_LAYERS), "accuracy": 0.5, "accuracy_change": 0.0})
    titles = _titles(monkeypatch)
    ablation_figures.plot_disabling({"accuracy": 0.5}, table, per_layer, ("accuracy",), "mrpc", "train", tmp_path)
    ablation_figures.plot_mask_one_head({"accuracy": 0.5}, table, ("accuracy",), "mrpc", "train", tmp_path, 0.05)
    assert len(titles) == 4 and not any("dev" in t for t in titles)
    assert all("train accuracy" in t for t in titles if "layer disabled" not in t)


def test_heatmap_boxes_exactly_the_marked_cells(monkeypatch, tmp_path):
    figures = []
    monkeypatch.setattr(ablation_figures, "save_figure", lambda fig, out_dir, stem: figures.append(fig) or [])
    marked = np.zeros((N_LAYERS, N_HEADS), bool)
    marked[[0, 1], [3, 1]] = True
    ablation_figures.head_heatmap(np.zeros((N_LAYERS, N_HEADS)), "t", "l", tmp_path, "x", diverging=True, marked=marked)
    boxes = [p for p in figures[0].axes[0].patches if isinstance(p, Rectangle)]
    assert sorted((int(r.get_y() + 0.5), int(r.get_x() + 0.5)) for r in boxes) == [(0, 3), (1, 1)]


# -- attention pattern classes (§4.1) ----------------------------------------------------------

# [CLS] ten words [SEP] ten words [SEP], then three padding positions.
LENGTH, PADDED = 23, 26
SPECIAL_AT = (0, 11, 22)


def _pair_layout(first_words: int = 10):
    """[CLS] `first_words` words [SEP] the rest [SEP], padded."""
    special_at = (0, first_words + 1, LENGTH - 1)
    real = np.zeros(PADDED, bool)
    real[:LENGTH] = True
    special = np.zeros(PADDED, bool)
    special[list(special_at)] = True
    segment = np.r_[np.zeros(first_words + 2, int), np.ones(PADDED - first_words - 2, int)]
    return real, special, segment


def _synthetic_map(kind: str, rng: np.random.Generator) -> np.ndarray:
    """One [PADDED, PADDED] map of the named class; special rows attend uniformly (not scored)."""
    real, special, segment = _pair_layout()
    words = real & ~special
    attn = np.zeros((PADDED, PADDED))
    for t in range(LENGTH):
        row = np.zeros(PADDED)
        neighbour = t - 1 if words[t - 1] else t + 1  # the previous word, else the next one
        own_sep = SPECIAL_AT[1] if segment[t] == 0 else SPECIAL_AT[2]
        if special[t]:
            row[:LENGTH] = 1.0
        elif kind == "vertical":
            row[list(SPECIAL_AT)] = [0.5, 0.25, 0.25]
        elif kind == "diagonal":
            row[neighbour] = 1.0
        elif kind == "vertical+diagonal":
            row[[own_sep, neighbour]] = 0.5
        elif kind == "block":
            row[words & (segment == segment[t])] = 1.0
        elif kind == "heterogeneous":
            row[:LENGTH] = rng.dirichlet(np.ones(LENGTH))
        attn[t] = row / row.sum()
    return attn


@pytest.mark.parametrize("kind", patterns.PATTERNS)
def test_synthetic_maps_are_classified_as_built(kind):
    real, special, segment = _pair_layout()
    attn = _synthetic_map(kind, np.random.default_rng(7))[None, None]  # [B=1, H=1, T, T]
    v, d, b = patterns.pattern_quantities(attn, real[None], special[None], segment[None])
    assert patterns.PATTERNS[patterns.classify_patterns(v, d, b, True)[0, 0]] == kind
    # The jitted path gives the same quantities.
    on_device = patterns.pattern_quantities(jax.numpy.asarray(attn), real[None], special[None], segment[None])
    # float32 on the device against NumPy float64: row sums of T = 23 weights ≤ 1, a mean over ≤ 23
    # rows and two divisions, the last by 1 − chance ≈ 0.48 (the block share): (2T + 2)·u / 0.48 ≈
    # 6e-6 at worst (measured 3.1e-8); a share without the chance correction is ≥ 1e-2 off.
    np.testing.assert_allclose(np.stack(on_device), np.stack([v, d, b]), atol=(2 * LENGTH + 2) * 2.0**-24 / 0.48)
    if kind == "block":  # block is defined for two-segment inputs only
        assert patterns.classify_patterns(v, d, b, False)[0, 0] == patterns.PATTERNS.index("heterogeneous")


def test_pattern_quantities_match_a_loop_over_rows_and_keys():
    rng = np.random.default_rng(3)
    real, special, segment = _pair_layout()
    attn = np.zeros((2, 3, PADDED, PADDED))
    attn[..., :LENGTH] = rng.dirichlet(np.ones(LENGTH) * 0.3, size=(2, 3, PADDED))
    v, d, b = patterns.pattern_quantities(attn, np.stack([real] * 2), np.stack([special] * 2), np.stack([segment] * 2))
    rows = [t for t in range(LENGTH) if not special[t]]
    for batch, head in np.ndindex(2, 3):
        a = attn[batch, head]
        slow_v = np.mean([sum(a[t, s] for s in SPECIAL_AT) for t in rows])
        slow_d = np.mean([sum(a[t, s] for s in (t - 1, t, t + 1) if s in rows) for t in rows])
        same = np.mean([sum(a[t, s] for s in rows if segment[s] == segment[t]) for t in rows])
        on_words = np.mean([sum(a[t, s] for s in rows) for t in rows])
        chance = np.mean([sum(segment[s] == segment[t] for s in rows) / len(rows) for t in rows])
        slow_b = (same / on_words - chance) / (1 - chance)
        # float64 both ways, sums of ≤ 24 terms: ≤ 24·2⁻⁵³, so approx's default rel 1e-6 is loose
        # yet a block share without the chance correction is ≥ 1e-2 off (the planted case below).
        assert (v[batch, head], d[batch, head], b[batch, head]) == pytest.approx((slow_v, slow_d, slow_b))
        assert b[batch, head] != pytest.approx(same / on_words)


def test_a_head_attending_to_itself_is_diagonal_and_uniform_attention_is_not_block():
    real, special, segment = _pair_layout()
    attn = np.diag(real.astype(float))[None, None]
    v, d, b = patterns.pattern_quantities(attn, real[None], special[None], segment[None])
    assert patterns.PATTERNS[patterns.classify_patterns(v, d, b, True)[0, 0]] == "diagonal"
    real, special, segment = _pair_layout(first_words=2)  # 2 and 18 words: uniform keeps 0.82 in-segment
    attn = np.broadcast_to(real / real.sum(), (PADDED, PADDED))[None, None]
    v, d, b = patterns.pattern_quantities(attn, real[None], special[None], segment[None])
    assert b[0, 0] == pytest.approx(0.0, abs=1e-12)
    assert patterns.PATTERNS[patterns.classify_patterns(v, d, b, True)[0, 0]] == "heterogeneous"


def test_block_share_is_undefined_for_single_sentence_tasks():
    counts = np.zeros((2, 2, len(patterns.PATTERNS)), np.int64)
    counts[..., patterns.PATTERNS.index("heterogeneous")] = 3
    counts[..., patterns.PATTERNS.index("vertical")] = 1
    shares = patterns.pattern_shares({"sst2": counts, "mrpc": counts}).set_index(["task", "pattern"])["share"]
    assert np.isnan(shares[("sst2", "block")]) and shares[("mrpc", "block")] == 0.0
    assert shares[("sst2", "vertical")] == shares[("mrpc", "vertical")] == 0.25


def test_pattern_thresholds_at_their_boundaries():
    classify = lambda v, d, b, paired=True: patterns.PATTERNS[int(patterns.classify_patterns(v, d, b, paired))]
    assert classify(0.45, 0.05, 0.9) == "vertical"  # v + d = 0.5 exactly: structured
    assert classify(0.375, 0.125, 0.9) == "vertical+diagonal"  # d is exactly a quarter: not minor
    assert classify(0.12, 0.38, 0.9) == "diagonal"
    assert classify(0.25, 0.24, 0.6) == "block"  # v + d < 0.5, b = 0.6
    assert classify(0.25, 0.24, 0.6, paired=False) == "heterogeneous"
    assert classify(0.25, 0.24, 0.59) == "heterogeneous"


# -- linguistic features (§4.4) ----------------------------------------------------------------


def _words(text, words):
    """A parse of `text` from (form, pos, dep) words found left to right in it."""
    parse, cursor = [], 0
    for form, pos, dep in words:
        start = text.index(form, cursor)
        cursor = start + len(form)
        parse.append(Word(start, cursor, dep, 0, pos))
    return tuple(parse)


def _parsed(tokenizer, text, words):
    """An encoded one-segment sequence and its word texts."""
    parse = _words(text, words)
    return encode_batch(tokenizer, [[text]], [[parse]])[0], [text[w.start : w.end] for w in parse]


SENTENCE = "Note: nobody saw the cat, and it did n't eat fish."
WORDS = [("Note", "NOUN", "root"), (":", "PUNCT", "punct"), ("nobody", "PRON", "nsubj"), ("saw", "VERB", "conj"),
         ("the", "DET", "det"), ("cat", "NOUN", "dobj"), (",", "PUNCT", "punct"), ("and", "CCONJ", "cc"),
         ("it", "PRON", "nsubj"), ("did", "AUX", "aux"), ("n't", "PART", "neg"), ("eat", "VERB", "conj"),
         ("fish", "NOUN", "dobj"), (".", "PUNCT", "punct")]  # fmt: skip


def test_feature_occurrences_match_whole_words_only(tokenizer):
    seq, texts = _parsed(tokenizer, SENTENCE, WORDS)
    found = features.feature_occurrences(seq, texts)
    words_of = lambda feature: [texts[int(seq.word_ids[pieces[0]])] for pieces in found[feature]]
    assert words_of("negation") == ["nobody", "n't"]  # "Note" holds "not" but is not the word "not"
    assert words_of("noun") == ["Note", "cat", "fish"] and words_of("verb") == ["saw", "eat"]
    assert words_of("pronoun") == ["nobody", "it"] and words_of("subject") == ["nobody", "it"]
    assert words_of("object") == ["cat", "fish"]
    assert [p.tolist() for p in found["[CLS]"]] == [[0]] and [p.tolist() for p in found["[SEP]"]] == [[seq.length - 1]]
    assert features.word_features("NOT", "PART", "neg") == {"negation"}
    assert features.word_features("can\u2019t", "AUX", "aux") == set()  # the whole word is not a negation word
    assert features.word_features("n\u2019t", "PART", "neg") == {"negation"}


def test_feature_scores_are_the_max_over_occurrences_of_length_normalised_column_sums(tokenizer):
    seq, texts = _parsed(tokenizer, SENTENCE, WORDS[:9] + [("did", "AUX", "aux")])  # no negation after "nobody"
    rng = np.random.default_rng(11)
    n, padded = seq.length, seq.length + 3
    attn = np.zeros((2, 1, 3, padded, padded))  # [L, B, H, T, T]
    attn[..., :n] = rng.dirichlet(np.ones(n), size=(2, 1, 3, padded))
    real = (np.arange(padded) < n)[None]
    columns = patterns.column_mass(attn, real)[:, 0]
    occurrences = features.feature_occurrences(seq, texts)
    scores = features.feature_scores(columns, occurrences)
    assert "negation" in scores and "object" in scores and set(scores) == {f for f, o in occurrences.items() if o}
    no_verbs = {**occurrences, "verb": []}
    assert "verb" not in features.feature_scores(columns, no_verbs)  # sequences without the feature are skipped
    for feature, where in occurrences.items():
        for layer, head in np.ndindex(2, 3):
            a = attn[layer, 0, head]
            slow = max(sum(a[t, s] for t in range(n) for s in pieces) / n for pieces in where) if where else None
            if slow is not None:
                assert scores[feature][layer, head] == pytest.approx(slow)  # float64, ≤ n² terms: ~2⁻⁴⁰


def test_streamed_summaries_equal_per_sequence_attention(model, tokenizer):
    texts = [("The cat sat on the mat.", "It did not move."), ("A dog barked.", "Nobody heard it at all.")]
    words = [[("cat", "NOUN", "nsubj"), ("sat", "VERB", "root")], [("It", "PRON", "nsubj"), ("not", "PART", "neg")],
             [("dog", "NOUN", "nsubj"), ("barked", "VERB", "root")], [("Nobody", "PRON", "nsubj"), ("it", "PRON", "dobj")]]  # fmt: skip
    parses = [(_words(a, words[2 * i]), _words(b, words[2 * i + 1])) for i, (a, b) in enumerate(texts)]
    word_texts = {
        i: [text[w.start : w.end] for text, parse in zip(pair, parses[i], strict=True) for w in parse]
        for i, pair in enumerate(texts)
    }
    seqs = encode_batch(tokenizer, texts, parses)
    summary = kovaleva.summarise_sequences(
        kovaleva.make_summariser(model), seqs, word_texts, 4, 128, (N_LAYERS, N_HEADS)
    )
    counts = np.zeros((N_LAYERS, N_HEADS, len(patterns.PATTERNS)), int)
    sums = {}
    for seq in seqs:
        attn = np.stack(
            model(seq.input_ids[None], output_attentions=True, token_type_ids=seq.token_type_ids[None]).attentions
        )
        real = np.ones((1, seq.length), bool)
        v, d, b = patterns.pattern_quantities(attn, real, seq.special[None], seq.token_type_ids[None])
        for layer, head in np.ndindex(N_LAYERS, N_HEADS):
            counts[layer, head, patterns.classify_patterns(v, d, b, True)[layer, 0, head]] += 1
        scores = features.feature_scores(
            patterns.column_mass(attn, real)[:, 0], features.feature_occurrences(seq, word_texts[seq.index])
        )
        for feature, score in scores.items():
            sums[feature] = sums.get(feature, 0) + score
    np.testing.assert_array_equal(summary.pattern_counts, counts)
    assert summary.feature_sequences == {
        f: 2 if f in ("noun", "verb", "pronoun", "subject", "negation", "[CLS]", "[SEP]") else 1 if f == "object" else 0
        for f in features.FEATURES
    }
    for feature, total in sums.items():
        # float32 attentions (another batch and padding: the model bound, ~L·√128·u ≈ 1.3e-6) summed
        # over ≤ T² cells per sequence then 2 sequences, √(T²)·u·(sum) with T ≲ 20: rtol 1e-5.
        np.testing.assert_allclose(summary.feature_sums[feature], total, rtol=1e-5, atol=1e-7)


def test_cli_patterns_and_features_against_a_second_checkpoint(tiny_ckpt, tokenizer, shared_data, tmp_path):
    other = tmp_path / "other"
    bertjax.save_pretrained(tiny_classifier(seed=9), other)
    tokenizer.save_pretrained(other)
    out = tmp_path / "out"
    ablate.main([
        "--ckpt", str(tiny_ckpt), "--compare-ckpt", str(other), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"),
        "--n", "6", "--batch-size", "8", "--analyses", "patterns,features", "--cache-dir", str(tmp_path / "cache"),
        "--out", str(out), "--figure-format", "png,svg",
    ])  # fmt: skip
    shares = pd.read_csv(out / "pattern_shares.csv")
    assert shares["pattern"].tolist() == list(patterns.PATTERNS) and shares["maps"].sum() == 6 * N_LAYERS * N_HEADS
    assert shares["share"].sum() == pytest.approx(1.0)  # 5 float64 shares: ~5·2⁻⁵³, inside rel 1e-6
    per_head = pd.read_csv(out / "mrpc_patterns.csv")
    assert (per_head[list(patterns.PATTERNS)].sum(axis=1) == 6).all()
    features = pd.read_csv(out / "mrpc_features.csv")
    assert set(features["checkpoint"]) == {"fine-tuned", "pre-trained"}
    assert (features[features["feature"] == "[CLS]"]["sequences"] == 6).all()
    assert (out / "pattern_shares.png").is_file() and (out / "mrpc_features.svg").is_file()
