"""Loss functions for the trainer: `(model, batch, dropout_key) -> (loss, metrics)`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def pretraining_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None):
    """MLM cross-entropy at the masked positions (weighted; padding predictions weigh 0) + NSP."""
    out = model(
        batch["input_ids"],
        batch["attention_mask"],
        batch["token_type_ids"],
        masked_positions=batch["masked_positions"],
        dropout_rng=key,
    )
    weights = batch["masked_weights"]
    total = jnp.maximum(weights.sum(), 1.0)
    mlm = optax.softmax_cross_entropy_with_integer_labels(out.prediction_logits, batch["masked_ids"])
    mlm_loss = (mlm * weights).sum() / total
    mlm_hits = (out.prediction_logits.argmax(-1) == batch["masked_ids"]) * weights
    nsp_logits = out.seq_relationship_logits
    nsp_loss = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, batch["nsp_labels"]).mean()
    metrics = {
        "mlm_loss": mlm_loss,
        "nsp_loss": nsp_loss,
        "mlm_accuracy": mlm_hits.sum() / total,
        "nsp_accuracy": (nsp_logits.argmax(-1) == batch["nsp_labels"]).mean(),
    }
    return mlm_loss + nsp_loss, metrics


def classification_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None):
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], dropout_rng=key)
    loss = optax.softmax_cross_entropy_with_integer_labels(out.logits, batch["labels"]).mean()
    return loss, {"accuracy": (out.logits.argmax(-1) == batch["labels"]).mean()}
