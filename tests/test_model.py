"""The Flax BERT against HF transformers' PyTorch BERT, and checkpoint conversion both ways."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers
from flax import nnx

import bertjax
from bertjax import checkpoint as ckpt


@pytest.fixture(scope="module")
def mrpc_pairs(shared_data):
    """The first 8 sentence pairs of the real MRPC dev set."""
    with open(shared_data / "glue/MRPC/dev.tsv", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:9]
    return [r[3] for r in rows], [r[4] for r in rows]


@pytest.fixture(scope="module")
def minilm_batch(minilm_path, mrpc_pairs):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path))
    batch = tokenizer(*mrpc_pairs, padding=True, return_tensors="np")
    assert batch["attention_mask"].min() == 0, "the batch must contain padding"
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def torch_minilm_out(minilm_path, minilm_batch):
    model = transformers.BertModel.from_pretrained(str(minilm_path), attn_implementation="eager").eval()
    with torch.no_grad():
        return model(**{k: torch.tensor(v) for k, v in minilm_batch.items()}, output_attentions=True)


@pytest.fixture(scope="module")
def torch_minilm_out64(minilm_path, minilm_batch):
    """The float64 reference: its own rounding (~2⁻⁵³) is negligible next to ours (2⁻²⁴)."""
    model = transformers.BertModel.from_pretrained(str(minilm_path), attn_implementation="eager").eval().double()
    with torch.no_grad():
        return model(**{k: torch.tensor(v) for k, v in minilm_batch.items()}, output_attentions=True)


# float32 rounding (u = 2⁻²⁴) through L = 6 layers whose longest contraction is K = 1536 terms
# (the FFN), on hidden values |h| ≤ 6.1: rounding errors add as a random walk, √K·u per
# contraction, so L·√K·u·|h| ≈ 8.4e-5 ≤ 1e-4 (measured 2.6e-6 on AVX-512, AVX2 and SSE4.2).
HIDDEN_BOUND = 1e-4
# A weight p = softmax(z) moves by ≤ 2p·|δz|, and z is a 32-term dot product (/√32) of projections
# of inputs within the previous layer's bound: ~10× smaller than the hidden bound (measured 2.4e-6).
ATTENTION_BOUND = 1e-5


def _parity_errors(out, reference, real):
    """The largest |ours − reference| over real-query × real-key attention cells, and over the real
    tokens' hidden states (rows of padding queries are not part of any analysis)."""
    cells = real[:, None, :, None] & real[:, None, None, :]
    attention = max(
        np.abs(np.asarray(ours) - theirs.numpy())[np.broadcast_to(cells, ours.shape)].max()
        for ours, theirs in zip(out.attentions, reference.attentions, strict=True)
    )
    hidden = np.abs(np.asarray(out.last_hidden_state) - reference.last_hidden_state.numpy())[real].max()
    return attention, hidden


def _forward(model, batch, **kwargs):
    return jax.jit(lambda m, b: m(**b, **kwargs))(model, batch)


def test_minilm_matches_transformers_on_real_pairs(minilm, minilm_batch, torch_minilm_out64):
    out = _forward(minilm, minilm_batch, output_attentions=True)
    real = minilm_batch["attention_mask"].astype(bool)
    assert len(out.attentions) == 6 and out.attentions[0].shape == (8, 12) + real.shape[1:] * 2
    attention, hidden = _parity_errors(out, torch_minilm_out64, real)
    assert attention <= ATTENTION_BOUND and hidden <= HIDDEN_BOUND
    # The pooler is one 384-term contraction and a tanh (|f'| ≤ 1) on top of the hidden bound.
    assert np.abs(np.asarray(out.pooler_output) - torch_minilm_out64.pooler_output.numpy()).max() <= HIDDEN_BOUND


def test_the_parity_bounds_catch_attention_scaled_by_one_over_d(minilm, minilm_batch, torch_minilm_out64):
    """Planted bug: scores q·k/d instead of q·k/√d (the query shrunk by √d) fail both bounds above."""
    wrong = nnx.clone(minilm)
    root_d = minilm.config.head_dim**0.5
    for layer in wrong.encoder.layer:
        query = layer.attention.self.query
        query.kernel.set_value(query.kernel[...] / root_d)
        query.bias.set_value(query.bias[...] / root_d)
    out = _forward(wrong, minilm_batch, output_attentions=True)
    attention, hidden = _parity_errors(out, torch_minilm_out64, minilm_batch["attention_mask"].astype(bool))
    assert attention > ATTENTION_BOUND and hidden > HIDDEN_BOUND  # measured 0.93 and 2.1


def test_fused_attention_path_equals_explicit_path(minilm, minilm_batch):
    explicit = _forward(minilm, minilm_batch, output_attentions=True)
    fused = _forward(minilm, minilm_batch)
    assert fused.attentions is None
    real = minilm_batch["attention_mask"].astype(bool)
    diff = np.abs(np.asarray(fused.last_hidden_state) - np.asarray(explicit.last_hidden_state))
    # Two float32 orders of the same sums: within the parity bound's random walk (measured 1.9e-6).
    assert diff[real].max() <= HIDDEN_BOUND


def test_save_pretrained_opens_in_transformers(minilm, minilm_batch, torch_minilm_out, tmp_path):
    bertjax.save_pretrained(minilm, tmp_path)
    reloaded = transformers.BertModel.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    with torch.no_grad():
        out = reloaded(**{k: torch.tensor(v) for k, v in minilm_batch.items()})
    np.testing.assert_array_equal(out.last_hidden_state.numpy(), torch_minilm_out.last_hidden_state.numpy())


def test_import_export_import_is_bit_identical(minilm, tmp_path):
    bertjax.save_pretrained(minilm, tmp_path)
    again = bertjax.from_pretrained(tmp_path)
    first = ckpt.flatten_params(nnx.state(minilm, nnx.Param))
    second = ckpt.flatten_params(nnx.state(again, nnx.Param))
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(np.asarray(first[key]), np.asarray(second[key]), err_msg=key)


# The tiny model's hidden states: L = 2 layers, K ≤ 512 terms, |h| ≤ 4.2, so L·√K·u·|h| ≈ 1.1e-5,
# and the heads (two 128-term contractions and a LayerNorm) end in logits ≤ 1.1 (measured 2.8e-7).
TINY_BOUND = 2e-5


@pytest.fixture(scope="module")
def tiny_pretraining():
    config = bertjax.preset("tiny", vocab_size=211, max_position_embeddings=64)
    return bertjax.init_model(config, bertjax.BertForPreTraining, seed=3)


def _random_batch(vocab_size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = np.array([16, 11, 7])
    ids = rng.integers(5, vocab_size, size=(3, 16))
    mask = (np.arange(16)[None] < lengths[:, None]).astype(np.int64)
    types = ((np.arange(16)[None] >= lengths[:, None] // 2) & mask.astype(bool)).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}


def test_pretraining_heads_match_transformers(tiny_pretraining, tmp_path):
    bertjax.save_pretrained(tiny_pretraining, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    theirs = transformers.BertForPreTraining.from_pretrained(str(tmp_path), attn_implementation="eager")
    theirs = theirs.eval().double()  # the float64 reference
    batch = _random_batch(211)
    ours = _forward(tiny_pretraining, batch)
    with torch.no_grad():
        ref = theirs(**{k: torch.tensor(v) for k, v in batch.items()})
    real = batch["attention_mask"].astype(bool)
    mlm = np.abs(np.asarray(ours.prediction_logits) - ref.prediction_logits.numpy())
    assert mlm[real].max() <= TINY_BOUND
    np.testing.assert_allclose(
        ours.seq_relationship_logits, ref.seq_relationship_logits.numpy(), atol=TINY_BOUND, rtol=0
    )


def test_mlm_logits_only_at_masked_positions(tiny_pretraining):
    batch = _random_batch(211)
    positions = np.array([[1, 5, 9], [2, 3, 0], [6, 1, 1]])
    full = _forward(tiny_pretraining, batch)
    gathered = _forward(tiny_pretraining, {**batch, "masked_positions": positions})
    assert gathered.prediction_logits.shape == (3, 3, 211)
    expected = np.take_along_axis(np.asarray(full.prediction_logits), positions[..., None], axis=1)
    # The same rows through the same head in another fusion: three contractions of ≤ 128 terms on
    # logits ≤ 1.1, 3·√128·u·1.1 ≈ 2.2e-6 (measured 1.2e-7); a wrong row is O(1) away.
    np.testing.assert_allclose(gathered.prediction_logits, expected, atol=3e-6, rtol=0)


def test_head_mask_zeroes_the_heads_contribution(tiny_pretraining):
    """ξ_h = 0 must equal a model whose head h has zero value vectors (so it adds nothing)."""
    encoder = tiny_pretraining.bert
    batch = _random_batch(211)
    layer, head, head_dim = 1, 0, encoder.config.head_dim
    head_mask = jnp.ones((2, 2)).at[layer, head].set(0.0)
    ablated = nnx.clone(encoder)
    value = ablated.encoder.layer[layer].attention.self.value
    cols = slice(head * head_dim, (head + 1) * head_dim)
    value.kernel.set_value(value.kernel[...].at[:, cols].set(0.0))
    value.bias.set_value(value.bias[...].at[cols].set(0.0))
    reference = _forward(ablated, batch).last_hidden_state
    real = batch["attention_mask"].astype(bool)
    for output_attentions in (False, True):  # the fused and the explicit attention path
        out = _forward(encoder, batch, head_mask=head_mask, output_attentions=output_attentions)
        np.testing.assert_allclose(
            np.asarray(out.last_hidden_state)[real], np.asarray(reference)[real], atol=TINY_BOUND
        )
    assert float(jnp.abs(out.attentions[layer][:, head]).max()) == 0.0
    unmasked = _forward(encoder, batch).last_hidden_state
    assert np.abs(np.asarray(unmasked) - np.asarray(reference))[real].max() > 100 * TINY_BOUND


def test_disabled_head_attends_uniformly_over_real_tokens(tiny_pretraining):
    batch = _random_batch(211)
    disable = jnp.zeros((2, 2), bool).at[0, 1].set(True)
    out = _forward(tiny_pretraining.bert, batch, disable_heads=disable, output_attentions=True)
    probs = np.asarray(out.attentions[0][:, 1])  # [B, T, T]
    mask = batch["attention_mask"]
    expected = mask[:, None, :] / mask.sum(-1)[:, None, None]
    np.testing.assert_array_equal(probs, np.broadcast_to(expected, probs.shape).astype(np.float32))
    assert not np.allclose(np.asarray(out.attentions[0][:, 0]), probs)
    # A row of padding only (a filler row of a short batch) stays finite. Eager: under jit, XLA
    # happened to hide the 0/0 this once gave.
    batch["attention_mask"] = mask * (np.arange(len(mask)) != 0)[:, None]
    out = tiny_pretraining.bert(**batch, disable_heads=disable)
    assert np.isfinite(np.asarray(out.last_hidden_state)).all()


def test_orbax_checkpoint_loads_params_alone(tiny_pretraining, tmp_path):
    manager = ocp.CheckpointManager(tmp_path / ckpt.CHECKPOINTS, item_names=(ckpt.PARAMS, ckpt.META))
    params = ckpt.flatten_params(nnx.state(tiny_pretraining, nnx.Param))
    meta = ckpt.make_meta(tiny_pretraining, tokenizer="tokenizer", run_config={"seed": 3})
    for step in (10, 20):
        manager.save(step, args=ocp.args.Composite(**ckpt.save_args(params, meta)))
    manager.wait_until_finished()
    encoder = bertjax.from_pretrained(tmp_path)  # the latest step, as the bare encoder
    np.testing.assert_array_equal(
        encoder.embeddings.word_embeddings.embedding[...],
        tiny_pretraining.bert.embeddings.word_embeddings.embedding[...],
    )
    headed = bertjax.from_pretrained(tmp_path / ckpt.CHECKPOINTS, bertjax.BertForPreTraining, step=10)
    np.testing.assert_array_equal(headed.cls.predictions.bias[...], tiny_pretraining.cls.predictions.bias[...])
    bf16 = bertjax.from_pretrained(tmp_path, param_dtype="bfloat16")
    assert bf16.embeddings.word_embeddings.embedding[...].dtype == jnp.bfloat16
    with pytest.raises(bertjax.UserError, match=r"no checkpoint for step 15; available: \[10, 20\]"):
        bertjax.from_pretrained(tmp_path, step=15)


def test_new_task_head_is_initialised_and_encoder_kept(minilm_path, minilm):
    classifier = bertjax.from_pretrained(minilm_path, "BertForSequenceClassification", num_labels=3)
    assert classifier.classifier.kernel.shape == (384, 3)
    np.testing.assert_array_equal(
        classifier.bert.encoder.layer[5].output.dense.kernel[...], minilm.encoder.layer[5].output.dense.kernel[...]
    )
    with pytest.raises(
        bertjax.UserError,
        match=r"tensor classifier\.(weight|bias) is missing: this analysis needs a fine-tuned task head",
    ):
        bertjax.from_pretrained(minilm_path, "BertForSequenceClassification", trained_heads=True)


def _write_tiny_hf(directory, tensors_edit):
    from safetensors.numpy import load_file, save_file

    model = bertjax.init_model(bertjax.preset("tiny", vocab_size=50, max_position_embeddings=32))
    bertjax.save_pretrained(model, directory)
    tensors = load_file(directory / "model.safetensors")
    tensors_edit(tensors)
    save_file(tensors, directory / "model.safetensors")


def test_loads_of_one_architecture_share_its_traced_shapes_and_keep_their_own_weights(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    _write_tiny_hf(first, lambda t: None)
    _write_tiny_hf(second, lambda t: t.update({k: v + 1 for k, v in t.items()}))
    hits = bertjax.pretrained.abstract_model.cache_info().hits
    a, b = bertjax.from_pretrained(first), bertjax.from_pretrained(second)
    assert bertjax.pretrained.abstract_model.cache_info().hits >= hits + 1
    for (path, x), (_, y) in zip(nnx.to_flat_state(nnx.state(a)), nnx.to_flat_state(nnx.state(b)), strict=True):
        np.testing.assert_array_equal(np.asarray(y[...]), np.asarray(x[...]) + 1, err_msg=str(path))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.pop("encoder.layer.1.output.dense.weight"),
            r"tensor encoder\.layer\.1\.output\.dense\.weight is missing",
        ),
        (
            lambda t: t.update({"embeddings.word_embeddings.weight": np.zeros((49, 128), np.float32)}),
            r"tensor embeddings\.word_embeddings\.weight has shape \[49, 128\], the config's vocab_size and width need \[50, 128\]",
        ),
        (
            lambda t: t.update({"encoder.layer.1.output.dense.scale": np.zeros(128, np.float32)}),
            r"tensor encoder\.layer\.1\.output\.dense\.scale is not part of a BERT with this config",
        ),
    ],
)
def test_bad_checkpoint_names_the_tensor_and_file(tmp_path, edit, message):
    _write_tiny_hf(tmp_path, edit)
    with pytest.raises(bertjax.UserError, match=message) as error:
        bertjax.from_pretrained(tmp_path)
    assert str(tmp_path / "model.safetensors") in str(error.value)
    assert "\n" not in str(error.value)


def test_cli_reports_a_user_error_in_one_line(tmp_path):
    _write_tiny_hf(tmp_path, lambda t: t.pop("encoder.layer.0.output.dense.bias"))
    result = subprocess.run(
        [sys.executable, "-m", "bertjax", "--ckpt", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'model.safetensors'}: tensor encoder.layer.0.output.dense.bias is missing"
    )


def test_a_checkpoint_without_a_pooler_loads_with_an_initialised_one(tmp_path, caplog):
    # What HF's BertForMaskedLM saves (add_pooling_layer=False): analyses never read the pooler.
    _write_tiny_hf(tmp_path, lambda t: [t.pop(k) for k in ("pooler.dense.weight", "pooler.dense.bias")])
    assert bertjax.from_pretrained(tmp_path).pooler.dense.kernel.shape == (128, 128)
    assert "initialising pooler.dense" in caplog.text
    with pytest.raises(bertjax.UserError, match=r"tensor pooler\.dense\.\w+ is missing: this analysis needs"):
        bertjax.from_pretrained(tmp_path, "BertForSequenceClassification", trained_heads=True)


def test_a_checkpoint_needs_its_own_tokenizer(tmp_path, shared_data):
    from transformers import BertTokenizerFast

    _write_tiny_hf(tmp_path, lambda t: None)  # weights and config only, as save_pretrained writes
    with pytest.raises(bertjax.UserError, match=r"no tokenizer \(tokenizer\.json or vocab\.txt\)"):
        bertjax.load_tokenizer(tmp_path)
    # A real vocabulary of 30,522 tokens beside a 50-token model: ids past the table would be NaN.
    BertTokenizerFast(vocab=str(shared_data / "vocab" / "bert-base-uncased-vocab.txt")).save_pretrained(tmp_path)
    with pytest.raises(bertjax.UserError, match=r"the tokenizer has 30522 tokens but the model's vocab_size is 50"):
        bertjax.load_tokenizer(tmp_path)


def test_a_hub_repo_without_safetensors_is_fetched_with_its_torch_weights(monkeypatch, tmp_path):
    """Config and tokenizer first (the revision resolved to a commit), then the weights at that
    commit: safetensors, else pytorch_model.bin."""
    import huggingface_hub

    calls = []
    snapshot = tmp_path / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)

    def snapshot_download(repo_id, revision, allow_patterns):
        calls.append((revision, list(allow_patterns)))
        return str(snapshot)  # a snapshot with no *.safetensors

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    source = bertjax.pretrained.open_checkpoint("someone/bert-bin-only#step20")
    assert (source.path, source.repo_id, source.commit) == (snapshot, "someone/bert-bin-only", "c" * 40)
    pretrained = bertjax.pretrained
    assert calls == [
        ("step20", pretrained.HUB_FILES),
        ("c" * 40, pretrained.HUB_WEIGHTS),
        ("c" * 40, ["pytorch_model.bin"]),
    ]


def test_entry_points_keep_compiled_programs_in_the_bertjax_cache_unless_told_otherwise(monkeypatch, tmp_path):
    from bertjax import cli

    monkeypatch.setattr(cli, "CACHE_ROOT", tmp_path)
    session_dir = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        cli.use_compilation_cache()
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
        jax.config.update("jax_compilation_cache_dir", "/chosen/by/JAX_COMPILATION_CACHE_DIR")
        cli.use_compilation_cache()
        assert jax.config.jax_compilation_cache_dir == "/chosen/by/JAX_COMPILATION_CACHE_DIR"
    finally:
        jax.config.update("jax_compilation_cache_dir", session_dir)


def test_presets_and_hf_config(minilm_path):
    assert [(c.num_hidden_layers, c.hidden_size, c.num_attention_heads) for c in bertjax.PRESETS.values()] == [
        (2, 128, 2),
        (4, 256, 4),
        (4, 512, 8),
        (8, 512, 8),
        (12, 768, 12),
        (24, 1024, 16),
    ]
    config = bertjax.BertConfig.from_json_file(minilm_path / "config.json")
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (6, 384, 1536)
    assert bertjax.BertConfig.from_hf_dict(config.to_hf_dict()) == config
    with pytest.raises(bertjax.UserError, match=r"^c\.json: tie_word_embeddings false"):
        bertjax.BertConfig.from_hf_dict({**config.to_hf_dict(), "tie_word_embeddings": False}, source="c.json")
    with pytest.raises(bertjax.UserError, match=r"^c\.json: hidden_size 384 is not divisible by num_attention_heads 5"):
        bertjax.BertConfig.from_hf_dict({**config.to_hf_dict(), "num_attention_heads": 5}, source="c.json")
    with pytest.raises(bertjax.UserError, match="unknown model preset 'huge'"):
        bertjax.preset("huge")


@pytest.mark.parametrize("classifier_dropout", [None, 0.0, 0.5])
def test_the_classifier_drops_at_hf_classifier_dropout_else_hidden_dropout(classifier_dropout):
    """HF's rule: `classifier_dropout` if set, else `hidden_dropout_prob`. With the encoder's own
    dropout off, any change in the logits is the classifier's dropout."""
    config = bertjax.preset("tiny", vocab_size=64, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    config = config.replace(classifier_dropout=classifier_dropout)
    assert bertjax.BertConfig.from_hf_dict(config.to_hf_dict("BertForSequenceClassification")) == config
    assert config.replace(hidden_dropout_prob=0.3).classifier_dropout_prob == (
        0.3 if classifier_dropout is None else classifier_dropout
    )
    model = bertjax.BertForSequenceClassification(config, rngs=nnx.Rngs(0))
    ids = jnp.arange(1, 17).reshape(2, 8)
    dropped = model(ids, dropout_rng=jax.random.key(1)).logits
    assert np.array_equal(model(ids).logits, dropped) == (classifier_dropout != 0.5)


def test_bf16_compute_keeps_fp32_params(minilm_path, minilm_batch, torch_minilm_out):
    model = bertjax.from_pretrained(minilm_path, dtype="bfloat16")
    assert model.encoder.layer[0].attention.self.query.kernel[...].dtype == jnp.float32
    out = _forward(model, minilm_batch, output_attentions=True)
    assert out.last_hidden_state.dtype == jnp.bfloat16 and out.attentions[0].dtype == jnp.float32
    real = minilm_batch["attention_mask"].astype(bool)
    hidden = np.asarray(out.last_hidden_state.astype(jnp.float32))
    # bf16 keeps ~3 significant digits; this bounds gross errors (a wrong cast), not precision.
    assert np.abs(hidden - torch_minilm_out.last_hidden_state.numpy())[real].mean() < 0.05


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embeddings_by_slice_and_select_equal_the_lookups(dtype):
    """The default positions (a slice) and the token types (a select) give exactly what the table
    lookups give, and so do their gradients (sums over the batch instead of scatter-adds)."""
    config = bertjax.preset("tiny", type_vocab_size=3, dtype=dtype)
    embeddings = bertjax.model.BertEmbeddings(config, rngs=nnx.Rngs(params=1))
    batch = _random_batch(config.vocab_size)
    input_ids = jnp.asarray(batch["input_ids"])
    token_type_ids = jnp.asarray(batch["token_type_ids"] + (np.arange(16) % 3 == 2))  # all three types
    positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)

    def by_lookup(e):
        # Words by the model's own lookup (tested below): this test is about positions and types.
        words = bertjax.model.lookup(e.word_embeddings.embedding[...], input_ids, e.config.compute_dtype)
        return words + e.position_embeddings(positions) + e.token_type_embeddings(token_type_ids)

    fast = nnx.jit(lambda e: e(input_ids, token_type_ids))(embeddings)
    slow = nnx.jit(lambda e: e.LayerNorm(by_lookup(e)))(embeddings)
    np.testing.assert_array_equal(np.asarray(fast, np.float32), np.asarray(slow, np.float32))
    loss = lambda f: lambda e: (f(e).astype(jnp.float32) ** 2).sum()
    fast_grad = nnx.grad(loss(lambda e: e(input_ids, token_type_ids)))(embeddings)
    slow_grad = nnx.grad(loss(lambda e: e.LayerNorm(by_lookup(e))))(embeddings)
    # The same float32 sums in another order: LayerNorm's backward over H = 128 terms and the
    # positions' sum over 3 rows, (128 + 3)·u ≈ 7.8e-6 relative; the atol covers entries near 0.
    for (path, a), (_, b) in zip(nnx.to_flat_state(fast_grad), nnx.to_flat_state(slow_grad), strict=True):
        np.testing.assert_allclose(
            np.asarray(a[...], np.float32), np.asarray(b[...], np.float32), rtol=1e-5, atol=1e-6, err_msg=str(path)
        )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_word_lookup_sums_its_gradient_in_float32_on_every_platform_path(dtype):
    """`lookup` gives the table's rows in the compute dtype, and its gradient, on the CPU path
    (scatter-add) and on the accelerators' path (one-hot product) alike, is the float32 sum of each
    id's cotangent rows, even for an id half the batch repeats."""
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(50, 8)), jnp.float32)
    ids = rng.integers(0, 50, size=(64, 64))
    ids[:, ::2] = 7  # 2,048 times, as [CLS], [SEP] or "the" recur in a batch
    cotangent = jnp.asarray(rng.normal(size=(64, 64, 8)), dtype)
    reference = np.zeros((50, 8))
    np.add.at(reference, ids, np.asarray(cotangent.astype(jnp.float32), np.float64))
    ids = jnp.asarray(ids, jnp.int32)
    gradients = {}
    for path in (bertjax.model.lookup, bertjax.model._gather_one_hot_grad):
        rows, vjp = jax.vjp(lambda t, path=path: path(t, ids, dtype), table)
        assert rows.dtype == dtype
        np.testing.assert_array_equal(np.asarray(rows), np.asarray(table.astype(dtype))[np.asarray(ids)])
        (gradients[path.__name__],) = vjp(cotangent)
        assert gradients[path.__name__].dtype == jnp.float32
        # float64 reference; id 7's 2,048 float32 adds with partial sums ≲ 45 err by √2048·u·45 ≈
        # 1.2e-4, within atol + rtol·45 = 5.5e-4; the bf16 sum below is > 100× further off.
        np.testing.assert_allclose(gradients[path.__name__], reference, rtol=1e-5, atol=1e-4, err_msg=path.__name__)
    if dtype == jnp.bfloat16:
        # What the lookup replaces: nnx.Embed casts the table first, and its gradient sums in bf16.
        (bf16_sum,) = jax.vjp(lambda t: jnp.take(t.astype(dtype), ids, axis=0), table)[1](cotangent)
        assert (
            np.abs(np.asarray(bf16_sum) - reference)[7].max() > 100 * np.abs(gradients["lookup"] - reference)[7].max()
        )


def test_a_sequence_longer_than_the_positions_is_an_error(tiny_pretraining):
    ids = jnp.ones((1, 65), jnp.int32)  # tiny_pretraining has 64 positions
    with pytest.raises(bertjax.errors.UserError, match="65 tokens exceed the model's 64 positions"):
        tiny_pretraining(ids)
