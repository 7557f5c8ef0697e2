"""One pre-training step against transformers: the loss (MLM and NSP) and every parameter's gradient
from `train.losses.pretraining_loss` on bertjax's `BertForPreTraining`, in float32, equal
`transformers.BertForPreTraining`'s in float64 on the same weights and the same batch.

The batch is what `train.data.PretrainingData` feeds the trainer: `[CLS] A [SEP] B [SEP]` pairs with
token types and padding, masked by `train.instances.mask_batch` (so with padding predictions of
weight 0). Dropout is off; every parameter (biases, LayerNorms and the MLM output bias included) is
random, so no gradient is checked only at a special point.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import bertjax
from bertjax import convert
from bertjax import model as bert_model
from train import losses
from train.instances import MaskingSpec, mask_batch

# float32 (u = 2⁻²⁴ ≈ 6e-8) against a float64 reference, whose own rounding (~1e-16) is nil.
# A gradient entry ends a chain of n float32 contractions: forward through the embeddings, L = 2
# layers (Q/K/V, scores, context, output, two FFN products, two LayerNorms: 8 each) and the heads
# (transform, LayerNorm, decoder, softmax over V; pooler, classifier: ~6), back through the same
# chain, then one sum over the batch: n ≈ 2·(8L + 6) + 1 = 45. A contraction of K terms (K ≤ V =
# 101, the longest) rounds by ~√K·u of its terms' scale (a random walk), and along the chain those
# errors add at worst linearly: n·√K·u ≈ 45·10·6e-8 ≈ 2.7e-5 of the tensor's largest entries. So a
# tensor's error is measured against its largest |gradient|, not entry by entry: an entry that is
# a near-cancelling sum keeps the absolute error of its terms. Measured: at most 1.1e-6 on both
# paths (errors adding in quadrature, √n·√K·u ≈ 4e-6, is the typical size). A subtly wrong model,
# GELU's tanh approximation in place of erf, is 1.4e-3 off (46× the bound); the planted defects
# below are more than 100× the bound off.
GRAD_BOUND = 3e-5
# The loss is the forward half of that chain, n ≈ 8L + 6 = 22: 22·10·6e-8 ≈ 1.3e-5 of the loss
# (measured ≤ 5.1e-8). The tanh GELU moves the MLM loss by only 8.8e-6 of it (NSP's by 1.0e-4):
# the gradients, not the loss, are what catch an implementation that is nearly right.
LOSS_BOUND = 1.5e-5

VOCAB, LENGTH, PREDICTIONS = 101, 16, 4
PAD, CLS, SEP, MASK = 0, 2, 3, 4


@pytest.fixture(scope="module")
def step_model():
    """A random 2-layer BertForPreTraining (hidden 32, FFN 64) without dropout; its weights are
    drawn with std 0.2 so that pre-activations are O(1) and GELU, softmax and tanh are non-linear."""
    config = bertjax.preset(
        "tiny",
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = bertjax.init_model(config, bertjax.BertForPreTraining, seed=0)
    params = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(0)
    for path, variable in nnx.to_flat_state(params):
        shape = variable.get_value().shape
        value = {"scale": 1.0 + 0.1 * rng.standard_normal(shape), "bias": 0.1 * rng.standard_normal(shape)}.get(
            path[-1], 0.2 * rng.standard_normal(shape)
        )
        variable.set_value(jnp.asarray(value, jnp.float32))
    nnx.update(model, params)
    return model


@pytest.fixture(scope="module")
def step_batch():
    """Four NSP pairs of 16, 12, 8 and 6 tokens in a length-16 batch, masked as the trainer's data
    iterator masks them: 15% of the non-special tokens, padded to 4 predictions with weight 0."""
    rng = np.random.default_rng(1)
    segments = [(6, 7), (5, 4), (3, 2), (2, 1)]
    input_ids = np.full((len(segments), LENGTH), PAD, np.int32)
    token_type_ids = np.zeros_like(input_ids)
    lengths = np.zeros(len(segments), np.int32)
    for row, (a, b) in enumerate(segments):
        tokens = [CLS, *rng.integers(5, VOCAB, a), SEP, *rng.integers(5, VOCAB, b), SEP]
        input_ids[row, : len(tokens)] = tokens
        token_type_ids[row, a + 2 : len(tokens)] = 1
        lengths[row] = len(tokens)
    spec = MaskingSpec(VOCAB, MASK, (CLS, SEP, PAD), masked_lm_prob=0.15, max_predictions=PREDICTIONS)
    masked = mask_batch(input_ids, lengths, spec, rng)
    batch = {
        **masked,
        "token_type_ids": token_type_ids,
        "attention_mask": (np.arange(LENGTH) < lengths[:, None]).astype(np.int32),
        "nsp_labels": np.array([0, 1, 1, 0], np.int32),
    }
    weights = batch["masked_weights"]
    assert weights.min() == 0 and weights.sum(axis=1).min() >= 1, "padding predictions and real ones"
    assert batch["attention_mask"].min() == 0, "padding tokens"
    return batch


@pytest.fixture(scope="module")
def reference(step_model, step_batch, tmp_path_factory):
    """transformers' float64 step on the same weights (through `save_pretrained`): its own loss
    (`labels` -100 off the masked positions, as HF's data collator writes them), the MLM and NSP
    cross-entropies apart, and the gradients by HF parameter name."""
    directory = bertjax.save_pretrained(step_model, tmp_path_factory.mktemp("grad_parity"))
    theirs = transformers.BertForPreTraining.from_pretrained(str(directory), attn_implementation="eager")
    theirs = theirs.eval().double()
    labels = np.full(step_batch["input_ids"].shape, -100, np.int64)
    rows, slots = np.nonzero(step_batch["masked_weights"])
    labels[rows, step_batch["masked_positions"][rows, slots]] = step_batch["masked_ids"][rows, slots]
    nsp_labels = torch.tensor(step_batch["nsp_labels"], dtype=torch.long)
    out = theirs(
        **{k: torch.tensor(step_batch[k], dtype=torch.long) for k in ("input_ids", "attention_mask", "token_type_ids")},
        labels=torch.tensor(labels),
        next_sentence_label=nsp_labels,
    )
    out.loss.backward()
    with torch.no_grad():
        mlm = torch.nn.functional.cross_entropy(
            out.prediction_logits.reshape(-1, VOCAB), torch.tensor(labels).reshape(-1)
        )
        nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, nsp_labels)
    grads = {name: p.grad.numpy() for name, p in theirs.named_parameters()}
    return {"loss": out.loss.item(), "mlm_loss": mlm.item(), "nsp_loss": nsp.item()}, grads


def _one_hot_lookup(table, ids, dtype):
    """The accelerators' lookup (gradient as a one-hot product), which CPUs otherwise never run."""
    return bert_model._gather_one_hot_grad(table, ids, dtype)


def _step(model, batch, explicit_attention: bool):
    """bertjax's losses and gradients (by HF name) of one step, jitted as the trainer jits it.
    `explicit_attention` runs the explicit softmax, the path of training with attention dropout."""

    def loss_fn(model, batch):
        call = functools.partial(model, output_attentions=True) if explicit_attention else model
        return losses.pretraining_loss(call, batch, None)

    (loss, metrics), grads = jax.jit(nnx.value_and_grad(loss_fn, has_aux=True))(model, batch)
    values = {"loss": float(loss), "mlm_loss": float(metrics["mlm_loss"]), "nsp_loss": float(metrics["nsp_loss"])}
    return values, convert.to_hf(grads, headed=True)


def _errors(ours, reference) -> dict[str, float]:
    """Each loss's error relative to it, and each gradient's largest error relative to its largest
    |entry|; a key bias, whose true gradient is 0 (softmax is invariant to adding q·b_k to every
    score of a row), against its layer's key kernel, whose gradient Σ_t x_t ∂k_t is made of the
    same terms as the bias's Σ_t ∂k_t (x LayerNorm'd, O(1)): measured ≤ 1.5e-7 of it."""
    (our_losses, our_grads), (ref_losses, ref_grads) = ours, reference
    assert our_grads.keys() == ref_grads.keys(), "every parameter, under one name"
    errors = {k: abs(our_losses[k] - ref_losses[k]) / abs(ref_losses[k]) for k in ref_losses}
    return errors | _gradient_errors(our_grads, ref_grads)


def _gradient_errors(our_grads, ref_grads) -> dict[str, float]:
    errors = {}
    for name, ref in ref_grads.items():
        scale_of = name.replace(".key.bias", ".key.weight") if name.endswith(".key.bias") else name
        errors[name] = np.abs(our_grads[name] - ref).max() / np.abs(ref_grads[scale_of]).max()
    return errors


@pytest.mark.parametrize(
    "explicit_attention, one_hot_lookup",
    [(False, False), (True, True)],
    ids=["fused-attention,scatter-add-lookup", "explicit-attention,one-hot-lookup"],
)
def test_pretraining_step_matches_transformers_float64(
    step_model, step_batch, reference, monkeypatch, explicit_attention, one_hot_lookup
):
    if one_hot_lookup:
        monkeypatch.setattr(bert_model, "lookup", _one_hot_lookup)
    errors = _errors(_step(step_model, step_batch, explicit_attention), reference)
    assert len(errors) == 3 + len(nnx.to_flat_state(nnx.state(step_model, nnx.Param)))  # 3 losses, every tensor
    loss_errors = {name: errors.pop(name) for name in ("loss", "mlm_loss", "nsp_loss")}
    worst = max(errors, key=errors.get)
    key_biases = max(v for k, v in errors.items() if k.endswith(".key.bias"))
    # What docs/pretraining.md quotes (`pytest -rP` shows it).
    print(
        f"losses {max(loss_errors.values()):.2g}, gradients {errors[worst]:.2g} ({worst}), key biases {key_biases:.2g}"
    )
    assert max(loss_errors.values()) <= LOSS_BOUND, loss_errors
    assert errors[worst] <= GRAD_BOUND, (worst, errors[worst])


def _mlm_over_all_slots(monkeypatch):
    """The MLM loss averaged over every prediction slot, the padding ones included."""
    sums = losses.pretraining_sums
    monkeypatch.setattr(
        losses,
        "pretraining_sums",
        lambda model, batch, key=None: sums(
            model, {**batch, "masked_weights": jnp.ones_like(batch["masked_weights"])}, key
        ),
    )


def _nsp_from_second_token(monkeypatch):
    """NSP (through the pooler) read from the first token of A instead of [CLS]."""
    monkeypatch.setattr(bert_model.BertPooler, "__call__", lambda self, hidden: jnp.tanh(self.dense(hidden[:, 1])))


def _word_gradient_misrouted(monkeypatch):
    """The one-hot lookup's gradient sent to the previous token's row: the forward pass is exact, so
    only the gradient can show it."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
    def misrouted(table, ids, dtype):
        return bert_model._gather(table, ids, dtype)

    def backward(dtype, residuals, cotangent):
        table, ids = residuals
        return bert_model._one_hot_grad(dtype, (table, jnp.roll(ids, 1, axis=-1)), cotangent)

    misrouted.defvjp(bert_model._gather_fwd, backward)
    monkeypatch.setattr(bert_model, "lookup", misrouted)


@pytest.mark.parametrize(
    "plant, explicit_attention, caught",
    [
        (_mlm_over_all_slots, False, {"mlm_loss", "loss", "cls.predictions.bias"}),
        (_nsp_from_second_token, False, {"nsp_loss", "loss", "bert.pooler.dense.weight"}),
        (_word_gradient_misrouted, True, {"bert.embeddings.word_embeddings.weight"}),
    ],
    ids=["mlm-mean-over-padding-slots", "nsp-from-wrong-token", "word-embedding-gradient-misrouted"],
)
def test_planted_defects_fail_the_parity(
    step_model, step_batch, reference, monkeypatch, plant, explicit_attention, caught
):
    plant(monkeypatch)
    errors = _errors(_step(step_model, step_batch, explicit_attention), reference)
    bounds = {name: LOSS_BOUND if name.endswith("loss") else GRAD_BOUND for name in errors}
    failing = {name for name in errors if errors[name] > bounds[name]}
    assert caught <= failing, {name: errors[name] for name in caught}
    assert min(errors[name] for name in caught) > 100 * GRAD_BOUND
    if plant is _word_gradient_misrouted:
        assert failing == caught, "a gradient-only defect: the losses and the other gradients still agree"


def test_mlm_only_step_matches_transformers_masked_lm(step_model, step_batch, tmp_path):
    """The MLM-only recipe (`data.pair_task: none`): the loss is the MLM term alone, so its gradients
    equal `transformers.BertForMaskedLM`'s in float64, and the pair head and the pooler, which feed
    nothing else, get exactly zero."""
    directory = bertjax.save_pretrained(step_model, tmp_path / "mlm")
    theirs = transformers.BertForMaskedLM.from_pretrained(str(directory), attn_implementation="eager").eval().double()
    labels = np.full(step_batch["input_ids"].shape, -100, np.int64)
    rows, slots = np.nonzero(step_batch["masked_weights"])
    labels[rows, step_batch["masked_positions"][rows, slots]] = step_batch["masked_ids"][rows, slots]
    out = theirs(
        **{k: torch.tensor(step_batch[k], dtype=torch.long) for k in ("input_ids", "attention_mask", "token_type_ids")},
        labels=torch.tensor(labels),
    )
    out.loss.backward()
    ref_grads = {name: p.grad.numpy() for name, p in theirs.named_parameters()}

    def loss_fn(model, batch):
        return losses.pretraining_loss(model, batch, None, pair_task="none")

    (loss, metrics), grads = jax.jit(nnx.value_and_grad(loss_fn, has_aux=True))(step_model, step_batch)
    ours = convert.to_hf(grads, headed=True)
    assert abs(float(loss) - out.loss.item()) <= LOSS_BOUND * out.loss.item()
    assert float(loss) == float(metrics["mlm_loss"])
    assert set(metrics) == {"mlm_loss", "mlm_accuracy"}, "an untrained pair head's numbers are not reported"
    unused = {name for name in ours if name.startswith(("cls.seq_relationship.", "bert.pooler."))}
    assert unused and all(not np.any(ours[name]) for name in unused)
    assert ours.keys() - unused == ref_grads.keys()
    errors = _gradient_errors(ours, ref_grads)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRAD_BOUND, (worst, errors[worst])


def test_the_pair_metrics_carry_the_pair_tasks_name(step_model, step_batch):
    """SOP trains the same head on its own labels: the same cross-entropy as NSP's on the batch's
    labels, reported as `sop_*` so a run's curves say which task they measure."""
    _, nsp = losses.pretraining_loss(step_model, step_batch, None, pair_task="nsp")
    loss, sop = losses.pretraining_loss(step_model, step_batch, None, pair_task="sop")
    assert set(sop) == {"mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"}
    assert float(sop["sop_loss"]) == float(nsp["nsp_loss"]) and float(sop["sop_accuracy"]) == float(nsp["nsp_accuracy"])
    assert float(loss) == float(sop["mlm_loss"] + sop["sop_loss"])
