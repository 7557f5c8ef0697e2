"""The jitted sieve bias kernel equals the slow, obvious per-token loop."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sieves.kernel import sieve_scores

# Fixed tiny shapes so the kernel compiles once per dtype.
L, B, H, T, R = 2, 3, 2, 6, 3
# The kernel's rounding error, relative (no cancellation: every term is ≥ 0): one contraction of T²
# terms (≤ T²·u), a row mass of T terms (≤ T·u) and two divisions, u = 2⁻²⁴ in float32 and 2⁻⁵³ in
# float64; the float64 reference adds as much again. Holds on any CPU; XLA's vector width only moves
# the summation order inside it.
F32_RTOL = (T**2 + T + 2) * 2.0**-24
F64_RTOL = 2 * (T**2 + T + 2) * 2.0**-53


def sieve_scores_reference(
    attentions: np.ndarray, real: np.ndarray, rows: np.ndarray, sieves: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """docs/roles.md's β and per-sequence mean, one token at a time, in float64."""
    attentions = np.asarray(attentions, dtype=np.float64)
    num_roles, batch = rows.shape[:2]
    layers, _, heads = attentions.shape[:3]
    scores = np.full((num_roles, batch, layers, heads), np.nan)
    counts = np.zeros((num_roles, batch), dtype=np.int32)
    for r in range(num_roles):
        for b in range(batch):
            n = int(real[b].sum())
            scored = [t for t in range(attentions.shape[-1]) if rows[r, b, t]]
            counts[r, b] = len(scored)
            if not scored:
                continue
            for layer in range(layers):
                for head in range(heads):
                    betas = []
                    for t in scored:
                        sieve = [s for s in range(attentions.shape[-1]) if sieves[r, b, t, s]]
                        keys = [s for s in range(attentions.shape[-1]) if real[b, s]]
                        alpha = attentions[layer, b, head, t]
                        in_sieve = sum(alpha[s] for s in sieve) / len(sieve)
                        overall = sum(alpha[s] for s in keys) / n
                        betas.append(in_sieve / overall)
                    scores[r, b, layer, head] = sum(betas) / len(betas)
    return scores, counts


@st.composite
def kernel_inputs(draw) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # Hypothesis draws the structure (lengths, densities, extreme logits); a drawn seed fills the
    # bulk, since element-by-element arrays this size trip Hypothesis' input-size health check.
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = np.array(draw(st.lists(st.integers(1, T), min_size=B, max_size=B)))
    real = np.arange(T)[None, :] < lengths[:, None]
    logits = draw(hnp.arrays(np.float64, (L, B, H, T, T), elements=st.floats(-12, 12)))
    logits = logits + draw(st.sampled_from([0.0, 1.0, 5.0])) * rng.normal(size=logits.shape)
    keys = real[None, :, None, None, :]
    weights = np.where(keys, np.exp(logits), 0.0)
    attentions = weights / weights.sum(-1, keepdims=True)
    # Padding query rows carry no attention at all, the harshest case for NaN leaks.
    attentions = np.where(real[None, :, None, :, None], attentions, 0.0)
    sieve_density, row_density = draw(st.floats(0.1, 1.0)), draw(st.floats(0.2, 1.0))
    sieves = (rng.random((R, B, T, T)) < sieve_density) & real[None, :, None, :]
    rows = (rng.random((R, B, T)) < row_density) & real[None] & sieves.any(-1)
    return attentions, real, rows, sieves


@settings(max_examples=30, deadline=None)
@given(kernel_inputs())
def test_matches_reference_in_float64(inputs) -> None:
    expected_scores, expected_counts = sieve_scores_reference(*inputs)
    with jax.enable_x64(True):
        scores, counts = sieve_scores(*(jnp.asarray(x) for x in inputs))
        assert scores.dtype == jnp.float64
        scores, counts = np.asarray(scores), np.asarray(counts)
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_array_equal(np.isnan(scores), np.isnan(expected_scores))
    assert (np.isnan(scores) == (expected_counts == 0)[..., None, None]).all()
    np.testing.assert_allclose(scores, expected_scores, rtol=F64_RTOL, atol=0)


@settings(max_examples=10, deadline=None)
@given(kernel_inputs())
def test_matches_reference_in_float32(inputs) -> None:
    attentions, real, rows, sieves = inputs
    attentions = attentions.astype(np.float32)
    expected_scores, _ = sieve_scores_reference(attentions, real, rows, sieves)
    scores, counts = sieve_scores(attentions, real, rows, sieves)
    assert scores.dtype == jnp.float32 and counts.dtype == jnp.int32
    np.testing.assert_allclose(np.asarray(scores), expected_scores, rtol=F32_RTOL, atol=0)


@settings(max_examples=20, deadline=None)
@given(kernel_inputs(), hnp.arrays(np.float64, (L, B, H, T, 1), elements=st.floats(-3, 3)))
def test_unnormalised_rows_divide_by_their_mean_real_attention(inputs, log_scales) -> None:
    """Rows scaled by unrelated positive factors, so Σ_{s∈I} α(t,s) / n is not 1/n: a kernel that
    assumed normalised rows would pass the tests above but not this one. β is scale-free per row."""
    attentions, real, rows, sieves = inputs
    scaled = attentions * 10.0**log_scales
    expected_scores, expected_counts = sieve_scores_reference(scaled, real, rows, sieves)
    # Scaling a row by 10^±3 rounds each α once more in float64: ~(T²+T+2) ulps, far inside 1e-9.
    np.testing.assert_allclose(expected_scores, sieve_scores_reference(*inputs)[0], rtol=1e-9, atol=0)
    with jax.enable_x64(True):
        scores, counts = sieve_scores(*(jnp.asarray(x) for x in (scaled, real, rows, sieves)))
        scores, counts = np.asarray(scores), np.asarray(counts)
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_array_equal(np.isnan(scores), np.isnan(expected_scores))
    np.testing.assert_allclose(scores, expected_scores, rtol=F64_RTOL, atol=0)


def fixed_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    real = np.arange(T)[None, :] < np.array([6, 4, 1])[:, None]
    weights = np.where(real[None, :, None, None, :], rng.random((L, B, H, T, T)), 0.0)
    attentions = (weights / weights.sum(-1, keepdims=True)).astype(np.float32)
    sieves = (rng.random((R, B, T, T)) < 0.5) & real[None, :, None, :]
    rows = (rng.random((R, B, T)) < 0.7) & real[None] & sieves.any(-1)
    rows[1, 0] = False
    return attentions, real, rows, sieves


def test_sequence_without_scored_rows_is_nan() -> None:
    attentions, real, rows, sieves = fixed_inputs()
    scores, counts = sieve_scores(attentions, real, rows, sieves)
    assert counts[1, 0] == 0 and np.isnan(np.asarray(scores[1, 0])).all()
    assert np.isfinite(np.asarray(scores))[np.asarray(counts) > 0].all()


def test_uniform_attention_scores_one() -> None:
    # Uniform attention over the real keys makes every β exactly 1, whatever the sieve.
    _, real, rows, sieves = fixed_inputs()
    uniform = real / real.sum(-1, keepdims=True)  # [B, keys]
    attentions = np.broadcast_to(uniform[None, :, None, None, :], (L, B, H, T, T))
    scores, counts = sieve_scores(attentions.astype(np.float32), real, rows, sieves)
    np.testing.assert_allclose(np.asarray(scores)[np.asarray(counts) > 0], 1.0, rtol=F32_RTOL)


def test_bfloat16_input_reduces_in_float32() -> None:
    attentions, real, rows, sieves = fixed_inputs()
    low = jnp.asarray(attentions, dtype=jnp.bfloat16)
    scores, _ = sieve_scores(low, real, rows, sieves)
    assert scores.dtype == jnp.float32
    expected, _ = sieve_scores_reference(np.asarray(low.astype(jnp.float32)), real, rows, sieves)
    # The reference reads the same bfloat16 values: only the float32 reduction differs.
    np.testing.assert_allclose(np.asarray(scores), expected, rtol=F32_RTOL)


def test_usable_inside_another_jit() -> None:
    attentions, real, rows, sieves = fixed_inputs()

    @jax.jit
    def fused(logits, real, rows, sieves):
        probabilities = jax.nn.softmax(jnp.where(real[None, :, None, None, :], logits, -jnp.inf), axis=-1)
        return sieve_scores(probabilities, real, rows, sieves)

    logits = np.log(np.where(attentions > 0, attentions, 1.0))
    scores, counts = fused(logits, real, rows, sieves)
    expected, expected_counts = sieve_scores_reference(attentions, real, rows, sieves)
    np.testing.assert_array_equal(np.asarray(counts), expected_counts)
    # The softmax is recomputed in float32 (exp to a few ulps, its own row sum of T terms), which
    # adds ~2·(T+4)·u per β to the kernel's bound; 1e-5 (~170 u) leaves room for XLA's exp.
    np.testing.assert_allclose(np.asarray(scores), expected, rtol=1e-5)


@pytest.mark.parametrize("role_count", [1, 4])
def test_any_number_of_roles(role_count: int) -> None:
    attentions, real, rows, sieves = fixed_inputs()
    rows = np.concatenate([rows] * 2)[:role_count]
    sieves = np.concatenate([sieves] * 2)[:role_count]
    scores, counts = sieve_scores(attentions, real, rows, sieves)
    assert scores.shape == (role_count, B, L, H) and counts.shape == (role_count, B)
    expected, _ = sieve_scores_reference(attentions, real, rows, sieves)
    np.testing.assert_allclose(np.asarray(scores), expected, rtol=F32_RTOL)


def test_the_float32_bound_catches_a_wrong_sieve_or_a_missing_normalisation() -> None:
    """Planted bugs in the reference: each moves some β far past F32_RTOL (~2.6e-6), so the bound
    above does not hide a wrong kernel."""
    attentions, real, rows, sieves = fixed_inputs()
    scores = np.asarray(sieve_scores(attentions, real, rows, sieves)[0])
    finite = np.isfinite(scores)
    shifted = np.roll(sieves, 1, axis=-1) & real[None, :, None, :]  # off by one key
    # The row's mass not divided by n (Σ_I α instead of Σ_I α / n) divides β by n.
    unnormalised = sieve_scores_reference(attentions, real, rows, sieves)[0] / real.sum(-1)[None, :, None, None]
    for wrong in (sieve_scores_reference(attentions, real, rows & shifted.any(-1), shifted)[0], unnormalised):
        assert not np.allclose(scores[finite], wrong[finite], rtol=F32_RTOL, atol=0)


# Key weights (Kobayashi et al.'s norms) multiply each cell once more in float32 before the kernel's
# sums: ≤ u per cell, so ≤ 2u more on β, a ratio of two sums of such cells.
KEYED_F32_RTOL = F32_RTOL + 2 * 2.0**-24


def renormalised(attentions: np.ndarray, key_weights: np.ndarray) -> np.ndarray:
    """α(t,s)·k(s) with each row divided by its sum (a zero row stays 0), in float64."""
    weighted = np.asarray(attentions, np.float64) * np.asarray(key_weights, np.float64)[..., None, :]
    total = weighted.sum(-1, keepdims=True)
    return weighted / np.where(total > 0, total, 1.0)


@settings(max_examples=20, deadline=None)
@given(kernel_inputs(), hnp.arrays(np.float64, (L, B, H, T), elements=st.floats(-2, 2)))
def test_key_weights_score_the_renormalised_weighted_rows(inputs, log_weights) -> None:
    """β with `key_weights` is β of docs/roles.md on the rows α(t,s)·k(s) / Σ_s' α(t,s')·k(s'), which the
    kernel never forms."""
    attentions, real, rows, sieves = inputs
    attentions = attentions.astype(np.float32)
    key_weights = (10.0**log_weights).astype(np.float32)
    expected, expected_counts = sieve_scores_reference(renormalised(attentions, key_weights), real, rows, sieves)
    scores, counts = sieve_scores(attentions, real, rows, sieves, key_weights=key_weights)
    np.testing.assert_array_equal(np.asarray(counts), expected_counts)
    np.testing.assert_allclose(np.asarray(scores), expected, rtol=KEYED_F32_RTOL, atol=0)


def test_the_keyed_bound_catches_weights_on_the_wrong_axis_or_left_out() -> None:
    """Planted defects: the key weights applied per query row (which β, a ratio over the row, does
    not see) or not at all move some β far past KEYED_F32_RTOL."""
    attentions, real, rows, sieves = fixed_inputs()
    key_weights = np.random.default_rng(1).uniform(0.05, 5.0, (L, B, H, T)).astype(np.float32)
    scores = np.asarray(sieve_scores(attentions, real, rows, sieves, key_weights=key_weights)[0])
    finite = np.isfinite(scores)
    for wrong_rows in (attentions * key_weights[..., :, None], attentions):
        wrong, _ = sieve_scores_reference(wrong_rows, real, rows, sieves)
        assert not np.allclose(scores[finite], wrong[finite], rtol=KEYED_F32_RTOL, atol=0)


def test_key_weights_keep_a_zero_row_and_the_entropy_variant() -> None:
    """A head whose weights are all 0 (masked) scores NaN with key weights as its renormalised row,
    0, does; β · row entropy (`entropy_roles`) with key weights is that of the renormalised rows."""
    attentions, real, rows, sieves = fixed_inputs()
    attentions[0, 0, 1] = 0.0
    key_weights = np.random.default_rng(1).uniform(0.05, 5.0, (L, B, H, T)).astype(np.float32)
    entropy = (False, True, False)
    keyed, _ = sieve_scores(attentions, real, rows, sieves, entropy_roles=entropy, key_weights=key_weights)
    rows_first = renormalised(attentions, key_weights).astype(np.float32)
    expected, _ = sieve_scores(rows_first, real, rows, sieves, entropy_roles=entropy)
    keyed, expected = np.asarray(keyed), np.asarray(expected)
    assert np.isnan(keyed[:, 0, 0, 1]).all() and np.isnan(expected[:, 0, 0, 1]).all()
    np.testing.assert_array_equal(np.isnan(keyed), np.isnan(expected))
    # Two float32 computations of each β (the renormalised rows rounded once more to float32, ≤ u
    # a cell), and the entropy term's own T-term sum and logs in each: ~2(T² + 2T + 8)·u.
    np.testing.assert_allclose(keyed, expected, rtol=2 * (T**2 + 2 * T + 8) * 2.0**-24, atol=0)
