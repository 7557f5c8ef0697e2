"""The norms of what each head passes on (Kobayashi et al. 2020) against a float64 computation from
transformers' PyTorch models: the hidden states that enter each layer's attention (taken by a hook,
so the reference is transformers' own forward pass), the value and the output weights.

Reference, head by head: f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h with W_V^h the value projection's rows
and W_O^h the output projection's columns of head h's slice; ‖f_h(x_j)‖ per key; the output bias is
left out (not per head). The norm-weighted attention is α_ij ‖f_h(x_j)‖ with each row divided by its
sum, from the float64 weights and norms.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from flax import nnx
from test_model_families import MODERNBERT, _batch, _redraw
from test_probe import CONFIG as PRETRAIN_CONFIG
from test_probe import language, overrides, trees  # noqa: F401 — `language` and `trees` are fixtures

import bertjax
from bertjax import readings
from bertjax.readings import norm_weighted

DOCS = Path(__file__).resolve().parents[1] / "docs"

# Bounds, float32 (u = 2⁻²⁴ ≈ 6e-8) against float64.
# A norm ‖f_h(x_j)‖ is computed as ‖v_h R_hᵀ‖ (bertjax.readings.value_norms): the value projection (d
# terms), the product with the d_head × d_head QR factor R_h of W_O^h (d_head terms), the sum of
# squares (d_head terms), and R_h itself, within ~d·d_head·u of W_O^h (Householder's backward
# error, worst case); each contraction errs by at most n·u of its terms' size: (384 + 32 + 32 +
# 384)·u ≈ 5e-5 on MiniLM. Its input, the hidden
# state entering the layer, is itself off by ≤ L·√K·u ≈ 1.4e-5 of its size (tests/test_model.py's
# HIDDEN_BOUND argument), and f is linear in it. So a norm is within ~7e-5 of its value, relatively,
# while the terms do not cancel much: the smallest norms here (0.05 on MiniLM, the sink tokens')
# are 1/250 of the largest, and a relative error there is what the measure is read for, so the
# bound is relative, per key. Measured: 1.8e-6 (MiniLM), 3.1e-7 (random BERT), 7.1e-7 (random
# ModernBERT); the same under XLA_FLAGS=--xla_cpu_max_isa=AVX2 (on an AVX-512 machine).
NORM_BOUND = 1e-4
# w_ij = α_ij n_j / Σ_k α_ik n_k moves, to first order, by w_ij (|δα_ij|/α_ij + |δn_j|/n_j + |δS_i|/S_i):
# the weights are within ATTENTION_BOUND = 1e-5 (tests/test_model.py) and the norms within the bound
# above, so a cell of size w is off by ≲ 1e-5·(n_j/S_i) + 2e-4·w, and n_j/S_i ≤ 1/(α's share of the row)
# stays near 1 where w is large. Measured: 1.9e-6 (MiniLM), 2.2e-7 (random BERT), 7.8e-7 (random ModernBERT).
WEIGHTED_BOUND = 2e-5


def _inputs_of(modules) -> list[torch.Tensor]:
    """The first input of each of `modules` on the next forward pass, recorded by pre-hooks."""
    seen: list[torch.Tensor] = []

    def record(module, args, kwargs):
        seen.append(args[0] if args else kwargs["hidden_states"])

    for module in modules:
        module.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def _reference_norms(x: torch.Tensor, value: torch.nn.Linear | None, qkv: torch.nn.Linear | None, output, heads):
    """‖f_h(x_j)‖ [B, H, T] in float64, one head at a time: the obvious twin of `value_norms`.
    A BERT layer has `value`; ModernBERT's fused `qkv` has the values in its last third."""
    d = output.weight.shape[0]
    d_head = d // heads
    norms = []
    for h in range(heads):
        rows = slice(h * d_head, (h + 1) * d_head)
        if value is not None:
            v = x @ value.weight[rows].T + value.bias[rows]
        else:
            v = x @ qkv.weight[2 * d + h * d_head : 2 * d + (h + 1) * d_head].T
            if qkv.bias is not None:
                v = v + qkv.bias[2 * d + h * d_head : 2 * d + (h + 1) * d_head]
        norms.append((v @ output.weight[:, rows].T).norm(dim=-1))
    return torch.stack(norms, dim=1).numpy()


def _bert_reference(torch_model, batch) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(per layer the float64 norms [B, H, T], per layer the float64 weights [B, H, T, T])."""
    layers = torch_model.encoder.layer
    inputs = _inputs_of(layer.attention.self for layer in layers)
    with torch.no_grad():
        out = torch_model(**{k: torch.tensor(v) for k, v in batch.items()}, output_attentions=True)
        heads = torch_model.config.num_attention_heads
        norms = [
            _reference_norms(x, layer.attention.self.value, None, layer.attention.output.dense, heads)
            for x, layer in zip(inputs, layers, strict=True)
        ]
    return norms, [a.numpy() for a in out.attentions]


def _forward(model, batch):
    return jax.jit(lambda m, b: m(**b, attention_norms=True))(model, batch)


def _norm_error(out, reference_norms, real) -> float:
    """The largest |ours − reference| / reference over the real keys of every layer and head."""
    return max(
        float((np.abs(np.asarray(ours) - theirs) / theirs)[np.broadcast_to(real[:, None, :], theirs.shape)].max())
        for ours, theirs in zip(out.value_norms, reference_norms, strict=True)
    )


def _weighted_error(out, reference_norms, reference_weights, real) -> float:
    """The largest |ours − reference| of the norm-weighted attention over real-query × real-key cells."""
    cells = real[:, None, :, None] & real[:, None, None, :]
    errors = []
    for alpha, n, ref_alpha, ref_n in zip(
        out.attentions, out.value_norms, reference_weights, reference_norms, strict=True
    ):
        raw = ref_alpha * ref_n[:, :, None, :]
        reference = raw / raw.sum(-1, keepdims=True)
        ours = np.asarray(norm_weighted(alpha, n))
        errors.append(np.abs(ours - reference)[np.broadcast_to(cells, ours.shape)].max())
    return float(max(errors))


# --- all-MiniLM-L6-v2 on real MRPC pairs ------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_batch(minilm_path, shared_data):
    """The first 8 MRPC dev pairs, padded."""
    with open(shared_data / "glue/MRPC/dev.tsv", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:9]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path))
    batch = tokenizer([r[3] for r in rows], [r[4] for r in rows], padding=True, return_tensors="np")
    assert batch["attention_mask"].min() == 0, "the batch must contain padding"
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def minilm_reference(minilm_path, minilm_batch):
    torch_model = transformers.BertModel.from_pretrained(str(minilm_path), attn_implementation="eager")
    return _bert_reference(torch_model.eval().double(), minilm_batch)


def test_minilm_norms_match_a_float64_reference(minilm, minilm_batch, minilm_reference):
    out = _forward(minilm, minilm_batch)
    real = minilm_batch["attention_mask"].astype(bool)
    assert len(out.value_norms) == 6 and out.value_norms[0].shape == (8, 12, real.shape[1])
    norms, weights = minilm_reference
    assert _norm_error(out, norms, real) <= NORM_BOUND
    assert _weighted_error(out, norms, weights, real) <= WEIGHTED_BOUND


def _without_output_projection(v, output):
    """Planted defect: ‖v_h‖, the head's values before W_O."""
    return jnp.linalg.norm(v.astype(jnp.float32), axis=-1).transpose(0, 2, 1)


@pytest.mark.parametrize("plant", ["output projection left out", "value bias dropped"])
def test_planted_defects_fail_the_norm_bound(plant, monkeypatch, minilm, minilm_batch, minilm_reference):
    """Measured relative errors: 0.72 (no W_O), 3.0 (no b_V): far past the bound, on the norms alone
    (the model's forward pass is left as it is)."""
    correct = readings.value_norms
    if plant == "output projection left out":
        monkeypatch.setattr(readings, "value_norms", _without_output_projection)
    else:
        biases = iter([layer.attention.self.value.bias[...] for layer in minilm.encoder.layer])

        def without_bias(v, output):
            bias = next(biases).reshape(v.shape[2], v.shape[3]).astype(v.dtype)
            return correct(v - bias, output)

        monkeypatch.setattr(readings, "value_norms", without_bias)
    out = _forward(minilm, minilm_batch)
    norms, _ = minilm_reference
    assert _norm_error(out, norms, minilm_batch["attention_mask"].astype(bool)) > NORM_BOUND


# --- random models, their weights redrawn away from HF's init (zero biases would hide a dropped b_V) ---

BERT = dict(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=3, intermediate_size=96,
            max_position_embeddings=50, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip


@pytest.fixture(scope="module")
def random_bert(tmp_path_factory):
    """(our model, its batch, the float64 reference) of a random BertModel saved by transformers."""
    torch_model = transformers.BertModel(transformers.BertConfig(**BERT, attn_implementation="eager"))
    _redraw(torch_model, seed=3)
    directory = tmp_path_factory.mktemp("bert")
    torch_model.save_pretrained(directory)
    ids, mask = _batch(np.random.default_rng(4), (40, 23, 7), 40, 120, specials=3, pad=0)
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return bertjax.from_pretrained(directory), batch, _bert_reference(torch_model.eval().double(), batch)


def test_random_bert_norms_match_a_float64_reference(random_bert):
    model, batch, (norms, weights) = random_bert
    out = _forward(model, batch)
    real = batch["attention_mask"].astype(bool)
    assert _norm_error(out, norms, real) <= NORM_BOUND
    assert _weighted_error(out, norms, weights, real) <= WEIGHTED_BOUND


def test_random_bert_without_the_value_bias_fails_the_bound(random_bert):
    """The model itself without b_V: its norms (and all that follows) lose the bias; measured 0.18."""
    model, batch, (norms, _) = random_bert
    wrong = nnx.clone(model)
    for layer in wrong.encoder.layer:
        layer.attention.self.value.bias.set_value(jnp.zeros_like(layer.attention.self.value.bias[...]))
    assert _norm_error(_forward(wrong, batch), norms, batch["attention_mask"].astype(bool)) > NORM_BOUND


def test_random_modernbert_norms_match_a_float64_reference(tmp_path):
    """ModernBERT's values are the last third of Wqkv and its output projection is Wo, with biases
    here (attention_bias) so that a dropped one would show. One unpadded row: transformers' eager
    attention on a padded batch is no reference (tests/test_model_families.py, `modern_reference`)."""
    torch_model = transformers.ModernBertModel(
        transformers.ModernBertConfig(**MODERNBERT, attention_bias=True, attn_implementation="eager")
    )
    _redraw(torch_model, seed=5)
    torch_model.save_pretrained(tmp_path)
    ids, mask = _batch(np.random.default_rng(6), (40,), 40, 120, specials=3, pad=0)
    layers = torch_model.eval().double().layers
    inputs = _inputs_of(layer.attn for layer in layers)
    with torch.no_grad():
        reference = torch_model(torch.tensor(ids), attention_mask=torch.tensor(mask), output_attentions=True)
        norms = [_reference_norms(x, None, layer.attn.Wqkv, layer.attn.Wo, MODERNBERT["num_attention_heads"])
                 for x, layer in zip(inputs, layers, strict=True)]  # fmt: skip
    model = bertjax.from_pretrained(tmp_path)
    out = _forward(model, {"input_ids": ids, "attention_mask": mask})
    real = mask.astype(bool)
    assert _norm_error(out, norms, real) <= NORM_BOUND
    assert _weighted_error(out, norms, [a.numpy() for a in reference.attentions], real) <= WEIGHTED_BOUND


def test_householder_r_is_the_r_factor_of_qr():
    """householder_r(A) is R of A = QR up to its rows' signs: RᵀR = AᵀA and R upper triangular.
    Each Gram entry of A [m, n] is a sum of m products and Householder QR is backward stable
    (R exact for A + δA, ‖δA‖ ≤ m·n·u‖A‖ at worst), so RᵀR is within 2·m·n·u of AᵀA relative to its
    largest entry (1.5e-3 at MiniLM's 384 × 32; measured 1.7e-6). A column left out (zeroed, a
    planted defect) is far outside, and its R is finite."""
    a = np.random.default_rng(7).normal(size=(3, 384, 32)).astype(np.float32)
    gram = np.einsum("hmn,hmk->hnk", a.astype(np.float64), a.astype(np.float64))
    bound = 2 * 384 * 32 * 2.0**-24

    def gram_error(r):
        r = np.asarray(r, np.float64)
        return np.abs(np.einsum("hin,hik->hnk", r, r) - gram).max() / np.abs(gram).max()

    r = np.asarray(readings.householder_r(jnp.asarray(a)))
    assert np.all(np.tril(r, -1) == 0) and gram_error(r) <= bound
    a[:, :, 4] = 0.0
    dropped = np.asarray(readings.householder_r(jnp.asarray(a)))
    assert np.isfinite(dropped).all() and gram_error(dropped) > bound


def test_the_default_forward_pass_is_the_one_without_norms(minilm, minilm_batch):
    """attention_norms left False returns no norms; asking for them adds to the program without
    changing the weights or the hidden states."""
    plain = jax.jit(lambda m, b: m(**b, output_attentions=True))(minilm, minilm_batch)
    both = _forward(minilm, minilm_batch)
    assert plain.value_norms is None
    np.testing.assert_array_equal(np.asarray(both.last_hidden_state), np.asarray(plain.last_hidden_state))
    for a, b in zip(plain.attentions, both.attentions, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_row_of_zero_weights_stays_zero():
    """A head masked to zero has rows summing to 0: the norm-weighted row is 0, not NaN."""
    attention = jnp.zeros((1, 1, 2, 2))
    assert np.all(np.asarray(norm_weighted(attention, jnp.ones((1, 1, 2)))) == 0)


# --- analysis.roles --attention -----------------------------------------------------------------


@pytest.fixture(scope="module")
def roles_runs(tiny_hf, shared_data, tmp_path_factory):
    """analysis.roles on the tiny random BERT under each `--attention`, the same examples."""
    from analysis import roles as roles_cli

    root, cache = tmp_path_factory.mktemp("attention_runs"), tmp_path_factory.mktemp("cache")
    runs = {}
    for source in ("weights", "norms", "both"):
        runs[source] = root / source
        roles_cli.main(["--ckpt", str(tiny_hf), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "24",
                        "--batch-size", "8", "--out", str(runs[source]), "--cache-dir", str(cache), "--attention", source,
                        *(["--figures", "none"] if source != "weights" else [])])  # fmt: skip
    return runs, cache


# `both` scores the two readings in one compiled program, which XLA fuses and orders otherwise than
# either alone: each per-sequence β is within the kernel's worst case (T² + T + 2)·u of its exact
# value (tests/test_roles.py, `_kernel_rtol`), so two computations of it are within twice that, at
# the longest padded length T = 128 of these runs. Measured: 1.2e-7 (weights), 2.4e-7 (norms) relative.
BOTH_RTOL = 2 * (128**2 + 128 + 2) * 2.0**-24


@pytest.mark.slow
def test_both_writes_each_reading_as_its_own_run_would(roles_runs):
    """`both` is one forward pass per batch; its main files hold the weights run's numbers, its
    `_norms` files the norms run's; readings.csv puts the decisions side by side."""
    runs, _ = roles_runs
    both = runs["both"]
    for mine, theirs in (("", "weights"), ("_norms", "norms")):
        with np.load(both / f"scores{mine}.npz") as a, np.load(runs[theirs] / "scores.npz") as b:
            assert sorted(a.files) == sorted(b.files)
            for key in a.files:
                np.testing.assert_allclose(a[key], b[key], rtol=BOTH_RTOL, atol=0)
        table, alone = pd.read_csv(both / f"roles{mine}.csv"), pd.read_csv(runs[theirs] / "roles.csv")
        assert table["assigned"].tolist() == alone["assigned"].tolist()
        np.testing.assert_allclose(table["mean"], alone["mean"], rtol=BOTH_RTOL, atol=0)
        assert (both / f"summary{mine}.csv").exists()
    assert not (runs["weights"] / "readings.csv").exists() and not (runs["weights"] / "roles_norms.csv").exists()
    comparison = pd.read_csv(both / "readings.csv")
    assert list(comparison.columns) == ["task", "layer", "head", "role", "mean_weights", "mean_norms",
                                        "assigned_weights", "assigned_norms"]  # fmt: skip
    assert comparison["assigned_weights"].tolist() == pd.read_csv(both / "roles.csv")["assigned"].tolist()
    assert comparison["mean_norms"].tolist() == pd.read_csv(both / "roles_norms.csv")["mean"].tolist()
    info = json.loads((both / "run.json").read_text())
    assert info["config"]["attention"] == "both" and info["readings"]["norms"]["roles"] == "roles_norms.csv"
    assert json.loads((runs["norms"] / "run.json").read_text())["config"]["attention"] == "norms"


@pytest.mark.slow
def test_norms_run_scores_beta_on_the_norm_weighted_attention(roles_runs, tiny_hf, shared_data):
    """The norms run's per-sequence β against β of docs/roles.md computed in float64 from the renormalised
    α_ij‖f_h(x_j)‖ of one unsorted, unbucketed batch (the slow twin of tests/test_roles.py)."""
    from test_roles import _kernel_rtol, _mrpc_in_one_batch, _reference_sequence_scores

    runs, cache = roles_runs
    seqs, arrays = _mrpc_in_one_batch(tiny_hf, shared_data, cache)
    out = bertjax.from_pretrained(str(tiny_hf))(**arrays, attention_norms=True)
    weighted = []
    for alpha, n in zip(out.attentions, out.value_norms, strict=True):
        raw = np.asarray(alpha, np.float64) * np.asarray(n, np.float64)[:, :, None, :]
        weighted.append(raw / raw.sum(-1, keepdims=True))
    weighted = np.stack(weighted, axis=1)  # [B, L, H, T, T]
    saved = np.load(runs["norms"] / "scores.npz")
    for role in ("local", "prev", "cls", "sep", "block", "nsubj"):
        expected = {seq.index: _reference_sequence_scores(weighted[b], seq, role) for b, seq in enumerate(seqs)}
        expected = {i: v for i, v in expected.items() if v is not None}
        index = saved[f"mrpc/{role}/index"]
        assert list(index) == sorted(expected), role
        # The kernel's float32 bound (tests/test_roles.py); the atol covers the norm-weighted cells
        # computed in another padding (WEIGHTED_BOUND above).
        got, want = saved[f"mrpc/{role}"], np.stack([expected[i] for i in index])
        np.testing.assert_allclose(got, want, rtol=_kernel_rtol(seqs), atol=WEIGHTED_BOUND)
        # A planted defect: β on the weights instead differs from the norms' reference.
        if role == "cls":
            weights_scores = np.load(runs["weights"] / "scores.npz")[f"mrpc/{role}"]
            assert np.abs(weights_scores - want).max() > 10 * WEIGHTED_BOUND


def test_attention_takes_three_spellings(cli_error):
    from analysis import roles as roles_cli

    line = cli_error(roles_cli.main, ["--ckpt", "x", "--attention", "norm"])
    assert "--attention: invalid choice: 'norm'" in line


def test_the_docs_table_is_the_committed_csv(docs_script):
    """docs/attention-norms.md shows what docs/attention_norms_minilm.py wrote."""
    script = docs_script("attention_norms_minilm")
    table = pd.read_csv(script.CSV)
    assert script.markdown(table) in (DOCS / "attention-norms.md").read_text(encoding="utf-8")
    # The MRPC numbers (weights / norms / both): [CLS] 68 / 12 / 12, [SEP] 2 / 0 / 0.
    mrpc = table[table["task"] == "mrpc"].set_index("role")
    assert mrpc.loc["cls"].tolist() == ["mrpc", 68, 12, 12] and mrpc.loc["sep"].tolist() == ["mrpc", 2, 0, 0]


def test_the_docs_fine_tuning_tables_are_the_committed_csvs(docs_script):
    """docs/attention-norms.md shows what docs/attention_norms_finetune.py wrote, and each role's
    counts add up: the heads after are those before, plus those gained, less those lost."""
    script = docs_script("attention_norms_finetune")
    roles, layers = pd.read_csv(script.ROLES_CSV), pd.read_csv(script.LAYERS_CSV)
    assert script.markdown(roles, layers) in (DOCS / "attention-norms.md").read_text(encoding="utf-8")
    assert (roles["held_post"] == roles["held_pre"] + roles["gained"] - roles["lost"]).all()
    assert sorted(roles["reading"].unique()) == ["norms", "weights"] and len(layers) == 2 * 6


def test_the_docs_training_run_table_is_the_committed_csv(docs_script):
    """docs/attention-norms.md shows what docs/attention_norms_emergence.py wrote; a head holding a
    role on both readings holds it on each."""
    script = docs_script("attention_norms_emergence")
    table = pd.read_csv(DOCS / "emergence" / "norms" / "preln-s0.csv")
    assert script.markdown(table, script.page_steps(table)) in (DOCS / "attention-norms.md").read_text(encoding="utf-8")
    assert ((table["both"] <= table["weights"]) & (table["both"] <= table["norms"])).all()
    assert table[["weights", "norms"]].max().max() <= 16  # 4 layers × 4 heads


# --- analysis.track and analysis.finetune_effect --attention norms -----------------------------


def _small_flags(shared_data, parses) -> list[str]:
    return ["--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "12", "--batch-size", "8",
            "--max-length", "32", "--cache-dir", str(parses)]  # fmt: skip


@pytest.mark.slow
def test_track_keys_its_cache_by_the_reading_and_equals_roles(shared_data, tmp_path, monkeypatch):
    """A cached weights run is not reused for norms (every step is scored again), and a norms step's
    rows are what `analysis.roles --attention norms` writes for that checkpoint."""
    from test_track import write_run

    from analysis import roles as roles_cli
    from analysis import track
    from analysis.heads import tracking

    run = write_run(tmp_path / "run", shared_data, (1, 3))
    flags = _small_flags(shared_data, tmp_path / "parses")
    loaded = []
    real_load = tracking.from_pretrained
    monkeypatch.setattr(tracking, "from_pretrained", lambda source, **o: loaded.append(source.step) or real_load(source, **o))  # fmt: skip
    cache = tmp_path / "cache"
    # weights: both steps scored; norms: scored again (the weights' entries do not serve); norms
    # again: its own entries serve.
    for source, scored in (("weights", [1, 3]), ("norms", [1, 3]), ("norms", [])):
        loaded.clear()
        track.main(["--run", str(run), "--out", str(tmp_path / source), "--scores-cache", str(cache), "--no-figures",
                    "--attention", source, "--overwrite", *flags])  # fmt: skip
        assert loaded == scored, source
    assert len(list(cache.glob("step-*.npz"))) == 4  # two steps × two readings
    assert '"attention": "norms"' in (tmp_path / "norms" / "run.json").read_text()
    roles_cli.main(["--ckpt", str(run), "--step", "3", "--attention", "norms", "--out", str(tmp_path / "roles"),
                    "--no-figures", *flags])  # fmt: skip
    table = pd.read_csv(tmp_path / "norms" / tracking.TRACK_CSV)
    rows = table[table["step"] == 3].drop(columns="step").reset_index(drop=True)
    pd.testing.assert_frame_equal(rows, pd.read_csv(tmp_path / "roles" / "roles.csv"), check_exact=True)
    weights = pd.read_csv(tmp_path / "weights" / tracking.TRACK_CSV)
    assert not np.allclose(weights["mean"], table["mean"])


@pytest.mark.slow
def test_finetune_effect_on_the_norms_compares_the_roles_norms_tables(shared_data, tmp_path, tiny_hf):
    """finetune_effect --attention norms: the pre side of each bar is the mean of `analysis.roles
    --attention norms`' head means over the bar's roles and layer group (the post side is computed
    alike); its attention cosine is between the norm-weighted maps."""
    from test_track import write_checkpoint
    from transformers import BertTokenizerFast

    from analysis import finetune_effect as effect
    from analysis import roles as roles_cli

    post = tmp_path / "post" / "tiny-mrpc"
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(post / "tokenizer")
    write_checkpoint(post, 40, seed=2, cls=bertjax.BertForSequenceClassification)
    flags = _small_flags(shared_data, tmp_path / "parses")
    effect.main(["--pre", str(tiny_hf), "--post", str(post), "--attention", "norms", "--out", str(tmp_path / "effect"),
                 "--no-figures", *flags])  # fmt: skip
    roles_cli.main(["--ckpt", str(tiny_hf), "--attention", "norms", "--out", str(tmp_path / "roles"), "--no-figures",
                    *flags])  # fmt: skip
    means = pd.read_csv(tmp_path / "roles" / "roles.csv")
    changes = pd.read_csv(tmp_path / "effect" / "beta_change.csv")
    for group, layer in (("initial", 0), ("final", 1)):
        for bar, roles in (("cls", ["cls"]), ("local", ["local", "prev", "next"])):
            expected = means[(means.layer == layer) & means.role.isin(roles)]["mean"].mean()
            row = changes[(changes.group == group) & (changes.bar == bar)]
            # As tests/test_finetune_effect.py: the same head means averaged in another order.
            np.testing.assert_allclose(row["pre"].iloc[0], expected, rtol=1e-6)
    assert '"attention": "norms"' in (tmp_path / "effect" / "run.json").read_text()


@pytest.mark.parametrize("module", ["track", "finetune_effect"])
def test_one_reading_commands_refuse_both(module, cli_error):
    import importlib

    line = cli_error(
        importlib.import_module(f"analysis.{module}").main,
        ["--run" if module == "track" else "--pre", "x", "--attention", "both"],
    )
    assert "--attention: invalid choice: 'both'" in line


# --- analysis.clark's surface and cluster analyses --attention norms ---------------------------


def test_surface_statistics_of_the_norms_are_those_of_the_norm_weighted_attention(tiny_hf, minilm_tokenizer):
    """surface_statistics(reading="norms") = the (separately tested) surface sums of the
    norm-weighted attention computed outside the analysis, per row of one sequence."""
    from analysis.attention import surface
    from sieves.align import encode_batch

    model = bertjax.from_pretrained(tiny_hf)
    (seq,) = encode_batch(minilm_tokenizer, [("The cat sat on the mat, happily.", "It was warm there.")], None, 32)
    punct = minilm_tokenizer.convert_tokens_to_ids([".", ","])
    ours = surface.surface_statistics(model, [seq], punct, 1, 32, reading="norms")
    ids = lambda values: jnp.asarray(np.asarray(values)[None])
    out = model(ids(seq.input_ids), ids(np.ones(seq.length, np.int32)), ids(seq.token_type_ids), attention_norms=True)
    weighted = jnp.stack([norm_weighted(a, n) for a, n in zip(out.attentions, out.value_norms, strict=True)])
    is_punct = np.isin(seq.input_ids, punct) & ~seq.special
    sums, counts = surface.surface_sums(
        weighted, jnp.ones((1, seq.length)), ids(seq.is_cls), ids(seq.is_sep), ids(is_punct)
    )
    expected = np.asarray(sums, np.float64) / np.maximum(np.asarray(counts, np.float64), 1.0)
    # Means over ≤ 32 float32 rows of one input, computed in two programs: ~32·u apart (as
    # tests/test_fidelity_clark.py), plus the norm-weighted cells' own rounding in each (~4u).
    np.testing.assert_allclose(ours, expected, rtol=0, atol=64 * 2.0**-24)
    weights = surface.surface_statistics(model, [seq], punct, 1, 32)
    assert np.abs(weights - ours).max() > 1e-3  # the reading is not ignored


def test_clark_takes_the_flag_and_records_it():
    from analysis import clark
    from analysis.attention import pipeline as attention_pipeline

    assert clark.parse_args(["--ckpt", "x", "--out", "o", "--attention", "norms"]).attention == "norms"
    assert clark.parse_args(["--ckpt", "x", "--out", "o"]).attention == "weights"
    with pytest.raises(bertjax.UserError, match="--attention"):
        attention_pipeline.ClarkConfig(ckpt="x", out="o", attention="both")


# --- the role probes inside pre-training: probe.attention ----------------------------------------


@pytest.mark.slow  # pre-trains with probes: ~40 s of CPU
def test_probe_on_the_norms_equals_analysis_track_on_the_norms(language, trees, tmp_path):  # noqa: F811
    """probe.attention=norms logs what `analysis.track --attention norms` finds at each saved step
    (as tests/test_probe.py checks for the weights): the heads holding each role and the largest β."""
    from test_probe import ALPHA, BATCH, MAX_LENGTH, ROLES, TAU, N, checkpoint_steps, probe_records

    from analysis import track
    from train import pretrain

    run = tmp_path / "run"
    extra = ("probe.sas=false", "probe.sas_relations=[]", "probe.attention=norms")
    pretrain.main(["--config", str(PRETRAIN_CONFIG), "--workdir", str(run), *overrides(language, trees, *extra)])
    out = tmp_path / "track"
    track.main(["--run", str(run), "--parser", "conllu", "--conllu", str(trees), "--n", str(N), "--max-length",
                str(MAX_LENGTH), "--batch-size", str(BATCH), "--roles", ",".join(ROLES), "--tau", str(TAU),
                "--alpha", str(ALPHA), "--attention", "norms", "--no-figures", "--out", str(out)])  # fmt: skip
    table, records = pd.read_csv(out / "track.csv"), probe_records(run)
    steps = sorted(table["step"].unique())
    assert steps == checkpoint_steps(run) and len(steps) >= 3
    # tests/test_probe.py's bound: two compiles of a β within 6·T·u.
    bound = 6 * MAX_LENGTH * 2.0**-24
    for step in steps:
        for role in ROLES:
            rows = table[(table["step"] == step) & (table["role"] == role)]
            assert not np.any(np.abs(rows["p_value"] - ALPHA) < 1e-9)
            assert records[step][f"probe/{role}/heads"] == int(rows["assigned"].sum()), (step, role)
            assert records[step][f"probe/{role}/max_beta"] == pytest.approx(rows["mean"].max(), rel=bound, abs=0)


def test_probe_attention_is_checked(language, trees, tmp_path):  # noqa: F811
    from train import pretrain

    workdir = tmp_path / "run"
    with pytest.raises(bertjax.UserError, match=r"^probe.attention must be one of weights, norms, got 'both'$"):
        pretrain.main(["--config", str(PRETRAIN_CONFIG), "--workdir", str(workdir),
                       *overrides(language, trees, "probe.attention=both")])  # fmt: skip
    assert not workdir.exists()


def test_the_parsers_spell_the_readings_as_the_model_does():
    from analysis.common import flags

    assert flags.ONE_READING == readings.ATTENTION_READINGS
    assert (*readings.ATTENTION_READINGS, "both") == flags.ATTENTION_SOURCES


@pytest.mark.slow
def test_the_report_of_a_norms_run_draws_and_scores_the_norm_weighted_attention(roles_runs, tmp_path):
    """The examples' β recomputed from the attention the page draws equal the norms run's scores.npz,
    and the page says which reading its β are on; a weights run's page names no reading."""
    from test_report import _page_data

    from analysis import report

    runs, _ = roles_runs
    pages = {}
    for source in ("weights", "norms"):
        pages[source] = tmp_path / f"{source}.html"
        report.main([str(runs[source]), "--out", str(pages[source])])
    assert "attention" not in _page_data(pages["weights"])["settings"]
    data = _page_data(pages["norms"])
    assert data["settings"]["attention"] == "norms"
    # The kernel's float32 bound (tests/test_roles.py) at the longest padded length, 128.
    rtol = (128**2 + 128 + 2) * 2.0**-24
    with np.load(runs["norms"] / "scores.npz") as scores, np.load(runs["weights"] / "scores.npz") as weights:
        for seq in data["examples"]["mrpc"]["sequences"]:
            for role, beta in seq["beta"]["model"].items():
                index = list(scores[f"mrpc/{role}/index"])
                if beta is None:
                    continue
                row = index.index(seq["index"])
                np.testing.assert_allclose(beta, scores[f"mrpc/{role}"][row].ravel(), rtol=rtol)
                # The weights' β (scored on the same rows) are farther: the page does read the norms.
                mine, theirs = scores[f"mrpc/{role}"][row].ravel(), weights[f"mrpc/{role}"][row].ravel()
                assert np.abs(np.asarray(beta) - mine).max() < np.abs(np.asarray(beta) - theirs).max()


@pytest.mark.slow
def test_the_report_of_a_both_run_switches_each_head_card_between_the_readings(roles_runs, browser, tmp_path):
    """In headless Chromium: a head card shows roles.csv's numbers, then roles_norms.csv's once the
    reading is switched to the norms, then roles.csv's again."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    from test_report import _csv_rows, _open

    from analysis import report

    runs, _ = roles_runs
    page = tmp_path / "both.html"
    report.main([str(runs["both"]), "--out", str(page)])
    _open(browser, page)
    browser.find_element(By.CSS_SELECTOR, '#grid .cell[data-layer="1"][data-head="0"]').click()

    def shown_means() -> dict[str, float | None]:
        rows = browser.find_elements(By.CSS_SELECTOR, "#card-stats tr[data-role]")
        values = {r.get_attribute("data-role"): r.find_element(By.CSS_SELECTOR, 'td[data-field="mean"]') for r in rows}
        return {role: float(cell.get_attribute("data-value")) for role, cell in values.items()}

    def csv_means(name: str) -> dict[str, float]:
        rows = _csv_rows(runs["both"] / name)
        return {r["role"]: float(r["mean"]) for r in rows if (r["task"], r["layer"], r["head"]) == ("mrpc", "1", "0")}

    weights, norms = csv_means("roles.csv"), csv_means("roles_norms.csv")
    assert weights != norms
    # Exact: the page carries the CSVs' shortest round-trip decimals.
    assert shown_means() == weights
    reading = Select(browser.find_element(By.ID, "reading"))
    reading.select_by_value("norms")
    assert shown_means() == norms
    reading.select_by_value("weights")
    assert shown_means() == weights
