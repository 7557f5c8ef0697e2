"""Evaluation of a classifier on a labelled split under head masks, compiled once for every mask.

Kovaleva et al.'s disabling and Michel et al.'s masking, importance and pruning all evaluate the
same checkpoint on the same examples under many head masks. Here the masks are *inputs* of one
jitted function (never closed-over constants), so N ablations cost N forward passes of the split and
no recompiles: a compile happens once per padded batch shape, and the shapes depend on the data only.

Two masks, both [L, H], as the model defines them:
- `head_mask` (float) multiplies each head's attention probabilities (Michel's ξ; 0 prunes a head);
- `disable` (bool) replaces a head's attention with the uniform distribution over the real tokens
  (Kovaleva's disabling).

An ablation is compared with the unablated model on the same examples by the exact McNemar test of
their per-example correctness (`mcnemar`), Holm-adjusted over the ablations of one table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from flax import nnx
from scipy import stats

from analysis.common.finite import check_finite, check_finite_output
from analysis.common.forward import Devices, compiled
from bertjax import glue, sharding
from bertjax.errors import UserError
from bertjax.model import Model
from bertjax.pretrained import Checkpoint, trained_task
from sieves.align import bucketed
from sieves.stats import adjust_pvalues

# One point of a metric in [0, 1].
ONE_POINT = 0.01


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """A labelled split as padded batches sorted by length, with its metrics' names.

    Every batch has `batch_size` rows; `valid` marks the real ones (the last batch is topped up with
    dummy rows so that all batches of one length share one compiled shape).
    """

    batches: tuple[dict[str, np.ndarray], ...]  # input_ids, attention_mask, token_type_ids, labels, valid
    metric_names: tuple[str, ...]
    size: int

    @property
    def labels(self) -> np.ndarray:
        return np.concatenate([b["labels"][b["valid"]] for b in self.batches])

    @property
    def shapes(self) -> set[tuple[int, int]]:
        return {b["input_ids"].shape for b in self.batches}


def make_eval_set(arrays: dict[str, np.ndarray], batch_size: int, metric_names: Sequence[str]) -> EvalSet:
    """Batches from `glue.encode`'s arrays: sorted by length and cut to a multiple of the length
    bucket, so short batches cost little and few shapes are compiled."""
    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")
    lengths = arrays["attention_mask"].sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    batches = []
    for begin in range(0, len(order), batch_size):
        rows = order[begin : begin + batch_size]
        width = min(bucketed(int(lengths[rows].max())), arrays["input_ids"].shape[1])
        batch = {k: np.zeros((batch_size, width), np.int32) for k in glue.FEATURES}
        for k in glue.FEATURES:
            batch[k][: len(rows)] = arrays[k][rows, :width]
        # A dummy row softmaxes over one real token instead of none; its output is never used.
        batch["attention_mask"][len(rows) :, 0] = 1
        batch["labels"] = np.zeros(batch_size, np.int32)
        batch["labels"][: len(rows)] = arrays["labels"][rows]
        batch["valid"] = np.arange(batch_size) < len(rows)
        batches.append(batch)
    return EvalSet(tuple(batches), tuple(metric_names), len(order))


def load_eval_set(
    tokenizer, task: str, split: str, glue_dir: Path | None, n: int | None, max_length: int, batch_size: int
) -> tuple[EvalSet, list[Path]]:
    """The first `n` (None: all) examples of a GLUE split, encoded; plus the files read."""
    examples = glue.load_glue(task, split, glue_dir, n)
    arrays = glue.encode(examples, tokenizer, max_length, f"{task} {split}")
    files = glue.glue_files(task, split, glue_dir) if glue_dir else []
    return make_eval_set(arrays, batch_size, glue.TASKS[task].metrics), files


def check_classifier(model: Model, name: str, source: Checkpoint, tasks: Sequence[str]) -> None:
    """A classifier trained for another label set, or on another task, still returns logits, so
    its metrics would be silently wrong: refuse it before any work. The task is checked where the
    checkpoint (`source`, opened from the text `name`) records it (`bertjax.pretrained.trained_task`)."""
    have = model.config.num_labels
    trained = trained_task(source)
    for task in tasks:
        want = glue.task_spec(task).num_labels
        if have != want:
            raise UserError(
                f"{name}: the checkpoint's classifier has num_labels={have}, but task {task} has {want} labels: "
                f"give a checkpoint fine-tuned on {task} (--ckpt)"
            )
        if trained is not None and trained != task:
            raise UserError(
                f"{name}: the checkpoint's classifier was fine-tuned on {trained}, not {task}: "
                f"give --task {trained}, or a checkpoint fine-tuned on {task} (--ckpt)"
            )


def full_mask(n_layers: int, n_heads: int) -> np.ndarray:
    return np.ones((n_layers, n_heads), np.float32)


def no_disable(n_layers: int, n_heads: int) -> np.ndarray:
    return np.zeros((n_layers, n_heads), bool)


@dataclasses.dataclass(frozen=True)
class Scored:
    """One pass over an eval set: its metrics and which examples were classified correctly."""

    metrics: dict[str, float]
    correct: np.ndarray  # [N] bool, in the eval set's (length-sorted) order


class MaskedEvaluator:
    """A classifier's metrics and mask gradients on one eval set, with the masks as jitted inputs.

    `forward_passes` and `gradient_passes` count the passes over the whole eval set so far. With
    `devices`, the model is replicated on each and every batch, put there once, split along its
    rows (topped up with invalid rows to a multiple of the devices). Logits or gradients that are
    not finite stop the run (`finite.check_finite`), unless `allow_nonfinite` (its `allowed`)."""

    def __init__(self, model: Model, eval_set: EvalSet, devices: Devices | None = None, allow_nonfinite: bool = False):
        config = model.config
        self.allow_nonfinite = allow_nonfinite
        self.n_layers, self.n_heads = config.num_hidden_layers, config.num_attention_heads
        self.eval_set = eval_set
        self.forward_passes = self.gradient_passes = self.compiles = 0
        # Shared by every evaluator of this architecture in the process: an importance set, a
        # second run in a notebook reuse the executables of the shapes already compiled.
        (self.logits_fn, self.gradients_fn), (state,) = compiled(_jit_evaluation, model)
        if devices is None:
            self._state, self._batches = state, eval_set.batches
        else:
            self._state = sharding.replicate(state, devices.mesh)
            self._batches = tuple(sharding.shard_batch(_topped_up(b, devices.rows(len(b["valid"]))), devices.mesh)
                                  for b in eval_set.batches)  # fmt: skip
        self._valid = tuple(np.asarray(b["valid"]) for b in self._batches)

    def _masks(self, head_mask, disable) -> tuple[jax.Array, jax.Array]:
        shape = (self.n_layers, self.n_heads)
        head_mask = full_mask(*shape) if head_mask is None else np.asarray(head_mask, np.float32)
        disable = no_disable(*shape) if disable is None else np.asarray(disable, bool)
        if head_mask.shape != shape or disable.shape != shape:
            raise ValueError(f"masks must have shape {shape}, got {head_mask.shape} and {disable.shape}")
        return jnp.asarray(head_mask), jnp.asarray(disable)

    def logits(self, head_mask=None, disable=None) -> np.ndarray:
        """[N, C] logits in the eval set's (length-sorted) order."""
        head_mask, disable = self._masks(head_mask, disable)
        self.forward_passes += 1
        outputs = [self._counted(self.logits_fn, batch, head_mask, disable) for batch in self._batches]
        logits = np.concatenate([np.asarray(o)[valid] for o, valid in zip(outputs, self._valid, strict=True)])
        check_finite_output(logits, "the classifier's logits", "evaluation", self.allow_nonfinite)
        return logits

    def score(self, head_mask=None, disable=None) -> Scored:
        """The task's metrics (accuracy, and F1 for MRPC/QQP), the mean cross-entropy, and the
        per-example correctness the paired tests need, from one pass."""
        logits = self.logits(head_mask, disable)
        labels = self.eval_set.labels
        metrics = glue.classification_metrics(logits, labels, self.eval_set.metric_names)
        return Scored(metrics, logits.argmax(-1) == labels)

    def metrics(self, head_mask=None, disable=None) -> dict[str, float]:
        return self.score(head_mask, disable).metrics

    def mask_gradients(self, head_mask=None, disable=None) -> np.ndarray:
        """E_x |∂L(x)/∂ξ| [L, H] at `head_mask`, L the cross-entropy with the gold label."""
        head_mask, disable = self._masks(head_mask, disable)
        self.gradient_passes += 1
        total = sum(self._counted(self.gradients_fn, batch, head_mask, disable) for batch in self._batches)
        gradients = np.asarray(total, np.float64) / self.eval_set.size
        check_finite(gradients, "the head-mask gradient", "head importance", allowed=self.allow_nonfinite)
        return gradients

    def _counted(self, fn, *arrays):
        cached = fn._cache_size()
        out = fn(self._state, *arrays)
        self.compiles += fn._cache_size() - cached
        return out

    def compiled_shapes(self) -> int:
        """How many executables this evaluator's passes compiled: one per batch shape when masks are
        inputs, fewer where an earlier evaluator of the architecture compiled a shape."""
        return self.compiles


def _jit_evaluation(graphdef):
    """(logits, mask gradients), jitted, of the classifier under the masks."""

    def logits(state, batch, head_mask, disable):
        out = nnx.merge(graphdef, state)(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
            head_mask=head_mask, disable_heads=disable,
        )  # fmt: skip
        return out.logits

    def example_loss(head_mask, state, disable, input_ids, attention_mask, token_type_ids, label):
        one = {"input_ids": input_ids[None], "attention_mask": attention_mask[None],
               "token_type_ids": token_type_ids[None]}  # fmt: skip
        one_logits = logits(state, one, head_mask, disable)
        return optax.softmax_cross_entropy_with_integer_labels(one_logits, label[None])[0]

    def mask_gradients(state, batch, head_mask, disable):
        # Michel's I_h averages |∂L(x)/∂ξ_h| over examples, so each example needs its own
        # gradient: one vmapped batch-of-one backward pass instead of B separate ones.
        per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, None, None, 0, 0, 0, 0))(
            head_mask, state, disable,
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"],
        )  # fmt: skip
        return jnp.where(batch["valid"][:, None, None], jnp.abs(per_example), 0.0).sum(axis=0)

    return jax.jit(logits), jax.jit(mask_gradients)


def _topped_up(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """`batch` with invalid dummy rows (as `make_eval_set` adds) up to `rows`."""
    missing = rows - len(batch["valid"])
    if not missing:
        return batch
    topped = {k: np.concatenate([v, np.zeros((missing, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}
    topped["attention_mask"][-missing:, 0] = 1
    return topped


def mcnemar(baseline: np.ndarray, ablated: np.ndarray) -> tuple[int, int, float]:
    """Exact McNemar test of two classifiers' correctness [N] on the same examples.

    Returns b (correct unablated, wrong ablated), c (the reverse) and the two-sided p of the
    binomial test of b among the b + c discordant pairs with p = 1/2; p = 1 with no discordant pair.
    """
    baseline, ablated = np.asarray(baseline, bool), np.asarray(ablated, bool)
    b, c = int(np.sum(baseline & ~ablated)), int(np.sum(~baseline & ablated))
    p = stats.binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
    return b, c, float(p)


# Named for accuracy: the test is of per-example accuracy even where the task's headline metric is F1.
PAIRED_TEST_COLUMNS = ("correct_to_wrong", "wrong_to_correct", "mcnemar_p_accuracy")


def compare(scored: Scored, baseline: Scored) -> dict[str, float]:
    """Every metric and its change from the baseline (`<metric>_change`), and the McNemar test of
    the per-example accuracy against the baseline's."""
    changes = {f"{k}_change": v - baseline.metrics[k] for k, v in scored.metrics.items()}
    test = mcnemar(baseline.correct, scored.correct)
    return {**scored.metrics, **changes, **dict(zip(PAIRED_TEST_COLUMNS, test, strict=True))}


def add_holm(table: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """The table's McNemar p-values Holm-adjusted as one family (its rows), and which are < α."""
    adjusted = adjust_pvalues(table["mcnemar_p_accuracy"].to_numpy(), "holm")
    return table.assign(mcnemar_p_accuracy_holm=adjusted, significant_holm=adjusted < alpha)


def change_counts(table: pd.DataFrame) -> dict[str, int]:
    """How many ablations raise accuracy, lower it by at least one point, and of each how many
    are significant after Holm's adjustment."""
    up = table["accuracy_change"] > 0
    # A slack absorbs float noise in a change that is a ratio of counts.
    down = table["accuracy_change"] <= -ONE_POINT + 1e-12
    significant = table["significant_holm"]
    return {
        "raise_accuracy": int(up.sum()),
        "raise_accuracy_significant": int((up & significant).sum()),
        "lower_accuracy_by_one_point": int(down.sum()),
        "lower_accuracy_by_one_point_significant": int((down & significant).sum()),
        "significant": int(significant.sum()),
    }
