"""Loss functions for the trainer: `(model, batch, dropout_key) -> (loss, metrics)`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def pretraining_sums(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None = None):
    """Sums over one batch (not means) of the MLM cross-entropy and hits at the masked positions
    (padding predictions weigh 0) and of the NSP cross-entropy and hits, with the counts they
    divide by: batches of unequal masked counts then add up right (held-out evaluation)."""
    out = model(
        batch["input_ids"],
        batch["attention_mask"],
        batch["token_type_ids"],
        masked_positions=batch["masked_positions"],
        dropout_rng=key,
    )
    weights = batch["masked_weights"]
    mlm = optax.softmax_cross_entropy_with_integer_labels(out.prediction_logits, batch["masked_ids"])
    nsp_logits = out.seq_relationship_logits
    nsp = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, batch["nsp_labels"])
    return {
        "mlm_loss": (mlm * weights).sum(),
        "mlm_hits": ((out.prediction_logits.argmax(-1) == batch["masked_ids"]) * weights).sum(),
        "masked": weights.sum(),
        "nsp_loss": nsp.sum(),
        "nsp_hits": (nsp_logits.argmax(-1) == batch["nsp_labels"]).sum().astype(jnp.float32),
        "sequences": jnp.asarray(nsp.shape[0], jnp.float32),
    }


def pretraining_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None, pair_loss: bool = True):
    """MLM cross-entropy at the masked positions (weighted; padding predictions weigh 0), plus the
    pair task's (NSP or SOP) unless `pair_loss` is off (MLM only: its metrics are still reported)."""
    sums = pretraining_sums(model, batch, key)
    total = jnp.maximum(sums["masked"], 1.0)
    metrics = {
        "mlm_loss": sums["mlm_loss"] / total,
        "nsp_loss": sums["nsp_loss"] / sums["sequences"],
        "mlm_accuracy": sums["mlm_hits"] / total,
        "nsp_accuracy": sums["nsp_hits"] / sums["sequences"],
    }
    loss = metrics["mlm_loss"] + metrics["nsp_loss"] if pair_loss else metrics["mlm_loss"]
    return loss, metrics


def classification_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None):
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], dropout_rng=key)
    loss = optax.softmax_cross_entropy_with_integer_labels(out.logits, batch["labels"]).mean()
    return loss, {"accuracy": (out.logits.argmax(-1) == batch["labels"]).mean()}
