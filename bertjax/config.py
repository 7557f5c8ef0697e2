"""The encoder config: presets by size, and the HF `config.json` in both directions.

One config class covers the families bertjax models (`model_type`): BERT, RoBERTa (BERT's layers
under other names, positions counted from after the padding id), ELECTRA (BERT's layers behind a
projection of narrower embeddings) and ModernBERT (its own layers: `bertjax.modernbert`). A family
reads only the fields that describe it; the others keep their defaults and are not written to its
`config.json`. Each family's config adapter (below: reading and writing its `config.json`, checking
its own fields) is named by its entry in `bertjax.families.FAMILIES`."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp

from bertjax.errors import UserError

if TYPE_CHECKING:
    from bertjax.families import Family


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture and numerics of an encoder (BERT, RoBERTa, ELECTRA or ModernBERT); field names
    follow HF's `BertConfig`, and ModernBERT's own fields its `ModernBertConfig`."""

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
    # HF's model_type: a family of `bertjax.families.FAMILIES` ("bert", "roberta", "electra", "modernbert").
    model_type: str = "bert"
    # ELECTRA only: the width of its embeddings, projected to hidden_size (None: hidden_size).
    embedding_size: int | None = None
    # ModernBERT only, named as in HF's ModernBertConfig. Each layer attends globally
    # ("full_attention") or within a band of ±local_attention//2 positions ("sliding_attention");
    # None means HF's default, every third layer global from layer 0. RoPE's base differs by kind.
    layer_types: tuple[str, ...] | None = None
    local_attention: int = 128
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

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
        self.family.check(self)
        if self.embedding_size is not None and (
            not self.family.narrow_embeddings or not isinstance(self.embedding_size, int) or self.embedding_size < 1
        ):
            raise UserError(f"embedding_size must be an integer ≥ 1 of an ELECTRA config, got {self.embedding_size!r}")

    @property
    def family(self) -> Family:
        """The registry entry of `model_type` (`bertjax.families`), or a UserError naming the families."""
        from bertjax.families import family  # the registry imports this module's config adapters

        return family(self.model_type)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def max_sequence_length(self) -> int:
        """The longest sequence the model embeds: RoBERTa's positions start at pad_token_id + 1
        (fairseq's numbering), so its table holds that many fewer."""
        if self.family.positions_after_padding:
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def has_token_types(self) -> bool:
        """Whether token_type_ids reach the model: RoBERTa has one type and ModernBERT none, so
        their segments exist only in the separators (the model ignores token_type_ids)."""
        return self.family.token_types and self.type_vocab_size > 1

    def is_global(self, layer: int) -> bool:
        """Whether a layer attends over the whole sequence (always, outside ModernBERT)."""
        return self.layer_types is None or self.layer_types[layer] == "full_attention"

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
        """This config as its family's HF `config.json`, for bertjax's class `architecture`."""
        return self.family.write_hf(self, architecture)

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config", **overrides: Any) -> BertConfig:
        """Reads the fields bertjax models; rejects variants it does not implement."""
        from bertjax.families import family  # the registry imports this module's config adapters

        try:
            read_hf = family(hf.get("model_type", "bert")).read_hf
        except UserError as e:
            raise UserError(f"{source}: {e}") from None
        hf = read_hf(hf, source)
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


# The config adapters of the families (`bertjax.families`): BERT's serves RoBERTa and ELECTRA too.


def check_bert(config: BertConfig) -> None:
    family = config.family
    if config.layer_types is not None:
        raise UserError(f"layer_types is a ModernBERT field; model_type {config.model_type!r} has none")
    if family.positions_after_padding and config.max_sequence_length < 1:
        raise UserError(
            f"max_position_embeddings {config.max_position_embeddings} leaves no position after {family.title}'s "
            f"offset of pad_token_id + 1 = {config.pad_token_id + 1}"
        )


def bert_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """A BERT-like config.json's fields (those of BERT, RoBERTa, ELECTRA), refusing the variants
    bertjax does not implement."""
    from bertjax.families import family

    narrow = family(hf.get("model_type", "bert")).narrow_embeddings
    position = hf.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise UserError(f"{source}: position_embedding_type {position!r} is not supported")
    if hf.get("tie_word_embeddings", True) is False:
        # bertjax's MLM decoder is the word-embedding table; an untied one would be dropped.
        raise UserError(f"{source}: tie_word_embeddings false (an untied MLM decoder) is not supported")
    hf = {k: v for k, v in hf.items() if k not in MODERNBERT_FIELDS}
    if narrow and hf.get("embedding_size") == hf.get("hidden_size", BertConfig.hidden_size):
        hf.pop("embedding_size")  # no projection: one config for one model
    elif not narrow:
        hf.pop("embedding_size", None)
    return hf


def bert_hf_dict(config: BertConfig, architecture: str) -> dict[str, Any]:
    family = config.family
    own = (*MODERNBERT_FIELDS, *(() if family.narrow_embeddings else ("embedding_size",)))
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in own}
    fields.pop("dtype")
    fields.pop("param_dtype")
    num_labels = fields.pop("num_labels")
    architecture = architecture.replace("Bert", family.architecture, 1)
    hf = {"architectures": [architecture], **fields}
    hf["position_embedding_type"] = "absolute"
    hf["tie_word_embeddings"] = True
    hf["dtype"] = config.param_dtype
    if architecture.endswith("ForSequenceClassification"):
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    return hf


def modernbert_hf_dict(config: BertConfig, architecture: str) -> dict[str, Any]:
    same = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "initializer_range", "pad_token_id", "classifier_dropout",
            "model_type", *MODERNBERT_FIELDS)  # fmt: skip
    hf: dict[str, Any] = {"architectures": [architecture.replace("Bert", config.family.architecture, 1)]}
    hf.update({name: getattr(config, name) for name in same})
    assert config.layer_types is not None  # a ModernBERT config's check fills them in
    hf["layer_types"] = list(config.layer_types)
    hf["hidden_activation"] = config.hidden_act
    hf["norm_eps"] = config.layer_norm_eps
    hf["attention_dropout"] = config.attention_probs_dropout_prob
    hf["mlp_dropout"] = config.hidden_dropout_prob
    hf["num_labels"] = config.num_labels
    hf["dtype"] = config.param_dtype
    return hf


def check_modernbert(config: BertConfig) -> None:
    # Set here (the dataclass is frozen) so that every reader sees the layers' kinds, as a tuple:
    # configs key caches, so they must hash.
    if config.layer_types is None:
        object.__setattr__(config, "layer_types", every_nth_global(config.num_hidden_layers, 3))
    elif isinstance(config.layer_types, list):
        object.__setattr__(config, "layer_types", tuple(config.layer_types))
    kinds = config.layer_types
    if (
        not isinstance(kinds, tuple)
        or len(kinds) != config.num_hidden_layers
        or not all(kind in LAYER_TYPES for kind in kinds)
    ):
        raise UserError(
            f"layer_types must list one of {', '.join(LAYER_TYPES)} for each of the {config.num_hidden_layers} layers, "
            f"got {kinds!r}"
        )
    if (
        not isinstance(config.local_attention, int)
        or isinstance(config.local_attention, bool)
        or config.local_attention < 2
    ):
        raise UserError(f"local_attention must be an integer ≥ 2, got {config.local_attention!r}")
    for name in ("global_rope_theta", "local_rope_theta"):
        value = getattr(config, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 1:
            raise UserError(f"{name} must be a number > 1, got {value!r}")
    if config.head_dim % 2:
        raise UserError(f"RoPE needs an even head size, got hidden_size/num_attention_heads = {config.head_dim}")
    for name in ("norm_bias", "attention_bias", "mlp_bias"):
        if not isinstance(getattr(config, name), bool):
            raise UserError(f"{name} must be true or false, got {getattr(config, name)!r}")


def every_nth_global(layers: int, every: int) -> tuple[str, ...]:
    """ModernBERT's alternation: layers 0, every, 2·every, … global, the others local."""
    return tuple("sliding_attention" if i % every else "full_attention" for i in range(layers))


def modernbert_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """A ModernBERT config.json's fields under bertjax's names. transformers ≥ 5 writes
    `layer_types` and `rope_parameters`; earlier versions (and the hub's checkpoints)
    `global_attn_every_n_layers` and `global_rope_theta` / `local_rope_theta`: both are read."""
    out = {k: hf[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                              "intermediate_size", "max_position_embeddings", "initializer_range",
                              "classifier_dropout", "id2label", "num_labels", "local_attention", "pad_token_id",
                              "norm_bias", "attention_bias", "mlp_bias", "global_rope_theta", "local_rope_theta")
           if hf.get(k) is not None}  # fmt: skip
    out["model_type"] = "modernbert"
    out["type_vocab_size"] = 1
    # ModernBERT's embedding dropout has no field of its own here: bertjax drops there at hidden_dropout_prob.
    renamed = {"hidden_activation": "hidden_act", "norm_eps": "layer_norm_eps",
               "attention_dropout": "attention_probs_dropout_prob", "mlp_dropout": "hidden_dropout_prob"}  # fmt: skip
    out.update({ours: hf[theirs] for theirs, ours in renamed.items() if hf.get(theirs) is not None})
    out.setdefault("layer_norm_eps", 1e-5)
    out.setdefault("hidden_dropout_prob", 0.0)
    out.setdefault("attention_probs_dropout_prob", 0.0)
    if hf.get("layer_types") is not None:
        out["layer_types"] = hf["layer_types"]
    elif isinstance(hf.get("num_hidden_layers"), int):
        every = hf.get("global_attn_every_n_layers", 3)
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise UserError(f"{source}: global_attn_every_n_layers must be an integer ≥ 1, got {every!r}")
        out["layer_types"] = every_nth_global(hf["num_hidden_layers"], every)
    ropes = hf.get("rope_parameters") or {}
    if not isinstance(ropes, dict) or not all(isinstance(r, dict | None) for r in ropes.values()):
        raise UserError(f"{source}: rope_parameters must map layer types to objects, got {ropes!r}")
    for kind, theta in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        rope = ropes.get(kind) or {}
        if rope.get("rope_type", "default") != "default":
            raise UserError(f"{source}: rope_type {rope['rope_type']!r} ({kind}) is not supported (only 'default')")
        if "rope_theta" in rope:
            out[theta] = rope["rope_theta"]
    return out


@dataclasses.dataclass(frozen=True)
class ConfigAdapter:
    """A family's config side (`bertjax.families.Family.config_adapter` names one): its HF
    config.json's fields under `BertConfig`'s names (`read_hf(hf, source)`), a config as that
    config.json (`write_hf(config, architecture)`), and the checks of the family's own fields."""

    read_hf: Callable[[dict[str, Any], str], dict[str, Any]]
    write_hf: Callable[[BertConfig, str], dict[str, Any]]
    check: Callable[[BertConfig], None]


BERT_ADAPTER = ConfigAdapter(bert_fields, bert_hf_dict, check_bert)
MODERNBERT_ADAPTER = ConfigAdapter(modernbert_fields, modernbert_hf_dict, check_modernbert)

# ModernBERT's own fields (written only to its config.json).
MODERNBERT_FIELDS = ("layer_types", "local_attention", "global_rope_theta", "local_rope_theta", "norm_bias",
                     "attention_bias", "mlp_bias")  # fmt: skip
LAYER_TYPES = ("full_attention", "sliding_attention")
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
