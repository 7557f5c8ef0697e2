"""Loss functions for the trainer: `(model, batch, dropout_key) -> (loss, metrics)`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def pretraining_sums(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None = None):
    """Sums over one batch (not means) of the MLM cross-entropy and hits at the masked positions
    (padding predictions weigh 0) and of the pair task's (NSP or SOP) cross-entropy and hits, with
    the counts they divide by: batches of unequal masked counts then add up right (held-out
    evaluation)."""
    out = model(
        batch["input_ids"],
        batch["attention_mask"],
        batch["token_type_ids"],
        masked_positions=batch["masked_positions"],
        dropout_rng=key,
    )
    weights = batch["masked_weights"]
    mlm = optax.softmax_cross_entropy_with_integer_labels(out.prediction_logits, batch["masked_ids"])
    pair_logits = out.seq_relationship_logits
    pair = optax.softmax_cross_entropy_with_integer_labels(pair_logits, batch["nsp_labels"])
    return {
        "mlm_loss": (mlm * weights).sum(),
        "mlm_hits": ((out.prediction_logits.argmax(-1) == batch["masked_ids"]) * weights).sum(),
        "masked": weights.sum(),
        "pair_loss": pair.sum(),
        "pair_hits": (pair_logits.argmax(-1) == batch["nsp_labels"]).sum().astype(jnp.float32),
        "sequences": jnp.asarray(pair.shape[0], jnp.float32),
    }


def pretraining_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None, pair_task: str = "nsp"):
    """MLM cross-entropy at the masked positions (weighted; padding predictions weigh 0), plus the
    pair task's, reported under its name (`nsp_loss`, `sop_loss`). MLM only (`pair_task` "none")
    reports no pair metrics: its labels are not a task the model is trained on, so the untrained
    head's accuracy on them would be noise under a meaningful name."""
    sums = pretraining_sums(model, batch, key)
    total = jnp.maximum(sums["masked"], 1.0)
    metrics = {"mlm_loss": sums["mlm_loss"] / total, "mlm_accuracy": sums["mlm_hits"] / total}
    if pair_task == "none":
        return metrics["mlm_loss"], metrics
    metrics[f"{pair_task}_loss"] = sums["pair_loss"] / sums["sequences"]
    metrics[f"{pair_task}_accuracy"] = sums["pair_hits"] / sums["sequences"]
    return metrics["mlm_loss"] + metrics[f"{pair_task}_loss"], metrics


def classification_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None):
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], dropout_rng=key)
    loss = optax.softmax_cross_entropy_with_integer_labels(out.logits, batch["labels"]).mean()
    return loss, {"accuracy": (out.logits.argmax(-1) == batch["labels"]).mean()}
