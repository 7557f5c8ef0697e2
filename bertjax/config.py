"""The BERT architecture config: presets by size, and the HF `config.json` in both directions."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from bertjax.errors import UserError


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture and numerics of a BERT encoder; field names follow HF's `BertConfig`."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    # HF's rule: None means the classifier's dropout is hidden_dropout_prob.
    classifier_dropout: float | None = None
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    num_labels: int = 2
    # Compute dtype (activations, matmuls) is separate from the storage dtype of the parameters so
    # that accelerators can run bf16 over fp32 master weights. Softmax and LayerNorm statistics
    # always run in fp32.
    dtype: str = "float32"
    param_dtype: str = "float32"
    # "post": BERT's LayerNorm after each residual sum. "pre" (Xiong et al. 2020; the Cramming
    # recipe): LayerNorm on each sub-layer's input, the residual stream left un-normalised, one
    # final LayerNorm after the last layer. HF's BertModel has no pre-LN, so it cannot be exported.
    layer_norm_position: str = "post"
    # How the (always learned) position table starts: "normal" (BERT's N(0, initializer_range)), or
    # "sinusoidal" (Vaswani et al. 2017's table, scaled to the same RMS), which hands the model
    # relative offsets from step 1 (Cramming and Bietti et al. 2023 use sin/cos positions).
    position_embedding_init: str = "normal"

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.layer_norm_position not in LAYER_NORM_POSITIONS:
            raise UserError(
                f"layer_norm_position {self.layer_norm_position!r} is not one of {', '.join(LAYER_NORM_POSITIONS)}"
            )
        if self.position_embedding_init not in POSITION_INITS:
            raise UserError(
                f"position_embedding_init {self.position_embedding_init!r} is not one of {', '.join(POSITION_INITS)}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise UserError(f"hidden_act {self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def classifier_dropout_prob(self) -> float:
        return self.hidden_dropout_prob if self.classifier_dropout is None else self.classifier_dropout

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)

    def to_hf_dict(self, architecture: str = "BertModel") -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields.pop("dtype")
        fields.pop("param_dtype")
        num_labels = fields.pop("num_labels")
        hf = {"architectures": [architecture], "model_type": "bert", **fields}
        hf["position_embedding_type"] = "absolute"
        hf["tie_word_embeddings"] = True
        hf["dtype"] = self.param_dtype
        if architecture == "BertForSequenceClassification":
            hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
            hf["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
        return hf

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config", **overrides: Any) -> BertConfig:
        """Reads the fields bertjax models; rejects BERT variants it does not implement."""
        model_type = hf.get("model_type", "bert")
        if model_type != "bert":
            raise UserError(f"{source}: model_type {model_type!r} is not 'bert'")
        position = hf.get("position_embedding_type", "absolute")
        if position != "absolute":
            raise UserError(f"{source}: position_embedding_type {position!r} is not supported")
        if hf.get("tie_word_embeddings", True) is False:
            # bertjax's MLM decoder is the word-embedding table; an untied one would be dropped.
            raise UserError(f"{source}: tie_word_embeddings false (an untied MLM decoder) is not supported")
        names = {f.name for f in dataclasses.fields(cls)} - {"dtype", "param_dtype", "num_labels"}
        kwargs: dict[str, Any] = {k: hf[k] for k in names if k in hf}
        if "id2label" in hf:
            if not isinstance(hf["id2label"], dict):
                raise UserError(f"{source}: id2label must be an object of label names, got {hf['id2label']!r}")
            kwargs["num_labels"] = len(hf["id2label"])
        elif "num_labels" in hf:
            kwargs["num_labels"] = hf["num_labels"]
        kwargs.update(overrides)
        try:
            return cls(**kwargs)
        except UserError as e:
            raise UserError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path: str | Path, **overrides: Any) -> BertConfig:
        return cls.from_hf_dict(read_hf_json(path), source=str(path), **overrides)

    def to_json_file(self, path: str | Path, architecture: str = "BertModel", overwrite: bool = False) -> None:
        from bertjax.runinfo import atomic_file  # runinfo imports jax's devices; most users of a config do not

        with atomic_file(path, overwrite=overwrite) as f:
            f.write(json.dumps(self.to_hf_dict(architecture), indent=2, sort_keys=True) + "\n")


def read_hf_json(path: str | Path) -> dict[str, Any]:
    """A HF `config.json` as a dict, or a UserError naming the file."""
    path = Path(path)
    try:
        hf = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(hf, dict):
        raise UserError(f"{path}: not a JSON object of config fields (it is a JSON {type(hf).__name__})")
    return hf


# Sizes and counts must be integers ≥ 1 (≥ 0 for an id); JSON 12.0 or "12" is a mistake, not a 12.
_POSITIVE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size", "num_labels")  # fmt: skip
_PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")


def _check_fields(config: BertConfig) -> None:
    """Types and ranges of the fields, so that a bad `config.json` is one line naming the field,
    not a TypeError or a ZeroDivisionError inside the model."""

    def bad(name: str, wanted: str) -> UserError:
        return UserError(f"{name} must be {wanted}, got {getattr(config, name)!r}")

    def is_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def is_number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

    for name in _POSITIVE:
        if not is_int(getattr(config, name)) or getattr(config, name) < 1:
            raise bad(name, "an integer ≥ 1")
    if not is_int(config.pad_token_id) or not 0 <= config.pad_token_id < config.vocab_size:
        raise bad("pad_token_id", f"an integer in [0, vocab_size {config.vocab_size})")
    for name in _PROBABILITIES:
        value = getattr(config, name)
        if not (value is None and name == "classifier_dropout") and not (is_number(value) and 0 <= value < 1):
            raise bad(name, "a number in [0, 1)")
    if not is_number(config.layer_norm_eps) or config.layer_norm_eps <= 0:
        raise bad("layer_norm_eps", "a number > 0")
    if not is_number(config.initializer_range) or config.initializer_range < 0:
        raise bad("initializer_range", "a number ≥ 0")
    for name in ("hidden_act", "dtype", "param_dtype"):
        if not isinstance(getattr(config, name), str):
            raise bad(name, "a string")


ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
LAYER_NORM_POSITIONS = ("post", "pre")
POSITION_INITS = ("normal", "sinusoidal")


def _preset(layers: int, hidden: int, heads: int) -> BertConfig:
    return BertConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
    )


# The sizes of Turc et al. 2019 ("Well-read students learn better"), plus BERT-base and -large.
PRESETS: dict[str, BertConfig] = {
    "tiny": _preset(2, 128, 2),
    "mini": _preset(4, 256, 4),
    "small": _preset(4, 512, 8),
    "medium": _preset(8, 512, 8),
    "base": _preset(12, 768, 12),
    "large": _preset(24, 1024, 16),
}


def preset(name: str, **overrides: Any) -> BertConfig:
    if name not in PRESETS:
        raise UserError(f"unknown model preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides)
