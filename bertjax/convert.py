"""HF state dicts (BERT, RoBERTa, ELECTRA, ModernBERT) ↔ bertjax parameter trees.

The Flax trees mirror HF's module trees (see `bertjax.model`, `bertjax.modernbert`), so a name
converts by joining the path and swapping the leaf name through `LEAF_NAMES`; the only other
differences are the ones listed here: Linear kernels are transposed, the encoder of a headed model
sits under a family prefix (`bert.`, `roberta.`, `model.`), old checkpoints call LayerNorm
parameters gamma/beta, RoBERTa's MLM head has other names than BERT's, and HF's tied MLM decoder
is not a parameter of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from bertjax.errors import UserError

if TYPE_CHECKING:
    from flax import nnx

# bertjax leaf → (HF leaf, transpose?). Linear kernels are [in, out] in Flax, [out, in] in torch.
LEAF_NAMES: dict[str, tuple[str, bool]] = {
    "kernel": ("weight", True),
    "embedding": ("weight", False),
    "scale": ("weight", False),
    "bias": ("bias", False),
}

# Names some HF checkpoints use for the same tensors (TF-converted BERT checkpoints).
LEGACY_NAMES: dict[str, str] = {".LayerNorm.gamma": ".LayerNorm.weight", ".LayerNorm.beta": ".LayerNorm.bias"}

# Present in HF checkpoints, but not parameters: a position-id buffer, and the tied decoder.
IGNORED_HF_NAMES = (
    "embeddings.position_ids",
    "cls.predictions.decoder.weight",
    "cls.predictions.decoder.bias",
)

ENCODER_PREFIX = "bert."
HEAD_PREFIXES = ("cls.", "classifier.")


@dataclasses.dataclass(frozen=True)
class Rules:
    """How one family's HF checkpoints name what bertjax's tree holds (its entry in
    `bertjax.families.FAMILIES` names its rules)."""

    encoder_prefix: str  # of the encoder's tensors in a headed model's state dict
    head_prefixes: tuple[str, ...]  # tensors a model class may lack or not use
    renames: tuple[tuple[str, str], ...] = ()  # HF name prefix → the name bertjax's tree gives it
    ignored: tuple[str, ...] = IGNORED_HF_NAMES


BERT_RULES = Rules(ENCODER_PREFIX, HEAD_PREFIXES)
# RoBERTa's MLM head is BERT's under other names (its decoder tied, like BERT's).
ROBERTA_RULES = Rules(
    "roberta.",
    HEAD_PREFIXES,
    renames=(
        ("lm_head.dense.", "cls.predictions.transform.dense."),
        ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("lm_head.bias", "cls.predictions.bias"),
    ),
    ignored=(*IGNORED_HF_NAMES, "embeddings.token_type_ids", "lm_head.decoder.weight", "lm_head.decoder.bias"),
)
# bertjax models ELECTRA's and ModernBERT's encoders only: their heads are not read.
ELECTRA_RULES = Rules(
    "electra.",
    ("discriminator_predictions.", "generator_predictions.", "generator_lm_head.", "classifier."),
    ignored=(*IGNORED_HF_NAMES, "embeddings.token_type_ids"),
)
MODERNBERT_RULES = Rules("model.", ("head.", "decoder.", "classifier."))


def hf_name(path: tuple) -> tuple[str, bool]:
    """The HF name (without a `bert.` prefix) of a bertjax parameter path, and whether to transpose."""
    *modules, leaf = path
    hf_leaf, transpose = LEAF_NAMES[leaf]
    name = ".".join(str(p) for p in modules if p != "bert")
    return f"{name}.{hf_leaf}", transpose


V = TypeVar("V")


def normalize_hf_names(tensors: Mapping[str, V], model_type: str = "bert") -> dict[str, V]:
    """Drops the family's encoder prefix, legacy names and non-parameters, and renames its head,
    so that any checkpoint of the family compares equal; the values (tensors, or their shapes and
    dtypes) are kept as they are."""
    from bertjax.families import family  # the registry, which imports this module, holds the rules

    rules = family(model_type).rules
    out = {}
    for name, value in tensors.items():
        name = name.removeprefix(rules.encoder_prefix)
        for old, new in LEGACY_NAMES.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        for old, new in rules.renames:
            if name.startswith(old):
                name = new + name[len(old) :]
        if name in rules.ignored:
            continue
        out[name] = value
    return out


def to_hf(state: nnx.State, headed: bool) -> dict[str, np.ndarray]:
    """A bertjax parameter state → HF tensors (with the `bert.` prefix when the model has heads)."""
    from flax import nnx  # not at the top: the family registry reads this module's rules, flax-free

    tensors = {}
    for path, variable in nnx.to_flat_state(state):
        name, transpose = hf_name(path)
        value = np.asarray(variable.get_value())
        if headed and not name.startswith(HEAD_PREFIXES):
            name = ENCODER_PREFIX + name
        tensors[name] = np.ascontiguousarray(value.T if transpose else value)
    return tensors


def from_hf(
    abstract_state: nnx.State,
    tensors: Mapping[str, np.ndarray],
    source: str,
    model_type: str = "bert",
) -> tuple[dict[tuple, np.ndarray], list[tuple]]:
    """Fills the paths of `abstract_state` (a state of ShapeDtypeStructs) from HF tensors.

    Returns the converted leaves by path and the paths the checkpoint lacks; the caller decides
    which missing paths are acceptable (a new task head) and which are errors. A head tensor the
    model has no use for (NSP weights loaded into a classifier) is skipped; an encoder tensor the
    config does not explain means config and weights disagree, and is an error.
    """
    available = normalize_hf_names(tensors, model_type)
    leaves, missing, used = {}, [], set()
    from flax import nnx

    for path, variable in nnx.to_flat_state(abstract_state):
        name, transpose = hf_name(path)
        used.add(name)
        if name not in available:
            missing.append(path)
            continue
        value = available[name]
        if transpose:
            value = value.T
        expected = variable.get_value()
        if value.shape != expected.shape:
            raise UserError(
                f"{source}: tensor {name} has shape {list(value.shape)}, the config needs {list(expected.shape)}"
            )
        # No copy where the dtype is already the model's: the device transfer copies once
        # (BERT-base's 440 MB were copied twice).
        leaves[path] = value.astype(expected.dtype, copy=False)
    from bertjax.families import family

    heads = family(model_type).rules.head_prefixes
    unexplained = sorted(n for n in available if n not in used and not n.startswith(heads))
    if unexplained:
        what = family(model_type).described
        raise UserError(f"{source}: tensor {unexplained[0]} is not part of {what} with this config")
    return leaves, missing
