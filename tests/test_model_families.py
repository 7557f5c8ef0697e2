"""RoBERTa, ELECTRA and ModernBERT against transformers' PyTorch models, on tiny random models saved by
transformers itself: the loader, the attention probabilities and the hidden states.

The references run in float64 (their own rounding, ~2⁻⁵³, is negligible next to ours, 2⁻²⁴) with
eager attention, which hands back the probabilities. Weights are redrawn away from HF's init
(which has zero biases, unit LayerNorms and 0.02-scale matrices: near-uniform attention, where a
wrong position or band would hardly show): matrices N(0, 0.15), biases and LayerNorm offsets
N(0, 0.1), LayerNorm scales 1 + N(0, 0.1).
"""

from __future__ import annotations

import copy
import json

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import bertjax
from bertjax import modernbert

# Bounds, float32 (u = 2⁻²⁴ ≈ 6e-8) against the float64 reference. A K-term float32 sum errs by
# ~√K·u of its size (independent roundings add as a random walk): ≤ 6e-7 here (K ≤ 96). A layer
# chains four contractions (attention in and out, FFN in and out), and the random matrices
# (N(0, 0.15) over ≤ 96 inputs: gain 0.15·√K ≈ 1.2–1.5) and the LayerNorms pass an error on at
# about the scale of the values, so after L ≤ 4 layers the outputs (|h| ≤ 3.9, measured) are off by
# ~√16·6e-7·3.9 ≈ 1e-5: the bound leaves 10× for the constants. Measured: 1.1e-6 (RoBERTa), 9.6e-7
# (ELECTRA) and 4.7e-6 (ModernBERT), the same under XLA_FLAGS=--xla_cpu_max_isa=AVX2.
HIDDEN_BOUND = 1e-4
# A probability p = softmax(z) moves by ≤ 2p(1−p)·max|δz| ≤ max|δz|/2. The deepest scores (|z| ≤
# 7.1, measured) come through ≤ 13 contractions (√13·6e-7 ≈ 2e-6 relative) and RoPE's angles,
# each rounded once (≤ 40 positions · 2⁻²⁵ ≈ 1.2e-6 rad): |δz| ≲ 7.1·3e-6 ≈ 2e-5, |δp| ≲ 1e-5.
# Measured: 1.8e-7 (RoBERTa), 2.2e-7 (ELECTRA) and 1.1e-6 (ModernBERT).
ATTENTION_BOUND = 1e-5


def _redraw(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if p.ndim >= 2:
                p.copy_(noise * 0.15)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + noise * 0.1)
            else:
                p.copy_(noise * 0.1)


def _errors(out, reference, real: np.ndarray) -> tuple[float, float]:
    """The largest |ours − reference| over real-query × real-key attention cells and over the real
    tokens' hidden states (rows of padding queries are not part of any analysis)."""
    cells = real[:, None, :, None] & real[:, None, None, :]
    attention = max(
        np.abs(np.asarray(ours) - theirs.numpy())[np.broadcast_to(cells, ours.shape)].max()
        for ours, theirs in zip(out.attentions, reference.attentions, strict=True)
    )
    hidden = np.abs(np.asarray(out.last_hidden_state) - reference.last_hidden_state.numpy())[real].max()
    return float(attention), float(hidden)


def _report(what: str, attention: float, hidden: float) -> None:
    """The measured differences, for docs/model.md (`pytest -s` shows them)."""
    print(f"{what}: attention {attention:.2g}, hidden {hidden:.2g}")


def _forward(model, ids, mask, **kwargs):
    return jax.jit(lambda m, i, a: m(i, a, **kwargs))(model, ids, mask)


def _reference(torch_model, ids, mask):
    with torch.no_grad():
        return torch_model(torch.tensor(ids), attention_mask=torch.tensor(mask), output_attentions=True)


def _batch(rng: np.random.Generator, lengths, total: int, vocab: int, specials: int, pad: int):
    """Rows of random ids (none special) of `lengths`, padded with `pad` to `total`."""
    ids = np.full((len(lengths), total), pad, np.int64)
    mask = np.zeros((len(lengths), total), np.int64)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(specials, vocab, length)
        mask[row, :length] = 1
    return ids, mask


# --- RoBERTa ---------------------------------------------------------------------------------

ROBERTA = dict(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=3, intermediate_size=96,
               max_position_embeddings=50, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    """(directory of a RobertaForMaskedLM saved by transformers, the float64 torch model)."""
    torch_model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**ROBERTA, attn_implementation="eager"))
    _redraw(torch_model, seed=0)
    directory = tmp_path_factory.mktemp("roberta")
    torch_model.save_pretrained(directory)
    return directory, torch_model.eval().double()


@pytest.fixture(scope="module")
def roberta_batch():
    """`<s> A </s></s> B </s>` rows, as RoBERTa's tokenizer lays out a pair, padded with <pad> (1);
    the longest fills the 48 positions the 50-row table leaves after the offset of 2."""
    ids, mask = _batch(np.random.default_rng(1), (48, 31, 9), 48, 120, specials=3, pad=1)
    for row, (a, b) in enumerate(((20, 24), (12, 15), (3, 2))):
        ids[row, [0, a + 1, a + 2, a + b + 3]] = [0, 2, 2, 2]
    return ids, mask


def test_roberta_matches_transformers(roberta, roberta_batch):
    directory, reference = roberta
    model = bertjax.from_pretrained(directory)
    ids, mask = roberta_batch
    out = _forward(model, ids, mask, output_attentions=True)
    attention, hidden = _errors(out, _reference(reference.roberta, ids, mask), mask.astype(bool))
    _report("RoBERTa", attention, hidden)
    assert attention <= ATTENTION_BOUND and hidden <= HIDDEN_BOUND  # measured 1.8e-7 and 1.1e-6


def test_roberta_mlm_head_matches_transformers(roberta, roberta_batch):
    """RoBERTa's lm_head is read as BERT's MLM head (BertForPreTraining; its NSP head, which
    RoBERTa has none of, is initialised). The logits are one 48-term contraction and a LayerNorm
    past the hidden states: within the hidden bound (measured 1.3e-6)."""
    directory, reference = roberta
    model = bertjax.from_pretrained(directory, "BertForPreTraining")
    ids, mask = roberta_batch
    logits = jax.jit(lambda m, i, a: m(i, a).prediction_logits)(model, ids, mask)
    with torch.no_grad():
        expected = reference(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    error = np.abs(np.asarray(logits) - expected)[mask.astype(bool)].max()
    print(f"RoBERTa MLM logits: {error:.2g}")
    assert error <= HIDDEN_BOUND


def test_the_gradient_analysis_finds_robertas_mlm_head(roberta, modern):
    """analysis.clark's gradients need a trained MLM head: RoBERTa's lm_head is one, and ModernBERT's
    head is not modelled here."""
    from analysis.attention.gradients import has_mlm_head
    from bertjax.pretrained import open_checkpoint

    assert has_mlm_head(open_checkpoint(roberta[0])) and not has_mlm_head(open_checkpoint(modern[0]))


def test_roberta_numbers_positions_whatever_id_pads_the_batch(roberta, roberta_batch):
    """bertjax's batches pad with id 0 (RoBERTa's <s>); HF numbers a position as padding by the
    <pad> id alone. The real tokens see the same positions either way."""
    model = bertjax.from_pretrained(roberta[0])
    ids, mask = roberta_batch
    padded_with_zero = np.where(mask.astype(bool), ids, 0)
    real = mask.astype(bool)
    ours = _forward(model, padded_with_zero, mask).last_hidden_state
    theirs = _forward(model, ids, mask).last_hidden_state
    np.testing.assert_array_equal(np.asarray(ours)[real], np.asarray(theirs)[real])


def test_roberta_without_the_position_offset_fails_the_bounds(roberta, roberta_batch):
    """Planted defect: BERT's numbering 0 … T-1 (no padding_idx + 1 offset)."""
    directory, reference = roberta
    model = bertjax.from_pretrained(directory)
    ids, mask = roberta_batch
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    out = jax.jit(lambda m, i, a, p: m(i, a, position_ids=p, output_attentions=True))(model, ids, mask, positions)
    attention, hidden = _errors(out, _reference(reference.roberta, ids, mask), mask.astype(bool))
    _report("RoBERTa without the position offset", attention, hidden)
    assert attention > ATTENTION_BOUND and hidden > HIDDEN_BOUND  # measured 0.51 and 1.1


def test_roberta_reads_a_weights_only_pytorch_bin(roberta, tmp_path):
    """A `pytorch_model.bin` state dict (old checkpoints; `roberta.` prefixes, the tied decoder
    stored twice) loads the same parameters as the safetensors."""
    directory, reference = roberta
    state = {k: v.float() for k, v in reference.state_dict().items()}
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    # The pooler and the NSP head, which RobertaForMaskedLM lacks, come from the same seed.
    from_bin = nnx.to_flat_state(nnx.state(bertjax.from_pretrained(tmp_path, "BertForPreTraining")))
    from_safetensors = dict(nnx.to_flat_state(nnx.state(bertjax.from_pretrained(directory, "BertForPreTraining"))))
    for path, value in from_bin:
        np.testing.assert_array_equal(value.get_value(), from_safetensors[path].get_value(), err_msg=str(path))


def test_roberta_config_round_trips(roberta):
    config = bertjax.from_pretrained(roberta[0]).config
    assert (config.model_type, config.pad_token_id, config.type_vocab_size) == ("roberta", 1, 1)
    written = config.to_hf_dict()
    assert written["architectures"] == ["RobertaModel"] and "layer_types" not in written
    assert bertjax.BertConfig.from_hf_dict(json.loads(json.dumps(written))) == config


def test_roberta_refuses_sequences_past_its_offset_table(roberta):
    model = bertjax.from_pretrained(roberta[0])
    assert model.config.max_sequence_length == 48
    ids = np.zeros((1, 49), np.int32)
    with pytest.raises(bertjax.UserError, match=r"^sequences of 49 tokens exceed the model's 48 positions"):
        model(ids)


def test_roberta_ignores_segment_ids(roberta, roberta_batch):
    """One token type: segment ids that a caller derives from the separators change nothing."""
    model = bertjax.from_pretrained(roberta[0])
    ids, mask = roberta_batch
    assert not model.config.has_token_types
    segments = np.cumsum(ids == 2, axis=1) >= 2
    forward = jax.jit(lambda m, i, a, t: m(i, a, t).last_hidden_state)
    plain = forward(model, ids, mask, np.zeros_like(ids))
    np.testing.assert_array_equal(forward(model, ids, mask, segments.astype(np.int32)), plain)


# --- ELECTRA (the discriminator's encoder) -------------------------------------------------------

ELECTRA = dict(vocab_size=120, embedding_size=32, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
               intermediate_size=96, max_position_embeddings=48, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0)  # fmt: skip


@pytest.fixture(scope="module")
def electra(tmp_path_factory):
    """(directory of an ElectraForPreTraining saved by transformers, its float64 ElectraModel)."""
    torch_model = transformers.ElectraForPreTraining(transformers.ElectraConfig(**ELECTRA, attn_implementation="eager"))
    _redraw(torch_model, seed=0)
    directory = tmp_path_factory.mktemp("electra")
    torch_model.save_pretrained(directory)
    return directory, torch_model.eval().double().electra


def _electra_errors(model, reference):
    ids, mask = _batch(np.random.default_rng(3), (48, 30, 7), 48, 120, specials=3, pad=0)
    segments = (np.arange(48)[None] >= np.array([[20], [12], [3]])).astype(np.int64) * mask
    out = jax.jit(lambda m, i, a, t: m(i, a, t, output_attentions=True))(model, ids, mask, segments)
    with torch.no_grad():
        expected = reference(
            torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(segments),
            output_attentions=True,
        )  # fmt: skip
    return _errors(out, expected, mask.astype(bool))


def test_electra_matches_transformers(electra):
    """BERT's layers behind a projection of narrower embeddings (32 → 48), with no pooler."""
    model = bertjax.from_pretrained(electra[0])
    assert model.pooler is None and model.config.embedding_size == 32
    attention, hidden = _electra_errors(model, electra[1])
    _report("ELECTRA", attention, hidden)
    assert attention <= ATTENTION_BOUND and hidden <= HIDDEN_BOUND  # measured 2.2e-7 and 9.6e-7


def test_electra_without_its_projection_bias_fails_the_bounds(electra):
    """Planted defect: the loader dropping embeddings_project.bias."""
    model = bertjax.from_pretrained(electra[0])
    model.embeddings_project.bias.set_value(np.zeros(48, np.float32))
    attention, hidden = _electra_errors(model, electra[1])
    _report("ELECTRA without its projection bias", attention, hidden)
    assert attention > ATTENTION_BOUND and hidden > HIDDEN_BOUND  # measured 0.053 and 0.83


def test_electra_has_only_its_encoder(electra):
    with pytest.raises(bertjax.UserError, match=r"^BertForPreTraining is not available for model_type 'electra'"):
        bertjax.from_pretrained(electra[0], "BertForPreTraining")
    config = bertjax.from_pretrained(electra[0]).config
    assert bertjax.BertConfig.from_hf_dict(json.loads(json.dumps(config.to_hf_dict()))) == config


# --- ModernBERT ------------------------------------------------------------------------------

# Layers 0 and 3 global, 1 and 2 local with a band of ±8 over sequences of up to 40 tokens.
MODERNBERT = dict(vocab_size=120, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  max_position_embeddings=64, local_attention=16, global_attn_every_n_layers=3,
                  global_rope_theta=160_000.0, local_rope_theta=10_000.0, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, cls_token_id=1, sep_token_id=2)  # fmt: skip


@pytest.fixture(scope="module")
def modern(tmp_path_factory):
    """(directory of a ModernBertForMaskedLM saved by transformers, its float64 ModernBertModel)."""
    torch_model = transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(**MODERNBERT, attn_implementation="eager")
    )
    _redraw(torch_model, seed=0)
    directory = tmp_path_factory.mktemp("modernbert")
    torch_model.save_pretrained(directory)
    return directory, torch_model.eval().double().model


@pytest.fixture(scope="module")
def modern_batch():
    """[CLS] … [SEP] rows of 40, 27 and 6 tokens, padded with <pad> (0): longer than the band of 17."""
    ids, mask = _batch(np.random.default_rng(2), (40, 27, 6), 40, 120, specials=3, pad=0)
    for row, length in enumerate((40, 27, 6)):
        ids[row, [0, length - 1]] = [1, 2]
    return ids, mask


@pytest.fixture(scope="module")
def modern_model(modern):
    return bertjax.from_pretrained(modern[0])


@pytest.fixture(scope="module")
def modern_reference(modern, modern_batch):
    """transformers' outputs for each row alone, unpadded. Its eager attention on the padded batch
    is no reference: a padding query with no real key in its band (here the short rows' tail)
    softmaxes over nothing, its NaN row is a value vector of the next layer, and 0·NaN makes every
    token of that sequence NaN (transformers 5.23; sdpa is finite but returns no probabilities).
    The unpadded rows are what a padded batch must reproduce anyway."""
    ids, mask = modern_batch
    return [_reference(modern[1], ids[row : row + 1, :n], mask[row : row + 1, :n]) for row, n in enumerate(mask.sum(1))]


def _errors_by_row(out, references, mask) -> tuple[float, float]:
    """`_errors` against one unpadded reference per row."""
    errors = []
    for row, (reference, n) in enumerate(zip(references, mask.sum(1), strict=True)):
        ours = type(out)(
            last_hidden_state=out.last_hidden_state[row : row + 1, :n],
            pooler_output=None,
            attentions=tuple(a[row : row + 1, :, :n, :n] for a in out.attentions),
        )
        errors.append(_errors(ours, reference, np.ones((1, n), bool)))
    return max(a for a, _ in errors), max(h for _, h in errors)


def test_modernbert_matches_transformers(modern_model, modern_batch, modern_reference):
    assert type(modern_model).__name__ == "ModernBertModel"
    assert modern_model.config.layer_types == (
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    )
    ids, mask = modern_batch
    out = _forward(modern_model, ids, mask, output_attentions=True)
    attention, hidden = _errors_by_row(out, modern_reference, mask)
    _report("ModernBERT", attention, hidden)
    assert attention <= ATTENTION_BOUND and hidden <= HIDDEN_BOUND  # measured 1.1e-6 and 4.7e-6


def test_modernbert_local_layers_attend_within_their_band_only(modern_model, modern_batch):
    """The captured matrix of a local layer is the full T × T one, zero outside |q − k| ≤ 8, and
    disabling one of its heads spreads it uniformly over the band's real keys."""
    ids, mask = modern_batch
    disable = np.zeros((4, 4), bool)
    disable[1, 2] = True
    out = _forward(modern_model, ids, mask, output_attentions=True, disable_heads=disable)
    real = mask.astype(bool)
    distance = np.abs(np.arange(40)[:, None] - np.arange(40)[None, :])
    allowed = (distance <= 8)[None] & real[:, None, :]
    for layer in (1, 2):
        rows = np.asarray(out.attentions[layer])  # [B, H, T, T]
        outside = ~np.broadcast_to(allowed[:, None], rows.shape)
        assert (rows[np.broadcast_to(real[:, None, :, None], rows.shape) & outside] == 0).all()
        np.testing.assert_allclose(rows.sum(-1)[np.broadcast_to(real[:, None, :], rows.shape[:3])], 1, atol=1e-6)
    uniform = (allowed / np.maximum(allowed.sum(-1, keepdims=True), 1)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out.attentions[1])[:, 2][real], uniform[real])
    global_rows = np.asarray(out.attentions[0])[0, :, 0]  # [CLS] of the 40-token row, in a global layer
    assert (global_rows[:, 9:] > 0).all()


def test_modernbert_padded_batch_matches_transformers_sdpa(modern, modern_model, modern_batch):
    """transformers' default attention (sdpa) on the same padded batch: the hidden states of the
    real tokens agree as the unpadded rows' do (sdpa returns no probabilities)."""
    sdpa = copy.deepcopy(modern[1])
    sdpa.set_attn_implementation("sdpa")
    ids, mask = modern_batch
    with torch.no_grad():
        expected = sdpa(torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    ours = _forward(modern_model, ids, mask).last_hidden_state
    assert np.abs(np.asarray(ours) - expected)[mask.astype(bool)].max() <= HIDDEN_BOUND


def test_modernbert_fused_attention_path_equals_explicit_path(modern_model, modern_batch):
    """Without output_attentions the band goes to jax.nn.dot_product_attention as a mask, and a
    head mask (the ablations' input) scales the heads' outputs instead of their probabilities."""
    ids, mask = modern_batch
    head_mask = np.ones((4, 4), np.float32)
    head_mask[1, 0] = head_mask[3, 2] = 0.0
    head_mask[2, 1] = 0.5
    explicit = _forward(modern_model, ids, mask, output_attentions=True, head_mask=head_mask).last_hidden_state
    fused = _forward(modern_model, ids, mask, head_mask=head_mask).last_hidden_state
    unmasked = _forward(modern_model, ids, mask).last_hidden_state
    real = mask.astype(bool)
    # Two float32 orders of the same sums: within the parity bound's random walk (measured 2.8e-6).
    assert np.abs(np.asarray(fused) - np.asarray(explicit))[real].max() <= HIDDEN_BOUND
    assert np.abs(np.asarray(fused) - np.asarray(unmasked))[real].max() > 0.01


def _without_rope(monkeypatch, model):
    monkeypatch.setattr(modernbert, "rotate", lambda x, cos, sin: x)
    return model


def _global_everywhere(monkeypatch, model):
    config = model.config.replace(layer_types=("full_attention",) * 4)
    return _same_weights(model, config)


def _with_a_bias(monkeypatch, model):
    """LayerNorms with a bias (norm_bias true) of 0.01: HF's ModernBERT has none."""
    wrong = _same_weights(model, model.config.replace(norm_bias=True))
    for path, variable in nnx.to_flat_state(nnx.state(wrong, nnx.Param)):
        if path[-1] == "bias":
            variable.set_value(variable.get_value() + 0.01)
    return wrong


def _geglu_halves_swapped(monkeypatch, model):
    wrong = nnx.clone(model)
    for layer in wrong.layers:
        kernel = layer.mlp.Wi.kernel[...]
        layer.mlp.Wi.kernel.set_value(np.concatenate(np.split(np.asarray(kernel), 2, axis=-1)[::-1], axis=-1))
    return wrong


def _same_weights(model, config):
    wrong = modernbert.ModernBertModel(config, rngs=nnx.Rngs(0))
    ours = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for path, variable in nnx.to_flat_state(nnx.state(wrong, nnx.Param)):
        if path in ours:
            variable.set_value(ours[path].get_value())
    return wrong


@pytest.mark.parametrize("plant", [_without_rope, _global_everywhere, _with_a_bias, _geglu_halves_swapped])
def test_modernbert_planted_defects_fail_the_bounds(plant, monkeypatch, modern_model, modern_batch, modern_reference):
    """Measured (attention, hidden): no RoPE (0.92, 3.4); global attention in the local layers
    (0.88, 3.2); a 0.01 LayerNorm bias (0.063, 0.27); GeGLU's halves swapped (0.92, 4.7)."""
    ids, mask = modern_batch
    out = _forward(plant(monkeypatch, modern_model), ids, mask, output_attentions=True)
    attention, hidden = _errors_by_row(out, modern_reference, mask)
    _report(f"ModernBERT {plant.__name__.strip('_').replace('_', ' ')}", attention, hidden)
    assert attention > ATTENTION_BOUND and hidden > HIDDEN_BOUND


def test_modernbert_reads_both_config_spellings():
    """transformers ≥ 5 writes layer_types and rope_parameters; the hub's checkpoints (Ettin,
    ModernBERT-base) global_attn_every_n_layers and global/local_rope_theta."""
    old = {"model_type": "modernbert", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 64, "vocab_size": 120, "global_attn_every_n_layers": 3, "global_rope_theta": 8e4,
           "local_rope_theta": 1e4, "local_attention": 16, "hidden_activation": "gelu", "norm_eps": 1e-5,
           "pad_token_id": 0}  # fmt: skip
    new = {**{k: v for k, v in old.items() if not k.endswith(("_theta", "_n_layers"))},
           "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
           "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 8e4},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}  # fmt: skip
    config = bertjax.BertConfig.from_hf_dict(old)
    assert config == bertjax.BertConfig.from_hf_dict(new)
    assert (config.global_rope_theta, config.local_rope_theta, config.type_vocab_size) == (8e4, 1e4, 1)
    assert not config.has_token_types
    assert bertjax.BertConfig.from_hf_dict(json.loads(json.dumps(config.to_hf_dict()))) == config
    with pytest.raises(bertjax.UserError, match=r"^c\.json: rope_type 'linear' \(full_attention\) is not supported"):
        scaled = {**new, "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}
        bertjax.BertConfig.from_hf_dict(scaled, source="c.json")
    with pytest.raises(bertjax.UserError, match=r"^c\.json: layer_types must list one of"):
        bertjax.BertConfig.from_hf_dict({**new, "layer_types": ["full_attention"]}, source="c.json")


def test_modernbert_has_only_its_encoder(modern, modern_model, tmp_path):
    with pytest.raises(
        bertjax.UserError,
        match=r"^BertForPreTraining is not available for model_type 'modernbert': bertjax has its encoder only",
    ):
        bertjax.from_pretrained(modern[0], "BertForPreTraining")
    with pytest.raises(bertjax.UserError, match=r"writes HF's format for BERT only, not model_type 'modernbert'$"):
        bertjax.save_pretrained(modern_model, tmp_path)


def test_other_families_are_refused_in_one_line():
    with pytest.raises(
        bertjax.UserError, match=r"^c\.json: model_type 'distilbert' is not one of bert, roberta, electra, modernbert$"
    ):
        bertjax.BertConfig.from_hf_dict({"model_type": "distilbert"}, source="c.json")
