"""Loss functions for the trainer: `(model, batch, dropout_key, step=…) -> (loss, metrics)`; `step`, the
updates made before this one (traced), is read only by a loss that changes over the run
(`train.interventions`' step windows)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from train.interventions import Interventions


def pretraining_terms(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None = None):
    """One forward pass's terms, per masked position ([B, P]: `mlm_loss`, `mlm_hits`, `masked`,
    padding predictions weighing 0) and per sequence ([B]: `pair_loss`, `pair_hits` of the pair
    task, NSP or SOP), which `batch_sums` and `sequence_sums` reduce."""
    return output_terms(pretraining_forward(model, batch, key), batch)


def pretraining_forward(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None, **capture):
    """The pre-training model's forward pass on `batch`; `capture`: what it also returns
    (`output_attentions=True`)."""
    return model(
        batch["input_ids"],
        batch["attention_mask"],
        batch["token_type_ids"],
        masked_positions=batch["masked_positions"],
        dropout_rng=key,
        **capture,
    )


def output_terms(out, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """`pretraining_terms` of a forward pass's output."""
    weights = batch["masked_weights"]
    mlm = optax.softmax_cross_entropy_with_integer_labels(out.prediction_logits, batch["masked_ids"])
    pair_logits = out.seq_relationship_logits
    return {
        "mlm_loss": mlm * weights,
        "mlm_hits": (out.prediction_logits.argmax(-1) == batch["masked_ids"]) * weights,
        "masked": weights,
        "pair_loss": optax.softmax_cross_entropy_with_integer_labels(pair_logits, batch["nsp_labels"]),
        "pair_hits": (pair_logits.argmax(-1) == batch["nsp_labels"]).astype(jnp.float32),
    }


def batch_sums(terms: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Sums over one batch (not means), with the counts they divide by: batches of unequal masked
    counts then add up right (held-out evaluation)."""
    sums = {name: value.sum() for name, value in terms.items()}
    sums["sequences"] = jnp.asarray(terms["pair_loss"].shape[0], jnp.float32)
    return sums


def sequence_sums(terms: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Each sequence's sums [B]: the held-out set's sequences, resampled by the analyses."""
    return {name: value.sum(-1) if value.ndim == 2 else value for name, value in terms.items()}


def pretraining_sums(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None = None):
    """Sums over one batch of the MLM cross-entropy and hits at the masked positions and of the
    pair task's cross-entropy and hits, with their counts (`batch_sums`)."""
    return batch_sums(pretraining_terms(model, batch, key))


def pretraining_loss(
    model: nnx.Module,
    batch: dict[str, jax.Array],
    key: jax.Array | None,
    step: jax.Array | None = None,
    *,
    pair_task: str = "nsp",
    interventions: Interventions | None = None,
):
    """MLM cross-entropy at the masked positions (weighted; padding predictions weigh 0), plus the
    pair task's, reported under its name (`nsp_loss`, `sop_loss`). MLM only (`pair_task` "none")
    reports no pair metrics: its labels are not a task the model is trained on, so the untrained
    head's accuracy on them would be noise under a meaningful name. `interventions` add their
    penalties at `step`, from the same forward pass's attention (`train.interventions`)."""
    if interventions is None:
        sums = pretraining_sums(model, batch, key)
    else:
        out = pretraining_forward(model, batch, key, output_attentions=True)
        sums = batch_sums(output_terms(out, batch))
    total = jnp.maximum(sums["masked"], 1.0)
    metrics = {"mlm_loss": sums["mlm_loss"] / total, "mlm_accuracy": sums["mlm_hits"] / total}
    if pair_task == "none":
        loss = metrics["mlm_loss"]
    else:
        metrics[f"{pair_task}_loss"] = sums["pair_loss"] / sums["sequences"]
        metrics[f"{pair_task}_accuracy"] = sums["pair_hits"] / sums["sequences"]
        loss = metrics["mlm_loss"] + metrics[f"{pair_task}_loss"]
    if interventions is None:
        return loss, metrics
    assert step is not None  # the trainer passes the step to every loss
    penalty, steered = interventions(out.attentions, batch, step)
    return loss + penalty, metrics | steered


def classification_loss(
    model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array | None, step: jax.Array | None = None
):
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], dropout_rng=key)
    loss = optax.softmax_cross_entropy_with_integer_labels(out.logits, batch["labels"]).mean()
    return loss, {"accuracy": (out.logits.argmax(-1) == batch["labels"]).mean()}
