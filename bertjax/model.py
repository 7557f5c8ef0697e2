"""BERT, RoBERTa and ELECTRA in Flax NNX, with attribute names that mirror HF's `modeling_bert` tree.

RoBERTa is this model under another config (`model_type: roberta`): the same layers, position ids
counted from after the padding id, one token type. ELECTRA's encoder is too (`model_type:
electra`): narrower embeddings projected to the layers' width, no pooler. ModernBERT has layers of
its own (`bertjax.modernbert`) and shares the attention core below (`attend`).

The module tree is the HF state-dict tree with HF's leaf names swapped for Flax's (`weight` →
`kernel`/`embedding`/`scale`), so `bertjax.convert` is a short table, not guesswork.

Dropout is functional: pass `dropout_rng` to a call to train with dropout; without it the model is
deterministic. The module therefore carries parameters only, which keeps `nnx.split` states, orbax
checkpoints and shardings free of RNG counters.

Attention has two paths. When attention probabilities are needed (returned, attention dropout,
uniform disabling) the softmax is explicit; otherwise `jax.nn.dot_product_attention` runs (its XLA
implementation: JAX picks no fused kernel by itself), which never hands the probabilities back. A
head mask ξ multiplies the probabilities; on that path it multiplies the head's output instead,
which is the same product (ξ·P)V = ξ·(PV).

What a call records is a static `Capture` (the attentions; the norms ‖f_h(x_j)‖ of what each head
passes on from each key, Kobayashi et al. 2020, `bertjax.readings`), what it changes on the heads
one `Interventions` value sliced per layer; every family's layers run in one loop (`run_layers`)
that returns a `LayerRecord` per layer. Recording nothing, the forward pass is exactly the one
without the records.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, Unpack, cast

import jax
import jax.numpy as jnp
from flax import nnx, struct

from bertjax import readings
from bertjax.config import BertConfig
from bertjax.errors import UserError

Array = jax.Array


class Model(nnx.Module):
    """What every model class of every family is (`bertjax.families`), as the code that builds,
    saves and reads models of any family sees it: built from a config, which it keeps."""

    if TYPE_CHECKING:  # declared for the checker only: each class sets and takes these itself
        config: BertConfig

        def __init__(self, config: BertConfig, *, rngs: nnx.Rngs) -> None: ...


@struct.dataclass
class BertOutput:
    last_hidden_state: Array  # [B, T, d]
    pooler_output: Array | None  # [B, d]
    attentions: tuple[Array, ...] | None  # L × [B, H, T, T], fp32
    value_norms: tuple[Array, ...] | None = None  # L × [B, H, T], fp32: ‖f_h(x_j)‖ (`attention_norms`)


@struct.dataclass
class PreTrainingOutput:
    prediction_logits: Array  # [B, P, V] at masked_positions, or [B, T, V]
    seq_relationship_logits: Array  # [B, 2]
    attentions: tuple[Array, ...] | None
    value_norms: tuple[Array, ...] | None = None


@struct.dataclass
class ClassificationOutput:
    logits: Array  # [B, num_labels]
    attentions: tuple[Array, ...] | None
    value_norms: tuple[Array, ...] | None = None


def _activation(name: str):
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    return jax.nn.relu


def _dense(config: BertConfig, n_in: int, n_out: int, rngs: nnx.Rngs, use_bias: bool = True) -> nnx.Linear:
    return nnx.Linear(
        n_in,
        n_out,
        use_bias=use_bias,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        kernel_init=nnx.initializers.normal(config.initializer_range),
        rngs=rngs,
    )


def _layer_norm(config: BertConfig, rngs: nnx.Rngs, use_bias: bool = True, width: int | None = None) -> nnx.LayerNorm:
    return nnx.LayerNorm(
        width or config.hidden_size,
        epsilon=config.layer_norm_eps,
        use_bias=use_bias,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        # fp32 statistics: bf16 variance over 768 features loses too many bits.
        use_fast_variance=False,
        rngs=rngs,
    )


def _embed(config: BertConfig, num: int, rngs: nnx.Rngs, width: int | None = None) -> nnx.Embed:
    return nnx.Embed(
        num,
        width or config.hidden_size,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        embedding_init=nnx.initializers.normal(config.initializer_range),
        rngs=rngs,
    )


def lookup(table: Array, ids: Array, dtype: Any) -> Array:
    """Rows `ids` of `table`, cast to `dtype` after the gather (`nnx.Embed` casts the whole table).

    The table's gradient is summed in float32 on every platform (a bf16 table would sum in bf16:
    a batch adds up thousands of [CLS] and "the" rows). On CPUs it is the lookup's own scatter-add;
    on GPUs and TPUs one matrix product of the ids' one-hot with the cotangent, because there the
    scatter-add serialises on its atomics (33 ms of a 104 ms BERT-base bf16 step at batch 256 on
    an H100, where the step's other products ran at 600+ TFLOP/s: this one, 1.5 TFLOP, should take
    a few ms)."""
    return jax.lax.platform_dependent(
        table,
        ids,
        cpu=functools.partial(_gather, dtype=dtype),
        default=functools.partial(_gather_one_hot_grad, dtype=dtype),
    )


def _gather(table: Array, ids: Array, dtype: Any) -> Array:
    return jnp.take(table, ids, axis=0).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gather_one_hot_grad(table: Array, ids: Array, dtype: Any) -> Array:
    return _gather(table, ids, dtype)


def _gather_fwd(table: Array, ids: Array, dtype: Any) -> tuple[Array, tuple[Array, Array]]:
    return _gather(table, ids, dtype), (table, ids)


def _one_hot_grad(dtype: Any, residuals: tuple[Array, Array], cotangent: Array) -> tuple[Array, None]:
    table, ids = residuals
    one_hot = jax.nn.one_hot(ids, table.shape[0], dtype=cotangent.dtype)
    # HIGHEST: a float32 cotangent must not be rounded to TF32 on the way into the product.
    grad = jnp.einsum(
        "...v,...d->vd", one_hot, cotangent, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    )
    return grad.astype(table.dtype), None


_gather_one_hot_grad.defvjp(_gather_fwd, _one_hot_grad)


def _dropout(x: Array, rate: float, rngs: nnx.Rngs | None) -> Array:
    if rngs is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rngs.dropout(), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def sinusoidal_positions(length: int, width: int, rms: float) -> Array:
    """Vaswani et al.'s table (sin on even features, cos on odd, wavelengths 2π … 10000·2π),
    scaled so that its root mean square is `rms` (the unscaled table's is 1/√2)."""
    position = jnp.arange(length, dtype=jnp.float32)[:, None]
    frequency = jnp.exp(-math.log(10000.0) * jnp.arange(0, width, 2, dtype=jnp.float32) / width)
    table = jnp.zeros((length, width), jnp.float32)
    table = table.at[:, 0::2].set(jnp.sin(position * frequency))
    table = table.at[:, 1::2].set(jnp.cos(position * frequency[: width // 2]))
    return table * (rms * math.sqrt(2.0))


class BertEmbeddings(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        width = config.embedding_width
        self.word_embeddings = _embed(config, config.vocab_size, rngs, width)
        self.position_embeddings = _embed(config, config.max_position_embeddings, rngs, width)
        if config.position_embedding_init == "sinusoidal":
            table = sinusoidal_positions(config.max_position_embeddings, width, config.initializer_range)
            self.position_embeddings.embedding[...] = table.astype(config.storage_dtype)
        self.token_type_embeddings = _embed(config, config.type_vocab_size, rngs, width)
        self.LayerNorm = _layer_norm(config, rngs, width=width)

    def __call__(self, input_ids, token_type_ids, position_ids=None, rngs=None) -> Array:
        """position_ids None: 0 … T-1 in every row."""
        # The gradient of a lookup is a scatter-add, and on GPUs one into a few rows (2 token
        # types, T positions, each hit by every sequence) serialises on its atomics. A slice and a
        # select give the same values and turn those gradients into sums over the batch: a
        # BERT-base bf16 step at batch 256 on an H100 went from 124 to 107 ms.
        length = input_ids.shape[-1]
        check_length(self.config, length)
        dtype = self.config.compute_dtype
        if position_ids is None:
            positions = self.position_embeddings.embedding[:length].astype(dtype)[None]
        else:
            positions = self.position_embeddings(position_ids)
        types = self.token_type_embeddings.embedding[...].astype(dtype)
        if self.config.type_vocab_size == 1:
            # One type (RoBERTa): every token has it, whatever segment ids a caller passes.
            token_types = types[0]
        else:
            # A sum of at least two arrays (type_vocab_size > 1) is an array, never sum()'s start 0.
            token_types = cast(
                Array,
                sum(
                    jnp.where((token_type_ids == t)[..., None], types[t], jnp.zeros((), dtype))
                    for t in range(self.config.type_vocab_size)
                ),
            )
        x = lookup(self.word_embeddings.embedding[...], input_ids, dtype) + positions + token_types
        return _dropout(self.LayerNorm(x), self.config.hidden_dropout_prob, rngs)


def check_length(config: BertConfig, length: int) -> None:
    """Refuses sequences longer than the model's positions: a lookup past the table would give NaN
    embeddings (jnp.take's fill) without a word, and RoPE past the trained length is unseen."""
    limit = config.max_sequence_length
    if length <= limit:
        return
    if config.family.positions_after_padding:
        where = f"max_position_embeddings {config.max_position_embeddings} less {config.family.title}'s offset of {config.pad_token_id + 1}"
        raise UserError(f"sequences of {length} tokens exceed the model's {limit} positions ({where})")
    raise UserError(f"sequences of {length} tokens exceed the model's {limit} positions (max_position_embeddings)")


def roberta_position_ids(input_ids: Array, real: Array, pad_token_id: int) -> Array:
    """fairseq's numbering, as HF's `create_position_ids_from_input_ids`: the real tokens count
    from pad_token_id + 1, padding sits at pad_token_id. A token is padding where its id is the
    padding id, as in HF, or where the attention mask says so: bertjax's batches pad with id 0
    (RoBERTa's <s>), which HF would number on past the sequence."""
    counted = (input_ids != pad_token_id) & real
    return jnp.cumsum(counted, axis=-1, dtype=jnp.int32) * counted + pad_token_id


@dataclasses.dataclass(frozen=True)
class Capture:
    """What a forward pass records beside its output, per layer. Static: each setting is a pass of
    its own (under `jax.jit`, a compilation of its own), and the default records nothing.
    `value_norms` (Kobayashi et al.'s ‖f_h(x_j)‖, `readings.value_norms`) brings the attentions
    with it: the norms are read against the weights."""

    attentions: bool = False
    value_norms: bool = False

    @property
    def probabilities(self) -> bool:
        return self.attentions or self.value_norms


@struct.dataclass
class Interventions:
    """What a forward pass changes on the heads, one value for the whole model; a field left None
    changes nothing. head_mask [L, H] floats multiply each head's attention; disable [L, H] bool
    replaces a head's attention by a uniform one over the keys it may attend (Kovaleva et al.);
    offsets [L, B, H, T, T] are added to the attention probabilities (at zeros nothing changes,
    and the gradient with respect to them is the gradient with respect to the probabilities).
    `layer(i)` is layer i's slice, the same type without the leading L axis."""

    head_mask: Array | None = None
    disable: Array | None = None
    offsets: Array | None = None

    def layer(self, index: int) -> Interventions:
        return dataclasses.replace(
            self,
            **{f.name: None if (a := getattr(self, f.name)) is None else a[index] for f in dataclasses.fields(self)},
        )


@struct.dataclass
class LayerRecord:
    """What one layer recorded under a `Capture`: its attention probabilities [B, H, T, T] and its
    `value_norms` [B, H, T], each None when not captured."""

    attentions: Array | None = None
    value_norms: Array | None = None


class ModelOptions(TypedDict, total=False):
    """The keyword arguments of an encoder's call besides its inputs: `interventions` and `capture`,
    or the same under HF's and bertjax's earlier argument names (head_mask, disable_heads,
    attention_offsets; output_attentions, attention_norms), which `model_options` turns into them."""

    interventions: Interventions
    capture: Capture
    head_mask: Array | None
    disable_heads: Array | None
    attention_offsets: Array | None
    output_attentions: bool
    attention_norms: bool


_SEPARATE: dict[Literal["head_mask", "disable_heads", "attention_offsets"], str] = {
    "head_mask": "head_mask",
    "disable_heads": "disable",
    "attention_offsets": "offsets",
}


def model_options(options: ModelOptions) -> tuple[Interventions, Capture]:
    """The `Interventions` and `Capture` of a call's keyword arguments (`ModelOptions`)."""
    unknown = sorted(set(options) - set(ModelOptions.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    separate = {ours: options[theirs] for theirs, ours in _SEPARATE.items() if options.get(theirs) is not None}
    if separate and "interventions" in options:
        raise TypeError(f"pass {', '.join(separate)} inside interventions=, not beside it")
    flags = {
        "attentions": options.get("output_attentions", False),
        "value_norms": options.get("attention_norms", False),
    }
    if any(flags.values()) and "capture" in options:
        raise TypeError("pass output_attentions/attention_norms inside capture=, not beside it")
    interventions = options.get("interventions") or Interventions(**separate)
    return interventions, options.get("capture") or Capture(**flags)


def attend(
    cfg: BertConfig,
    qkv: tuple[Array, Array, Array],
    allowed: Array,
    edit: Interventions,
    capture: Capture,
    rngs: nnx.Rngs | None,
) -> tuple[Array, Array | None]:
    """Scaled dot-product attention of q, k, v [B, T, H, d_head] over the keys `allowed` (bool,
    broadcastable to [B, 1, T, T]: the real keys, and for a local layer those in its band) →
    (context [B, T, H·d_head], the probabilities [B, H, T, T] when `capture` asks, else None).
    `edit` is one layer's `Interventions` (head_mask [H], disable [H], offsets [B, H, T, T])."""
    q, k, v = qkv
    head_mask, disable, offsets = edit.head_mask, edit.disable, edit.offsets
    batch, length = q.shape[:2]
    dropout_active = rngs is not None and cfg.attention_probs_dropout_prob > 0.0

    if not (capture.probabilities or dropout_active or disable is not None or offsets is not None):
        context = jax.nn.dot_product_attention(q, k, v, mask=allowed)
        if head_mask is not None:
            context = context * head_mask.astype(context.dtype)[None, None, :, None]
        return context.reshape(batch, length, -1), None

    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(cfg.head_dim)
    scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    if disable is not None:
        # Kovaleva et al.'s disabling: the head attends uniformly over the keys it may attend.
        # A row with none (padding only) gets zeros, not 0/0 (NaN would reach every gradient).
        uniform = allowed / jnp.maximum(allowed.sum(axis=-1, keepdims=True), 1)
        probs = jnp.where(disable[None, :, None, None], uniform, probs)
    if offsets is not None:
        probs = probs + offsets.astype(jnp.float32)
    if head_mask is not None:
        probs = probs * head_mask.astype(jnp.float32)[None, :, None, None]
    used = _dropout(probs, cfg.attention_probs_dropout_prob, rngs)
    context = jnp.einsum("bhqk,bkhd->bqhd", used.astype(v.dtype), v)
    return context.reshape(batch, length, -1), probs if capture.probabilities else None


class BertSelfAttention(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        d = config.hidden_size
        self.query = _dense(config, d, d, rngs)
        self.key = _dense(config, d, d, rngs)
        self.value = _dense(config, d, d, rngs)

    def project(self, x: Array) -> tuple[Array, Array, Array]:
        """The queries, keys and values [B, T, H, d_head] of x [B, T, d]."""
        cfg = self.config
        batch, length, _ = x.shape
        split = lambda y: y.reshape(batch, length, cfg.num_attention_heads, cfg.head_dim)
        return split(self.query(x)), split(self.key(x)), split(self.value(x))


class BertSelfOutput(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.dense = _dense(config, config.hidden_size, config.hidden_size, rngs)
        self.LayerNorm = _layer_norm(config, rngs)

    def __call__(self, hidden: Array, residual: Array, rngs=None) -> Array:
        return _residual(self, hidden, residual, rngs)


class _ClosesSublayer(Protocol):
    """A block that closes a sub-layer (`BertSelfOutput`, `BertOutputBlock`): its output projection
    and the LayerNorm that pre-LN applies to the sub-layer's input and post-LN to the sum."""

    config: BertConfig
    dense: nnx.Linear
    LayerNorm: nnx.LayerNorm


def _residual(block: _ClosesSublayer, hidden: Array, residual: Array, rngs) -> Array:
    """A sub-layer's output projection added to its residual: post-LN normalises the sum; pre-LN
    normalised the sub-layer's input instead (`_sublayer_input`) and leaves the sum alone."""
    hidden = _dropout(block.dense(hidden), block.config.hidden_dropout_prob, rngs)
    if block.config.layer_norm_position == "pre":
        return hidden + residual
    return block.LayerNorm(hidden + residual)


def _sublayer_input(block: _ClosesSublayer, x: Array) -> Array:
    """What a sub-layer reads: x itself (post-LN), or x through the LayerNorm of the block that
    closes the sub-layer (pre-LN: the same parameters, so both layouts share one tree)."""
    return block.LayerNorm(x) if block.config.layer_norm_position == "pre" else x


class BertAttention(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.self = BertSelfAttention(config, rngs=rngs)
        self.output = BertSelfOutput(config, rngs=rngs)

    def __call__(
        self, x: Array, allowed: Array, edit: Interventions, capture: Capture, rngs: nnx.Rngs | None
    ) -> tuple[Array, LayerRecord]:
        attended = _sublayer_input(self.output, x)
        q, k, v = self.self.project(attended)
        context, probs = attend(self.self.config, (q, k, v), allowed, edit, capture, rngs)
        norms = readings.value_norms(v, self.output.dense) if capture.value_norms else None
        return self.output(context, x, rngs), LayerRecord(probs, norms)


class BertIntermediate(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.dense = _dense(config, config.hidden_size, config.intermediate_size, rngs)
        self.activation = _activation(config.hidden_act)

    def __call__(self, x: Array) -> Array:
        return self.activation(self.dense(x))


class BertOutputBlock(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.dense = _dense(config, config.intermediate_size, config.hidden_size, rngs)
        self.LayerNorm = _layer_norm(config, rngs)

    def __call__(self, hidden: Array, residual: Array, rngs=None) -> Array:
        return _residual(self, hidden, residual, rngs)


class BertLayer(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.attention = BertAttention(config, rngs=rngs)
        self.intermediate = BertIntermediate(config, rngs=rngs)
        self.output = BertOutputBlock(config, rngs=rngs)

    def __call__(
        self, x: Array, allowed: Array, edit: Interventions, capture: Capture, rngs: nnx.Rngs | None
    ) -> tuple[Array, LayerRecord]:
        """x [B, T, d]; allowed [B, 1, 1, T] bool (the real keys); `edit` this layer's slice of the
        model's `Interventions`."""
        attended, record = self.attention(x, allowed, edit, capture, rngs)
        return self.output(self.intermediate(_sublayer_input(self.output, attended)), attended, rngs), record


class BertEncoder(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.layer = nnx.List([BertLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])
        # Pre-LN leaves the residual stream un-normalised: the heads read it through one last norm.
        self.LayerNorm = _layer_norm(config, rngs) if config.layer_norm_position == "pre" else None

    def __call__(
        self, x: Array, real: Array, interventions: Interventions, capture: Capture, rngs: nnx.Rngs | None
    ) -> tuple[Array, tuple[LayerRecord, ...]]:
        allowed = real[:, None, None, :]
        x, records = run_layers(self.layer, x, [allowed] * len(self.layer), interventions, capture, rngs)
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
        return x, records


def run_layers(
    layers: Sequence[nnx.Module],
    x: Array,
    sites: Sequence[Any],
    interventions: Interventions,
    capture: Capture,
    rngs: nnx.Rngs | None,
) -> tuple[Array, tuple[LayerRecord, ...]]:
    """The encoder loop of every family: layer i is called as `layer(x, sites[i], edit, capture,
    rngs)`, where sites[i] is what the family's layer needs besides the stream (BERT's allowed keys;
    ModernBERT's keys and rotary tables, which differ by layer) and `edit` is layer i's slice of
    `interventions`. → (the last layer's output, one `LayerRecord` per layer)."""
    records = []
    for i, (layer, site) in enumerate(zip(layers, sites, strict=True)):
        x, record = layer(x, site, interventions.layer(i), capture, rngs)
        records.append(record)
    return x, tuple(records)


def encoder_output(hidden: Array, pooled: Array | None, records: Sequence[LayerRecord], capture: Capture) -> BertOutput:
    """An encoder's output, with the per-layer records `capture` asked for as L-tuples."""
    return BertOutput(
        last_hidden_state=hidden,
        pooler_output=pooled,
        # Every layer records what `capture` asks for, so none of these is None.
        attentions=cast(tuple[Array, ...], tuple(r.attentions for r in records)) if capture.probabilities else None,
        value_norms=cast(tuple[Array, ...], tuple(r.value_norms for r in records)) if capture.value_norms else None,
    )


class BertPooler(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.dense = _dense(config, config.hidden_size, config.hidden_size, rngs)

    def __call__(self, hidden: Array) -> Array:
        return jnp.tanh(self.dense(hidden[:, 0]))


class BertModel(Model):
    """The encoder: embeddings, L layers, pooler. Mirrors `transformers.BertModel` (and
    `RobertaModel` and `ElectraModel` under their configs)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs, add_pooling_layer: bool = True):
        self.config = config
        self.embeddings = BertEmbeddings(config, rngs=rngs)
        # ELECTRA's narrower embeddings are projected to the layers' width.
        width = config.embedding_width
        self.embeddings_project = (
            None if width == config.hidden_size else _dense(config, width, config.hidden_size, rngs)
        )
        self.encoder = BertEncoder(config, rngs=rngs)
        # ELECTRA's encoder has no pooler.
        self.pooler = BertPooler(config, rngs=rngs) if add_pooling_layer and config.family.pooler else None

    def __call__(
        self,
        input_ids: Array,
        attention_mask: Array | None = None,
        token_type_ids: Array | None = None,
        position_ids: Array | None = None,
        *,
        dropout_rng: Array | None = None,
        **options: Unpack[ModelOptions],
    ) -> BertOutput:
        """input_ids [B, T]; attention_mask [B, T] (1 = real token); dropout_rng enables dropout
        (training); `options`: what the call changes on the heads (`interventions=Interventions(...)`)
        and what it records (`capture=Capture(...)`, static), or the same as separate arguments
        (`ModelOptions`)."""
        interventions, capture = model_options(options)
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        rngs = None if dropout_rng is None else nnx.Rngs(dropout=dropout_rng)
        real = attention_mask.astype(bool)
        if position_ids is None and self.config.family.positions_after_padding:
            position_ids = roberta_position_ids(input_ids, real, self.config.pad_token_id)
        x = self.embeddings(input_ids, token_type_ids, position_ids, rngs)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        x, records = self.encoder(x, real, interventions, capture, rngs)
        pooled = None if self.pooler is None else self.pooler(x)
        return encoder_output(x, pooled, records, capture)


class BertPredictionHeadTransform(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.dense = _dense(config, config.hidden_size, config.hidden_size, rngs)
        self.activation = _activation(config.hidden_act)
        self.LayerNorm = _layer_norm(config, rngs)

    def __call__(self, x: Array) -> Array:
        return self.LayerNorm(self.activation(self.dense(x)))


class BertLMPredictionHead(nnx.Module):
    """The MLM head; its decoder is the word-embedding matrix (tied), plus its own bias."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.transform = BertPredictionHeadTransform(config, rngs=rngs)
        self.bias = nnx.Param(jnp.zeros((config.vocab_size,), config.storage_dtype))

    def __call__(self, hidden: Array, word_embeddings: nnx.Embed) -> Array:
        logits = word_embeddings.attend(self.transform(hidden))
        return logits.astype(jnp.float32) + self.bias[...].astype(jnp.float32)


class BertPreTrainingHeads(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.predictions = BertLMPredictionHead(config, rngs=rngs)
        self.seq_relationship = _dense(config, config.hidden_size, 2, rngs)


class BertForPreTraining(Model):
    """BERT with the MLM and NSP heads. Mirrors `transformers.BertForPreTraining`."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, rngs=rngs)
        self.cls = BertPreTrainingHeads(config, rngs=rngs)

    def __call__(
        self,
        input_ids: Array,
        attention_mask: Array | None = None,
        token_type_ids: Array | None = None,
        position_ids: Array | None = None,
        *,
        masked_positions: Array | None = None,
        **kwargs: Any,
    ) -> PreTrainingOutput:
        """masked_positions [B, P]: MLM logits are computed only there (vocab projection is the
        largest matmul of the model), else at every position."""
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, **kwargs)
        hidden = out.last_hidden_state
        if masked_positions is not None:
            hidden = jnp.take_along_axis(hidden, masked_positions[..., None], axis=1)
        prediction_logits = self.cls.predictions(hidden, self.bert.embeddings.word_embeddings)
        assert out.pooler_output is not None  # the families with these heads (BERT, RoBERTa) have a pooler
        nsp_logits = self.cls.seq_relationship(out.pooler_output).astype(jnp.float32)
        return PreTrainingOutput(prediction_logits, nsp_logits, out.attentions, out.value_norms)


class BertForSequenceClassification(Model):
    """A linear classifier on the pooled [CLS] output. Mirrors HF's class of the same name."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, rngs=rngs)
        self.classifier = _dense(config, config.hidden_size, config.num_labels, rngs)

    def __call__(self, input_ids: Array, *args: Any, **kwargs: Any) -> ClassificationOutput:
        out = self.bert(input_ids, *args, **kwargs)
        dropout_rng = kwargs.get("dropout_rng")
        rngs = None if dropout_rng is None else nnx.Rngs(dropout=jax.random.fold_in(dropout_rng, 1))
        assert out.pooler_output is not None  # the families with a classifier (BERT, RoBERTa) have a pooler
        pooled = _dropout(out.pooler_output, self.config.classifier_dropout_prob, rngs)
        return ClassificationOutput(self.classifier(pooled).astype(jnp.float32), out.attentions, out.value_norms)
