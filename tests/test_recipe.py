"""The pre-training recipe options for small budgets (docs/pretraining.md): pre-LN, sinusoidal
position initialisation, warm-up as a share of the budget. Each default keeps BERT exactly; each
option is checked against an obvious re-statement of its definition. (The pair task, SOP or MLM
only, is tested with the instances in test_train_data.py and against transformers in
test_grad_parity.py.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bertjax
from bertjax.errors import UserError
from bertjax.model import Capture, Interventions, attend, sinusoidal_positions
from train.optim import OptimizerConfig, schedule

# float32 through 2 small layers, compared with the same float32 pieces composed by hand in another
# order of operations only where XLA fuses differently: a few ulps of O(1) values.
ATOL = 1e-5


def small(**changes):
    return bertjax.preset("tiny", vocab_size=50, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                          max_position_embeddings=16, **changes)  # fmt: skip


def perturbed(model):
    """Random LayerNorm scales and biases, so that where a norm is applied matters."""
    rng = np.random.default_rng(1)
    params = nnx.state(model, nnx.Param)
    for path, variable in nnx.to_flat_state(params):
        if "LayerNorm" in path:
            shape = variable.get_value().shape
            variable.set_value(jnp.asarray(1 + 0.3 * rng.standard_normal(shape), jnp.float32))
    nnx.update(model, params)
    return model


def pre_ln_by_hand(model, ids, mask):
    """x ← x + Attn(LN₁ x); x ← x + FFN(LN₂ x) per layer, then a final LN (Xiong et al. 2020)."""
    bert = model.bert
    types = jnp.zeros_like(ids)
    x = bert.embeddings(ids, types)
    real = mask.astype(bool)
    for layer in bert.encoder.layer:
        attention = layer.attention
        q, k, v = attention.self.project(attention.output.LayerNorm(x))
        context, _ = attend(attention.self.config, (q, k, v), real[:, None, None, :], Interventions(), Capture(), None)
        x = x + attention.output.dense(context)
        x = x + layer.output.dense(layer.intermediate(layer.output.LayerNorm(x)))
    return bert.encoder.LayerNorm(x)


def test_pre_ln_is_the_pre_ln_transformer():
    model = perturbed(bertjax.init_model(small(layer_norm_position="pre"), bertjax.BertForPreTraining, seed=0))
    ids = jnp.asarray(np.random.default_rng(0).integers(5, 50, (3, 12)), jnp.int32)
    mask = jnp.ones_like(ids).at[2, 8:].set(0)
    ours = model.bert(ids, mask).last_hidden_state
    np.testing.assert_allclose(ours, pre_ln_by_hand(model, ids, mask), atol=ATOL)
    # The planted bug: the same parameters wired post-LN give another function.
    post = bertjax.BertForPreTraining(small(), rngs=nnx.Rngs(0))
    values = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    params = nnx.state(post, nnx.Param)
    for path, variable in nnx.to_flat_state(params):
        variable.set_value(values[path].get_value())
    nnx.update(post, params)
    assert np.abs(post.bert(ids, mask).last_hidden_state - ours).max() > 100 * ATOL


def test_post_ln_default_has_no_final_norm_and_pre_ln_one():
    assert bertjax.init_model(small(), bertjax.BertModel, seed=0).encoder.LayerNorm is None
    pre = bertjax.init_model(small(layer_norm_position="pre"), bertjax.BertModel, seed=0)
    assert pre.encoder.LayerNorm is not None
    with pytest.raises(UserError, match="layer_norm_position 'mid'"):
        small(layer_norm_position="mid")


def test_a_pre_ln_model_cannot_be_exported_to_hf(tmp_path):
    model = bertjax.init_model(small(layer_norm_position="pre"), bertjax.BertForPreTraining, seed=0)
    with pytest.raises(UserError, match="pre-LN model cannot be written in HF's format"):
        bertjax.save_pretrained(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_sinusoidal_positions_are_vaswanis_table_at_berts_scale():
    config = small(position_embedding_init="sinusoidal")
    table = np.asarray(
        bertjax.init_model(config, bertjax.BertModel, seed=0).embeddings.position_embeddings.embedding[...]
    )
    d = config.hidden_size
    expected = np.zeros((16, d))
    for p in range(16):
        for i in range(0, d, 2):
            expected[p, i] = np.sin(p / 10000 ** (i / d))
            expected[p, i + 1] = np.cos(p / 10000 ** (i / d))
    scale = config.initializer_range * np.sqrt(2)
    # float32 angles p·ω (p < 16) are within ~16·2⁻²⁴ ≈ 1e-6 rad of the float64 ones, so the entries,
    # scaled by 0.028, within ~3e-8; a swapped sin/cos or a wrong frequency is off by ~1e-2.
    np.testing.assert_allclose(table, expected * scale, atol=1e-7)
    assert np.sqrt((table**2).mean()) == pytest.approx(config.initializer_range, rel=0.05)
    assert sinusoidal_positions(4, 5, 1.0).shape == (4, 5)  # an odd width


def test_warmup_fraction_scales_with_the_budget_and_decay_ends_at_it():
    lr = schedule(OptimizerConfig(learning_rate=1.0, warmup_fraction=0.25), 400)
    assert float(lr(0)) == 0 and float(lr(100)) == pytest.approx(1.0) and float(lr(50)) == pytest.approx(0.5)
    assert float(lr(400)) == pytest.approx(0.0, abs=1e-7) and float(lr(250)) == pytest.approx(0.5)
    same = schedule(OptimizerConfig(learning_rate=1.0, warmup_steps=100), 400)
    assert all(float(lr(s)) == float(same(s)) for s in range(0, 401, 25))
    with pytest.raises(UserError, match="not both"):
        OptimizerConfig(warmup_steps=10, warmup_fraction=0.1)
    with pytest.raises(UserError, match="warmup_fraction"):
        OptimizerConfig(warmup_fraction=1.5)


def test_pre_ln_matches_transformers_roberta_prelayernorm():
    """An independent implementation: transformers' RoBERTa-PreLayerNorm is the same pre-LN
    encoder (a LayerNorm before attention and before the feed-forward, one after the last layer)
    under other names. Its float64 outputs on our weights equal ours to float32 rounding; the
    positions are passed explicitly (RoBERTa's own start after the padding index)."""
    import torch
    import transformers

    config = small(layer_norm_position="pre")
    model = perturbed(bertjax.init_model(config, bertjax.BertModel, seed=0))
    flat = {".".join(map(str, path)): np.asarray(v.get_value(), np.float64)
            for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}  # fmt: skip
    theirs = (
        transformers.RobertaPreLayerNormModel(
            transformers.RobertaPreLayerNormConfig(
                vocab_size=config.vocab_size,
                hidden_size=config.hidden_size,
                num_hidden_layers=config.num_hidden_layers,
                num_attention_heads=config.num_attention_heads,
                intermediate_size=config.intermediate_size,
                max_position_embeddings=config.max_position_embeddings,
                type_vocab_size=config.type_vocab_size,
                layer_norm_eps=config.layer_norm_eps,
                hidden_act="gelu",
                pad_token_id=0,
            ),
            add_pooling_layer=False,
        )
        .double()
        .eval()
    )

    def linear(ours: str) -> dict[str, np.ndarray]:
        return {"weight": flat[f"{ours}.kernel"].T, "bias": flat[f"{ours}.bias"]}

    def norm(ours: str) -> dict[str, np.ndarray]:
        return {"weight": flat[f"{ours}.scale"], "bias": flat[f"{ours}.bias"]}

    tensors = {f"embeddings.{k}.weight": flat[f"embeddings.{k}.embedding"]
               for k in ("word_embeddings", "position_embeddings", "token_type_embeddings")}  # fmt: skip
    groups = {"embeddings.LayerNorm": norm("embeddings.LayerNorm"), "LayerNorm": norm("encoder.LayerNorm")}
    for i in range(config.num_hidden_layers):
        ours, hf = f"encoder.layer.{i}", f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            groups[f"{hf}.attention.self.{part}"] = linear(f"{ours}.attention.self.{part}")
        groups[f"{hf}.attention.output.dense"] = linear(f"{ours}.attention.output.dense")
        groups[f"{hf}.attention.LayerNorm"] = norm(f"{ours}.attention.output.LayerNorm")
        groups[f"{hf}.intermediate.dense"] = linear(f"{ours}.intermediate.dense")
        groups[f"{hf}.intermediate.LayerNorm"] = norm(f"{ours}.output.LayerNorm")
        groups[f"{hf}.output.dense"] = linear(f"{ours}.output.dense")
    tensors |= {f"{group}.{name}": value for group, values in groups.items() for name, value in values.items()}
    missing, unexpected = theirs.load_state_dict({k: torch.tensor(v) for k, v in tensors.items()}, strict=False)
    assert not unexpected and not [k for k in missing if "position_ids" not in k]

    rng = np.random.default_rng(0)
    ids = rng.integers(5, config.vocab_size, (3, 12))
    mask = np.ones_like(ids)
    mask[2, 8:] = 0
    types = np.zeros_like(ids)
    types[:, 6:] = 1
    positions = np.broadcast_to(np.arange(12), ids.shape)
    with torch.no_grad():
        reference = theirs(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                           token_type_ids=torch.tensor(types), position_ids=torch.tensor(positions)).last_hidden_state  # fmt: skip
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)).last_hidden_state)
    real = mask.astype(bool)
    # Outputs are LayerNorm'd (O(1)); float32 through 2 layers of sums of ≤ 64 terms: ~1e-6.
    np.testing.assert_allclose(ours[real], reference.numpy()[real], atol=ATOL)
