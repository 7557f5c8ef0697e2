"""Dev-set evaluation of a classifier under head masks, compiled once for every mask.

Kovaleva et al.'s disabling and Michel et al.'s importance and pruning all evaluate the same
checkpoint on the same dev set under many head masks. Here the masks are *inputs* of one jitted
function (never closed-over constants), so N ablations cost N forward passes of the dev set and no
recompiles: a compile happens once per padded batch shape, and the shapes depend on the data only.

Two masks, both [L, H], as the model defines them:
- `head_mask` (float) multiplies each head's attention probabilities (Michel's ξ; 0 prunes a head);
- `disable` (bool) replaces a head's attention with the uniform distribution over the real tokens
  (Kovaleva's disabling).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from matplotlib import colormaps
from matplotlib.colors import CenteredNorm
from matplotlib.figure import Figure

from analysis.plots import save_figure
from analysis.roles import bucketed
from bertjax import glue
from bertjax.errors import UserError


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


def full_mask(n_layers: int, n_heads: int) -> np.ndarray:
    return np.ones((n_layers, n_heads), np.float32)


def no_disable(n_layers: int, n_heads: int) -> np.ndarray:
    return np.zeros((n_layers, n_heads), bool)


class MaskedEvaluator:
    """A classifier's dev metrics and mask gradients, with the masks as jitted inputs."""

    def __init__(self, model: nnx.Module, eval_set: EvalSet):
        config = model.config
        self.n_layers, self.n_heads = config.num_hidden_layers, config.num_attention_heads
        self.eval_set = eval_set
        graphdef, self._state = nnx.split(model)

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

        self.logits_fn = jax.jit(logits)
        self.gradients_fn = jax.jit(mask_gradients)

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
        outputs = [self.logits_fn(self._state, batch, head_mask, disable) for batch in self.eval_set.batches]
        return np.concatenate([np.asarray(o)[b["valid"]] for o, b in zip(outputs, self.eval_set.batches, strict=True)])

    def metrics(self, head_mask=None, disable=None) -> dict[str, float]:
        """The task's metrics (accuracy, and F1 for MRPC/QQP) and the mean cross-entropy."""
        logits = self.logits(head_mask, disable)
        return glue.classification_metrics(logits, self.eval_set.labels, self.eval_set.metric_names)

    def mask_gradients(self, head_mask=None, disable=None) -> np.ndarray:
        """E_x |∂L(x)/∂ξ| [L, H] at `head_mask`, L the cross-entropy with the gold label."""
        head_mask, disable = self._masks(head_mask, disable)
        total = sum(self.gradients_fn(self._state, batch, head_mask, disable) for batch in self.eval_set.batches)
        return np.asarray(total, np.float64) / self.eval_set.size

    def compiled_shapes(self) -> int:
        """How many executables the evaluation functions hold (one per batch shape when masks are inputs)."""
        return self.logits_fn._cache_size() + self.gradients_fn._cache_size()


def head_heatmap(
    values: np.ndarray,
    title: str,
    label: str,
    out_dir: Path,
    stem: str,
    diverging: bool = False,
    annotate: bool = True,
    columns: str | None = "head",
) -> list[Path]:
    """One L × H heatmap (layer rows, head columns), optionally centred on 0 with a diverging map.

    `columns=None` is for a single column of per-layer values: no column axis is drawn."""
    values = np.asarray(values, float)
    n_layers, n_heads = values.shape
    fig = Figure(figsize=(1.6 + 0.55 * n_heads, 1.2 + 0.45 * n_layers), layout="constrained")
    ax = fig.add_subplot()
    finite = values[np.isfinite(values)]
    if diverging:
        norm = CenteredNorm(0.0, max(np.abs(finite).max(initial=0.0), 1e-9))
        mesh = ax.imshow(values, cmap=colormaps["RdBu"], norm=norm)
    else:
        mesh = ax.imshow(values, cmap=colormaps["viridis"])
    if annotate:
        # Changes of a few tenths of a point would all read 0.00 with two decimals.
        digits = 3 if finite.size and np.abs(finite).max() < 0.1 else 2
        for (layer, head), value in np.ndenumerate(values):
            # Dark text on light cells, light text on dark ones.
            shade = mesh.norm(value)
            light = abs(shade - 0.5) < 0.3 if diverging else shade > 0.6
            ax.text(head, layer, f"{value:.{digits}f}", ha="center", va="center", fontsize=6,
                    color="black" if light else "white")  # fmt: skip
    ax.set_xticks(range(n_heads) if columns else [])
    ax.set_yticks(range(n_layers))
    ax.set_xlabel(columns or "")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(mesh, ax=ax, label=label, shrink=0.9)
    return save_figure(fig, out_dir, stem)
