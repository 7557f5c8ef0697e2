"""Gradient-based importance of attention (Clark et al. 2019, §3.2, Fig. 3).

On inputs masked like BERT's pre-training (15% of the non-special tokens chosen; of those 80%
become [MASK], 10% a random token, 10% stay), the MLM loss of a sequence is the mean cross-entropy
over its chosen tokens, and the batch loss is the sum over sequences, so each sequence's gradient
is its own. g = ∂loss/∂α is taken through the model's additive `attention_offsets` at zero. Per
layer we report the mean |g| over heads, real query rows and the real keys of each kind: [CLS],
[SEP], punctuation ("." and ","), and every other token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from analysis.attention.surface import key_flag_batches
from analysis.common.finite import check_finite
from analysis.common.forward import compiled
from bertjax.errors import UserError
from bertjax.model import Model
from bertjax.pretrained import SAFETENSORS, SAFETENSORS_INDEX, Checkpoint
from sieves.align import EncodedSequence

KEY_KINDS = ("cls", "sep", "punct", "other")
MASK_RATE = 0.15
# The MLM transform is what an encoder-only export (sentence-transformers) lacks; RoBERTa's is
# lm_head.dense (bertjax reads it as BERT's, `bertjax.convert.ROBERTA_RULES`).
MLM_TENSOR = "cls.predictions.transform.dense.weight"
MLM_TENSORS = (MLM_TENSOR, "lm_head.dense.weight")


def has_mlm_head(source: Checkpoint) -> bool:
    """Whether the checkpoint holds trained MLM-head weights (not only the encoder)."""
    if source.meta is not None:  # an orbax step's (a HF checkpoint has none)
        return any(key.startswith("cls/predictions/") for key in source.meta["param_shapes"])
    if (source.path / SAFETENSORS).is_file():
        from safetensors import safe_open

        with safe_open(source.path / SAFETENSORS, "np") as f:
            return any(name in f.keys() for name in MLM_TENSORS)  # noqa: SIM118 (safe_open is not a Mapping)
    if (source.path / SAFETENSORS_INDEX).is_file():
        weight_map = json.loads((source.path / SAFETENSORS_INDEX).read_text())["weight_map"]
        return any(name in weight_map for name in MLM_TENSORS)
    return False


def mask_batch(
    input_ids: np.ndarray, maskable: np.ndarray, rng: np.random.Generator, mask_id: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """BERT masking of [B, T] ids → (masked ids, positions [B, P], labels [B, P], weights [B, P]).

    Each sequence with maskable tokens gets max(1, round(15% of them)) predictions.
    """
    batch, length = input_ids.shape
    slots = max(1, round(MASK_RATE * length) + 1)
    masked = input_ids.copy()
    positions = np.zeros((batch, slots), np.int32)
    labels = np.zeros((batch, slots), np.int32)
    weights = np.zeros((batch, slots), np.float32)
    for b in range(batch):
        candidates = np.flatnonzero(maskable[b])
        if not candidates.size:
            continue
        count = min(slots, max(1, round(MASK_RATE * candidates.size)))
        chosen = np.sort(rng.choice(candidates, size=count, replace=False))
        positions[b, :count] = chosen
        labels[b, :count] = input_ids[b, chosen]
        weights[b, :count] = 1.0
        action = rng.random(count)
        masked[b, chosen[action < 0.8]] = mask_id
        randomised = chosen[(action >= 0.8) & (action < 0.9)]
        masked[b, randomised] = rng.integers(0, vocab_size, size=randomised.size)
    return masked, positions, labels, weights


def mlm_loss(model: Model, offsets, input_ids, attention_mask, token_type_ids, positions, labels, weights):
    """Σ over sequences of the mean cross-entropy at that sequence's masked positions."""
    out = model(input_ids, attention_mask, token_type_ids, masked_positions=positions, attention_offsets=offsets)
    losses = optax.softmax_cross_entropy_with_integer_labels(out.prediction_logits, labels)
    per_sequence = jnp.sum(losses * weights, axis=-1) / jnp.maximum(weights.sum(axis=-1), 1.0)
    return jnp.sum(per_sequence)


def make_gradient_fn(model: Model):
    """Jitted: (inputs, key kinds [K, B, T], real rows [B, T]) → (Σ|g| [L, K], counts [K], the
    sum of |g| of each head over those cells [L, H])."""
    run, (state,) = compiled(_jit_gradients, model)
    return lambda *arrays: run(state, *arrays)


def _jit_gradients(graphdef):
    @jax.jit
    def run(state, input_ids, attention_mask, token_type_ids, positions, labels, weights, kinds, real):
        model = nnx.merge(graphdef, state)
        layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
        batch, length = input_ids.shape
        zeros = jnp.zeros((layers, batch, heads, length, length), jnp.float32)
        loss = lambda offsets: mlm_loss(
            model, offsets, input_ids, attention_mask, token_type_ids, positions, labels, weights
        )
        grad = jnp.abs(jax.grad(loss)(zeros))
        cells = real[None, :, :, None] * kinds[:, :, None, :]  # [K, B, T(query), T(key)]
        sums = jnp.einsum("lbhts,kbts->lk", grad, cells) / heads
        # Per head (the sums are per layer), so that a gradient that is not finite names its head; a
        # sum, as a NaN passes through it (XLA's max on the CPU returned −inf for all-NaN rows).
        per_head = jnp.sum(jnp.where(cells.any(axis=0)[None, :, None], grad, 0.0), axis=(1, 3, 4))
        return sums, cells.sum(axis=(1, 2, 3)), per_head

    return run


def gradient_importance(
    model: Model,
    seqs: Sequence[EncodedSequence],
    punct_ids: Sequence[int],
    mask_id: int,
    batch_size: int,
    max_length: int,
    seed: int = 0,
    allowed: bool = False,
) -> np.ndarray:
    """Mean |∂loss/∂α| per layer and key kind, [L, len(KEY_KINDS)], streamed by batch. A gradient
    that is not finite stops the run naming its head (`finite.check_finite`, `allowed` its)."""
    run = make_gradient_fn(model)
    rng = np.random.default_rng(seed)
    # 0-d starts, broadcast to the first batch's shape.
    sums, counts = np.zeros(()), np.zeros(())
    for arrays in key_flag_batches(seqs, batch_size, max_length, punct_ids, "attention gradients"):
        special = arrays["is_cls"] + arrays["is_sep"]
        other = arrays["attention_mask"] * (1.0 - special - arrays["is_punct"])
        kinds = np.stack([arrays["is_cls"], arrays["is_sep"], arrays["is_punct"], other])
        maskable = (arrays["real"] > 0) & (special == 0)
        masked, positions, labels, weights = mask_batch(
            arrays["input_ids"], maskable, rng, mask_id, model.config.vocab_size
        )
        batch_sums, batch_counts, per_head = run(
            masked, arrays["attention_mask"], arrays["token_type_ids"], positions, labels, weights, kinds,
            arrays["real"].astype(np.float32),
        )  # fmt: skip
        check_finite(np.asarray(per_head), "the sum of |∂ MLM loss / ∂ attention|", "attention gradients",
                     allowed=allowed)  # fmt: skip
        sums = sums + np.asarray(batch_sums, np.float64)
        counts = counts + np.asarray(batch_counts, np.float64)
    return sums / np.maximum(counts, 1.0)[None, :]


def require_mlm_head(source: Checkpoint) -> None:
    if not has_mlm_head(source):
        raise UserError(
            f"{source.path}: the checkpoint has no trained MLM head ({MLM_TENSOR} is missing), so the "
            "MLM-loss gradients would come from a random head; run --analyses without 'gradients'"
        )
