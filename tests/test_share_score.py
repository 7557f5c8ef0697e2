"""`--score share`: each row's attention share on its sieve against the fixed chance level
|S(t)| / REFERENCE_LENGTH (sieves.kernel), where β's chance level |S(t)| / n grows finer with n."""

from __future__ import annotations

import dataclasses
import json

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import entropy as scipy_entropy
from test_sieves_kernel import F32_RTOL, F64_RTOL, KEYED_F32_RTOL, B, H, L, T, fixed_inputs, kernel_inputs, renormalised
from test_track import write_run

import bertjax
from analysis import finetune_effect as effect_cli
from analysis import roles as roles_cli
from analysis import track as track_cli
from analysis.common import examples
from analysis.heads import config as roles_config
from analysis.heads.tracking import settings_key
from sieves.kernel import REFERENCE_LENGTH, sieve_scores

U = 2.0**-24  # float32's unit roundoff


def share_reference(
    attentions, real, rows, sieves, entropy: bool = False, by: str = "reference", entropy_by_n: bool = False
) -> np.ndarray:
    """share(t) · N / |S(t)| (times row t's entropy with `entropy`) averaged over the scored rows, one
    token at a time in float64; N = REFERENCE_LENGTH, or with `by="n"` the sequence's own length
    (β: the planted bug of normalising by n). `entropy_by_n`: the planted bug of an entropy taken of
    the row renormalised to N / n instead of 1."""
    attentions = np.asarray(attentions, np.float64)
    layers, batch, heads, length = attentions.shape[:4]
    scores = np.full((rows.shape[0], batch, layers, heads), np.nan)
    for r in range(rows.shape[0]):
        for b in range(batch):
            keys = [s for s in range(length) if real[b, s]]
            scale = REFERENCE_LENGTH if by == "reference" else len(keys)
            scored = [t for t in range(length) if rows[r, b, t]]
            for layer in range(layers):
                for head in range(heads):
                    values = []
                    for t in scored:
                        alpha = attentions[layer, b, head, t]
                        sieve = [s for s in range(length) if sieves[r, b, t, s]]
                        share = sum(alpha[s] for s in sieve) / sum(alpha[s] for s in keys)
                        value = share * scale / len(sieve)
                        if entropy and entropy_by_n:
                            p = alpha[keys] / alpha[keys].sum() * scale / len(keys)
                            value *= -(p * np.log(np.where(p > 0, p, 1))).sum()
                        elif entropy:
                            value *= scipy_entropy(alpha[keys])
                        values.append(value)
                    if values:
                        scores[r, b, layer, head] = sum(values) / len(values)
    return scores


# -- planted heads: the same share at two lengths ------------------------------------------------

# MRPC's and SST-2's mean lengths (issue 48), padded into one batch of the longer.
LENGTHS = (29, 63)
PAD = 64
# One role per head, each a sieve of fixed size on every scored row: [CLS] (|S| = 1), the previous
# token (prev with k = 1, |S| = 1), and three fixed keys (|S| = 3); planted shares per layer.
SIEVE_SIZES = (1, 1, 3)
SHARES = ((0.9, 0.35, 0.6), (0.12, 0.99, 0.05))


def _planted(rng: np.random.Generator):
    """attentions [L, B, H, PAD, PAD] where head h of each layer puts exactly SHARES[layer][h] of
    every row's attention on role h's sieve (unevenly), the rest unevenly on the other real keys;
    rows [R, B, PAD] and sieves [R, B, PAD, PAD]."""
    heads = len(SIEVE_SIZES)
    real = np.arange(PAD)[None] < np.array(LENGTHS)[:, None]
    rows = np.zeros((heads, len(LENGTHS), PAD), bool)
    sieves = np.zeros((heads, len(LENGTHS), PAD, PAD), bool)
    for b, n in enumerate(LENGTHS):
        rows[:, b, :n] = True
        rows[1, b, 0] = False  # prev: no key before the first token
        sieves[0, b, :n, 0] = True
        sieves[1, b, np.arange(1, n), np.arange(n - 1)] = True
        sieves[2, b, :n, rng.choice(n, 3, replace=False)] = True
    attentions = np.zeros((len(SHARES), len(LENGTHS), heads, PAD, PAD))
    for layer, shares in enumerate(SHARES):
        for b, n in enumerate(LENGTHS):
            for h, share in enumerate(shares):
                for t in range(n):
                    sieve = sieves[h, b, t, :n]
                    weights = rng.uniform(0.1, 1.0, n)
                    if sieve.any():
                        row = np.where(sieve, weights / weights[sieve].sum() * share, 0.0)
                        row += np.where(~sieve, weights / weights[~sieve].sum() * (1 - share), 0.0)
                    else:  # prev's unscored first row
                        row = weights / weights.sum()
                    attentions[layer, b, h, t, :n] = row
    return attentions.astype(np.float32), real, rows, sieves


def _planted_bound(n: int, size: int) -> float:
    """A float32 score of a planted row set against its exact value share · N / |S|, relative: the
    float32 rounding of the attention moves each row's share by ≤ 2u; the row mass sums n
    non-negative terms (≤ (n − 1)u), its division by N is exact for N a power of two (β's by n:
    u) and the division of α by it u; the row weight 1 / |S| / count two roundings and its product
    with α/mass one; the contraction adds ≤ n·|S| non-zero non-negative terms (adding XLA's zeros
    is exact): ≤ (n·|S| − 1)u."""
    return (2 + (n - 1) + 1 + 1 + 2 + 1 + (n * size - 1)) * U


def test_planted_heads_with_one_share_at_two_lengths_score_alike_and_beta_grows_with_the_length() -> None:
    attentions, real, rows, sieves = _planted(np.random.default_rng(0))
    share, counts = (
        np.asarray(x) for x in sieve_scores(attentions, real, rows, sieves, reference_length=REFERENCE_LENGTH)
    )
    beta = np.asarray(sieve_scores(attentions, real, rows, sieves)[0])
    for layer, shares in enumerate(SHARES):
        for h, (planted, size) in enumerate(zip(shares, SIEVE_SIZES, strict=True)):
            got = share[h, :, layer, h]
            bounds = [_planted_bound(n, size) for n in LENGTHS]
            np.testing.assert_allclose(got, planted * REFERENCE_LENGTH / size, rtol=max(bounds), atol=0)
            # Both within their bounds of one exact value: apart by at most their sum.
            assert abs(got[1] - got[0]) <= sum(bounds) * planted * REFERENCE_LENGTH / size
            # β = share · n / |S|: the same head scores in the ratio of the lengths (β's division by
            # n rounds once more at each length, u each; the ratio of two float32s once more).
            ratio = beta[h, 1, layer, h] / beta[h, 0, layer, h]
            assert abs(ratio / (LENGTHS[1] / LENGTHS[0]) - 1) <= sum(bounds) + 3 * U
    assert (counts[1] == np.array(LENGTHS) - 1).all() and (counts[[0, 2]] == np.array(LENGTHS)).all()


def test_the_planted_bound_catches_a_normalisation_by_n() -> None:
    """Planted bug: the row mass divided by the sequence's n (β, not the share) moves the scores by
    a factor n / N, far past the bound; so does N off by one."""
    attentions, real, rows, sieves = _planted(np.random.default_rng(0))
    share = np.asarray(sieve_scores(attentions, real, rows, sieves, reference_length=REFERENCE_LENGTH)[0])
    for wrong_length in (None, REFERENCE_LENGTH - 1):
        wrong = np.asarray(sieve_scores(attentions, real, rows, sieves, reference_length=wrong_length)[0])
        for layer in range(len(SHARES)):
            for h, size in enumerate(SIEVE_SIZES):
                bound = max(_planted_bound(n, size) for n in LENGTHS)
                assert not np.allclose(wrong[h, :, layer, h], share[h, :, layer, h], rtol=bound, atol=0)


# -- random attention and sieves against the float64 reference -----------------------------------


@settings(max_examples=20, deadline=None)
@given(kernel_inputs())
def test_share_matches_the_reference_in_float64_and_float32(inputs) -> None:
    attentions, real, rows, sieves = inputs
    expected = share_reference(attentions, real, rows, sieves)
    with jax.enable_x64(True):
        scores, counts = sieve_scores(*(jnp.asarray(x) for x in inputs), reference_length=REFERENCE_LENGTH)
        assert scores.dtype == jnp.float64
        scores = np.asarray(scores)
    np.testing.assert_array_equal(np.isnan(scores), np.isnan(expected))
    np.testing.assert_array_equal(np.asarray(counts), rows.sum(-1))
    np.testing.assert_allclose(scores, expected, rtol=F64_RTOL, atol=0)
    single = attentions.astype(np.float32)
    scores32 = np.asarray(sieve_scores(single, real, rows, sieves, reference_length=REFERENCE_LENGTH)[0])
    expected32 = share_reference(single, real, rows, sieves)
    np.testing.assert_allclose(scores32, expected32, rtol=F32_RTOL, atol=0)


@settings(max_examples=10, deadline=None)
@given(kernel_inputs(), hnp.arrays(np.float64, (L, B, H, T, 1), elements=st.floats(-3, 3)))
def test_share_is_free_of_each_rows_scale(inputs, log_scales) -> None:
    """Rows scaled by unrelated factors, so Σ_{s real} α(t,s) is not 1: a share is a ratio over the
    row, and a kernel that divided α by N without dividing by the row's own mass would fail."""
    attentions, real, rows, sieves = inputs
    scaled = attentions * 10.0**log_scales
    expected = share_reference(scaled, real, rows, sieves)
    with jax.enable_x64(True):
        scores = np.asarray(
            sieve_scores(*(jnp.asarray(x) for x in (scaled, real, rows, sieves)), reference_length=REFERENCE_LENGTH)[0]
        )
    np.testing.assert_allclose(scores, expected, rtol=F64_RTOL, atol=0)


def test_share_is_beta_scaled_by_the_reference_over_the_length_and_beta_at_the_reference() -> None:
    attentions, real, rows, sieves = fixed_inputs()
    n = real.sum(-1)
    beta = np.asarray(sieve_scores(attentions, real, rows, sieves)[0])
    share = np.asarray(sieve_scores(attentions, real, rows, sieves, reference_length=REFERENCE_LENGTH)[0])
    finite = np.isfinite(beta)
    # Two float32 computations, each within F32_RTOL of its exact value (β's division by n: one u more).
    np.testing.assert_allclose(
        share[finite], (beta * REFERENCE_LENGTH / n[None, :, None, None])[finite], rtol=2 * F32_RTOL + U, atol=0
    )
    # With every sequence as long as the reference, the same operations on the same numbers: β's bits.
    full = np.ones_like(real)
    full_rows = rows | (full & sieves.any(-1))
    full_attention = np.where(full[None, :, None, None, :], attentions + np.float32(0.01), 0).astype(np.float32)
    same = sieve_scores(full_attention, full, full_rows, sieves, reference_length=T)[0]
    np.testing.assert_array_equal(
        np.asarray(same), np.asarray(sieve_scores(full_attention, full, full_rows, sieves)[0])
    )


def test_the_float32_bound_catches_beta_in_place_of_the_share() -> None:
    attentions, real, rows, sieves = fixed_inputs()
    share = np.asarray(sieve_scores(attentions, real, rows, sieves, reference_length=REFERENCE_LENGTH)[0])
    finite = np.isfinite(share)
    wrong = share_reference(attentions, real, rows, sieves, by="n")
    assert not np.allclose(share[finite], wrong[finite], rtol=F32_RTOL, atol=0)


def test_share_with_key_weights_is_the_share_of_the_renormalised_weighted_rows() -> None:
    attentions, real, rows, sieves = fixed_inputs()
    key_weights = np.random.default_rng(1).uniform(0.05, 5.0, (L, B, H, T)).astype(np.float32)
    scores = sieve_scores(attentions, real, rows, sieves, key_weights=key_weights, reference_length=REFERENCE_LENGTH)
    expected = share_reference(renormalised(attentions, key_weights), real, rows, sieves)
    np.testing.assert_allclose(np.asarray(scores[0]), expected, rtol=KEYED_F32_RTOL, atol=0)
    # Planted: the weights left out (the plain attention's share).
    plain = share_reference(attentions, real, rows, sieves)
    finite = np.isfinite(expected)
    assert not np.allclose(np.asarray(scores[0])[finite], plain[finite], rtol=KEYED_F32_RTOL, atol=0)


# The entropy factor adds a T-term sum and T logs per row (~(T + 8)u more, as tests/test_sieves_kernel.py
# bounds it); doubled, as the β test there allows.
ENTROPY_RTOL = 2 * (T**2 + 2 * T + 8) * U


def test_the_entropy_variant_takes_the_true_row_entropy() -> None:
    """`--block-score entropy` with `--score share`: the share score times the entropy of the row
    renormalised over its real keys, not of the row divided by N."""
    attentions, real, rows, sieves = fixed_inputs()
    entropy = (False, True, False)
    scores = np.asarray(
        sieve_scores(attentions, real, rows, sieves, entropy_roles=entropy, reference_length=REFERENCE_LENGTH)[0]
    )
    expected = share_reference(attentions, real, rows, sieves, entropy=True)
    np.testing.assert_allclose(scores[1], expected[1], rtol=ENTROPY_RTOL, atol=0)
    plain = share_reference(attentions, real, rows, sieves)
    np.testing.assert_allclose(scores[[0, 2]], plain[[0, 2]], rtol=F32_RTOL, atol=0)
    # Planted: the entropy of relative / n, the β path's renormalisation kept (p = α/Σα · N/n).
    wrong = share_reference(attentions, real, rows, sieves, entropy=True, entropy_by_n=True)
    finite = np.isfinite(expected[1])
    assert not np.allclose(scores[1][finite], wrong[1][finite], rtol=ENTROPY_RTOL, atol=0)


# -- the setting, end to end ---------------------------------------------------------------------


def test_the_score_flag_reads_beta_or_share_and_names_the_reference_length() -> None:
    assert roles_cli.parse_args(["--ckpt", "x"]).score == "beta"
    assert roles_cli.parse_args(["--ckpt", "x", "--score", "share"]).score == "share"
    with pytest.raises(SystemExit):
        roles_cli.parse_args(["--ckpt", "x", "--score", "shares"])
    field = {f.name: f for f in dataclasses.fields(roles_config.RolesConfig)}["score"]
    assert f"/{REFERENCE_LENGTH}" in field.metadata["setting"]["help"]


def test_the_scores_cache_is_keyed_by_the_score_only_off_its_default() -> None:
    config = roles_config.RolesConfig(ckpt="x")
    key = settings_key(config, {}, "tok", None)
    assert "score" not in key
    shared = settings_key(dataclasses.replace(config, score="share"), {}, "tok", None)
    assert shared == key | {"score": "share"}


ROLES = "prev,next,local,cls,sep"


@pytest.fixture(scope="module")
def two_runs(tiny_hf, shared_data, tmp_path_factory):
    """analysis.roles on the tiny random BERT, MRPC, with β and with `--score share`."""
    runs = {}
    for score in ("beta", "share"):
        out = tmp_path_factory.mktemp("share") / score
        roles_cli.main(["--ckpt", str(tiny_hf), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"),
                        "--n", "12", "--batch-size", "4", "--roles", ROLES, "--figures", "none", "--score", score,
                        "--out", str(out)])  # fmt: skip
        runs[score] = out
    return runs


def test_roles_cli_scores_the_share_and_records_it(two_runs, tiny_hf, shared_data):
    share_run = json.loads((two_runs["share"] / "run.json").read_text())
    assert share_run["config"]["score"] == "share"
    assert json.loads((two_runs["beta"] / "run.json").read_text())["config"]["score"] == "beta"
    config = roles_config.RolesConfig(ckpt=str(tiny_hf), task=("mrpc",), glue_dir=str(shared_data / "glue"), n=12,
                                      roles=tuple(ROLES.split(",")))  # fmt: skip
    data = examples.load_tasks(config, ["mrpc"])
    seqs = examples.encode_tasks(config, data, bertjax.load_tokenizer(str(tiny_hf)), None, {})["mrpc"]
    length = {seq.index: seq.length for seq in seqs}
    with np.load(two_runs["beta"] / "scores.npz") as beta, np.load(two_runs["share"] / "scores.npz") as share:
        for role in ROLES.split(","):
            index = share[f"mrpc/{role}/index"]
            np.testing.assert_array_equal(index, beta[f"mrpc/{role}/index"])
            n = np.array([length[i] for i in index], np.float64)[:, None, None]
            assert (n < REFERENCE_LENGTH).all()
            # Per sequence, share = β · N / n: the same float32 kernel on the same batches but for
            # the one division, each score within F32_RTOL-like bounds at the padded length (≤ 128):
            # (T² + T + 2)u each, so 2·(128² + 130)u + u apart.
            np.testing.assert_allclose(
                share[f"mrpc/{role}"], beta[f"mrpc/{role}"] * REFERENCE_LENGTH / n,
                rtol=2 * (128**2 + 130) * U + U, atol=0,
            )  # fmt: skip
            assert not np.allclose(share[f"mrpc/{role}"], beta[f"mrpc/{role}"], rtol=0.5)


def test_finetune_effect_scores_the_share_as_roles_does(two_runs, tiny_hf, shared_data, tmp_path):
    """The pre-trained side of finetune_effect's head means under `--score share` is roles.csv's."""
    out = tmp_path / "effect"
    effect_cli.main(["--pre", str(tiny_hf), "--post", f"{tiny_hf}:mrpc", "--task", "mrpc", "--glue-dir",
                     str(shared_data / "glue"), "--n", "12", "--batch-size", "4", "--roles", ROLES, "--no-figures",
                     "--score", "share", "--out", str(out)])  # fmt: skip
    assert json.loads((out / "run.json").read_text())["config"]["data"]["score"] == "share"
    means = pd.read_csv(out / "head_means.csv")
    table = pd.read_csv(two_runs["share"] / "roles.csv")
    merged = means.merge(table, on=["task", "layer", "head", "role"])
    assert len(merged) == len(table) == len(means)
    # head_means holds float32 means (8 digits), roles.csv float64 ones of the same scores.
    np.testing.assert_allclose(merged["pre"], merged["mean"], rtol=1e-6)


def test_track_scores_the_share_and_keys_its_cache_on_it(two_runs, tiny_hf, shared_data, tmp_path):
    """Two steps tracked with β, then with the share into the same scores cache: the share run
    scores afresh (a β entry does not serve it), and its last step's means are those of
    analysis.roles --score share on that checkpoint."""
    run = write_run(tmp_path / "run", shared_data, (1, 4))
    flags = ["--run", str(run), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "12",
             "--batch-size", "4", "--roles", ROLES, "--bootstrap", "0", "--no-figures",
             "--scores-cache", str(tmp_path / "cache")]  # fmt: skip
    tracked = {}
    for score in ("beta", "share"):
        track_cli.main([*flags, "--score", score, "--out", str(tmp_path / score)])
        tracked[score] = pd.read_csv(tmp_path / score / "track.csv")
    assert json.loads((tmp_path / "share" / "run.json").read_text())["config"]["roles"]["score"] == "share"
    assert len(list((tmp_path / "cache").rglob("*.npz"))) == 4  # two steps, two scores
    last = tmp_path / "last"
    roles_cli.main(["--ckpt", str(run), "--step", "4", "--task", "mrpc", "--glue-dir", str(shared_data / "glue"),
                    "--n", "12", "--batch-size", "4", "--roles", ROLES, "--figures", "none", "--score", "share",
                    "--out", str(last)])  # fmt: skip
    table = pd.read_csv(last / "roles.csv")
    keys = ["task", "layer", "head", "role"]
    share = tracked["share"][tracked["share"]["step"] == 4].merge(table, on=keys, suffixes=("", "_roles"))
    assert len(share) == len(table)
    np.testing.assert_array_equal(share["mean"], share["mean_roles"])  # the same scores, the same mean
    beta = tracked["beta"][tracked["beta"]["step"] == 4].merge(table, on=keys, suffixes=("", "_roles"))
    assert (beta["mean"] < 0.9 * beta["mean_roles"]).all()  # every n < 128: β is below the share score
