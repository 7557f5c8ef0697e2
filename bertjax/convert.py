"""HF BERT state dict ↔ bertjax parameter tree.

The Flax tree mirrors HF's module tree (see `bertjax.model`), so a name converts by joining the
path and swapping the leaf name through `LEAF_NAMES`; the only other differences are the ones
listed here: Linear kernels are transposed, the encoder of a headed model sits under `bert.`, old
checkpoints call LayerNorm parameters gamma/beta, and HF's tied MLM decoder is not a parameter
of its own.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flax import nnx

from bertjax.errors import UserError

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


def hf_name(path: tuple) -> tuple[str, bool]:
    """The HF name (without a `bert.` prefix) of a bertjax parameter path, and whether to transpose."""
    *modules, leaf = path
    hf_leaf, transpose = LEAF_NAMES[leaf]
    name = ".".join(str(p) for p in modules if p != "bert")
    return f"{name}.{hf_leaf}", transpose


def normalize_hf_names(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drops the `bert.` prefix, legacy names and non-parameters so any BERT checkpoint compares equal."""
    out = {}
    for name, value in tensors.items():
        name = name.removeprefix(ENCODER_PREFIX)
        for old, new in LEGACY_NAMES.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        if name in IGNORED_HF_NAMES:
            continue
        out[name] = value
    return out


def to_hf(state: nnx.State, headed: bool) -> dict[str, np.ndarray]:
    """A bertjax parameter state → HF tensors (with the `bert.` prefix when the model has heads)."""
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
) -> tuple[dict[tuple, np.ndarray], list[tuple]]:
    """Fills the paths of `abstract_state` (a state of ShapeDtypeStructs) from HF tensors.

    Returns the converted leaves by path and the paths the checkpoint lacks; the caller decides
    which missing paths are acceptable (a new task head) and which are errors. A head tensor the
    model has no use for (NSP weights loaded into a classifier) is skipped; an encoder tensor the
    config does not explain means config and weights disagree, and is an error.
    """
    available = normalize_hf_names(tensors)
    leaves, missing, used = {}, [], set()
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
        leaves[path] = value.astype(expected.dtype)
    unexplained = sorted(n for n in available if n not in used and not n.startswith(HEAD_PREFIXES))
    if unexplained:
        raise UserError(f"{source}: tensor {unexplained[0]} is not part of a BERT with this config")
    return leaves, missing
