"""ModernBERT (Warner et al. 2024) in Flax NNX, with attribute names that mirror HF's
`modeling_modernbert` tree, so that `bertjax.convert` reads its checkpoints with BERT's rules.

What differs from BERT: no position table but rotary position embeddings (RoPE) on the queries and
keys, with one base for global layers and another for local ones; pre-norm layers (the first
layer reads the embeddings' norm directly: HF's `attn_norm` is an Identity there) and a final
norm; a GeGLU MLP; LayerNorms and linear layers without biases (by default); no token types and
no pooler. Every `global_attn_every_n_layers`-th layer attends over the whole sequence, the others
over a band of ±`local_attention`//2 positions. The band belongs to the model: a local layer's
attention probabilities are the full T × T matrix with zeros outside it, head disabling spreads
a head uniformly over its band, and the analyses see exactly what the model computes.

The reference is transformers' eager (and sdpa) attention on a padded batch; the flash-attention
path, which unpads the batch, computes the same function in another order.
"""

from __future__ import annotations

from typing import Unpack

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bertjax import readings
from bertjax.config import BertConfig
from bertjax.model import (
    BertOutput,
    Capture,
    Interventions,
    LayerRecord,
    Model,
    ModelOptions,
    _activation,
    _dense,
    _dropout,
    _embed,
    _layer_norm,
    attend,
    check_length,
    encoder_output,
    lookup,
    model_options,
    run_layers,
)

Array = jax.Array
# What a layer attends over: the keys it may attend [B, 1, T, T] and RoPE's (cos, sin) of its kind.
Site = tuple[Array, tuple[Array, Array]]


def rotary_tables(positions: Array, theta: float, head_dim: int) -> tuple[Array, Array]:
    """(cos, sin) [..., T, head_dim] of RoPE at `positions` [..., T], in float32 as HF computes
    them (its inverse frequencies in float32, their products with the positions in float32):
    at position p an angle is p·θ^(-2i/d), so a rounding of its frequency moves it by p·2⁻²⁴."""
    inv_freq = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x: Array, cos: Array, sin: Array) -> Array:
    """RoPE on x [B, T, H, d_head] in HF's layout (the two halves of a head are a feature's
    cosine and sine partners, not interleaved pairs), in float32."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)


class ModernBertEmbeddings(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.tok_embeddings = _embed(config, config.vocab_size, rngs)
        self.norm = _layer_norm(config, rngs, use_bias=config.norm_bias)

    def __call__(self, input_ids: Array, rngs=None) -> Array:
        x = lookup(self.tok_embeddings.embedding[...], input_ids, self.config.compute_dtype)
        return _dropout(self.norm(x), self.config.hidden_dropout_prob, rngs)


class ModernBertAttention(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        d = config.hidden_size
        self.Wqkv = _dense(config, d, 3 * d, rngs, use_bias=config.attention_bias)
        self.Wo = _dense(config, d, d, rngs, use_bias=config.attention_bias)

    def __call__(
        self, x: Array, site: Site, edit: Interventions, capture: Capture, rngs: nnx.Rngs | None
    ) -> tuple[Array, LayerRecord]:
        """→ (output, the layer's record: `value_norms` [B, H, T] through Wo)."""
        cfg = self.config
        allowed, rotary = site
        batch, length, _ = x.shape
        # HF's Wqkv output is [q | k | v], each [H, d_head].
        qkv = self.Wqkv(x).reshape(batch, length, 3, cfg.num_attention_heads, cfg.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        q, k = rotate(q, *rotary), rotate(k, *rotary)
        context, probs = attend(cfg, (q, k, v), allowed, edit, capture, rngs)
        return self.Wo(context), LayerRecord(probs, readings.value_norms(v, self.Wo) if capture.value_norms else None)


class ModernBertMLP(nnx.Module):
    """GeGLU: Wi's output is [input | gate]; Wo reads act(input) · gate."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        d, inner = config.hidden_size, config.intermediate_size
        self.Wi = _dense(config, d, 2 * inner, rngs, use_bias=config.mlp_bias)
        self.Wo = _dense(config, inner, d, rngs, use_bias=config.mlp_bias)
        self.activation = _activation(config.hidden_act)

    def __call__(self, x: Array, rngs=None) -> Array:
        inputs, gate = jnp.split(self.Wi(x), 2, axis=-1)
        return self.Wo(_dropout(self.activation(inputs) * gate, self.config.hidden_dropout_prob, rngs))


class ModernBertEncoderLayer(nnx.Module):
    def __init__(self, config: BertConfig, index: int, *, rngs: nnx.Rngs):
        # The embeddings end in a norm, so the first layer reads them as they are.
        self.attn_norm = None if index == 0 else _layer_norm(config, rngs, use_bias=config.norm_bias)
        self.attn = ModernBertAttention(config, rngs=rngs)
        self.mlp_norm = _layer_norm(config, rngs, use_bias=config.norm_bias)
        self.mlp = ModernBertMLP(config, rngs=rngs)

    def __call__(
        self, x: Array, site: Site, edit: Interventions, capture: Capture, rngs: nnx.Rngs | None
    ) -> tuple[Array, LayerRecord]:
        attended = x if self.attn_norm is None else self.attn_norm(x)
        out, record = self.attn(attended, site, edit, capture, rngs)
        x = x + out
        return x + self.mlp(self.mlp_norm(x), rngs), record


class ModernBertModel(Model):
    """The encoder: embeddings, L layers, final norm. Mirrors `transformers.ModernBertModel`;
    called as `BertModel` is (token_type_ids are accepted and ignored; pooler_output is None)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = ModernBertEmbeddings(config, rngs=rngs)
        self.layers = nnx.List([ModernBertEncoderLayer(config, i, rngs=rngs) for i in range(config.num_hidden_layers)])
        self.final_norm = _layer_norm(config, rngs, use_bias=config.norm_bias)

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
        """As `BertModel.__call__`; position_ids (default 0 … T-1 in every row, padding or not,
        as in HF) are RoPE's positions."""
        del token_type_ids  # ModernBERT has no segment embedding
        interventions, capture = model_options(options)
        cfg = self.config
        length = input_ids.shape[-1]
        check_length(cfg, length)
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if position_ids is None:
            position_ids = jnp.arange(length)[None]
        rngs = None if dropout_rng is None else nnx.Rngs(dropout=dropout_rng)
        real = attention_mask.astype(bool)[:, None, None, :]
        index = jnp.arange(length)
        # HF's bidirectional sliding window: |query − key| ≤ local_attention // 2, inclusive.
        band = jnp.abs(index[:, None] - index[None, :]) <= cfg.local_attention // 2
        theta = {"full_attention": cfg.global_rope_theta, "sliding_attention": cfg.local_rope_theta}
        assert cfg.layer_types is not None  # a ModernBERT config's check fills them in
        rotary = {kind: rotary_tables(position_ids, theta[kind], cfg.head_dim) for kind in set(cfg.layer_types)}
        x = self.embeddings(input_ids, rngs)
        sites = [(real if cfg.is_global(i) else real & band, rotary[kind]) for i, kind in enumerate(cfg.layer_types)]
        x, records = run_layers(self.layers, x, sites, interventions, capture, rngs)
        return encoder_output(self.final_norm(x), None, records, capture)
