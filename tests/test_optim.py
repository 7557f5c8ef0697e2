"""The optimizers against a slow, obvious reference: which parameters decay, and LAMB's steps."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import bertjax
from bertjax import checkpoint as ckpt
from bertjax.model import BertForPreTraining
from train.optim import OptimizerConfig, decay_mask, make_optimizer


def test_decay_mask_skips_layernorm_and_biases_of_the_trainers_flat_params():
    model = nnx.eval_shape(lambda: BertForPreTraining(bertjax.preset("tiny"), rngs=nnx.Rngs(params=0)))
    params = ckpt.flatten_params(nnx.state(model, nnx.Param))
    mask = decay_mask(params)
    exempt = {k for k in params if k.endswith("/bias") or "/LayerNorm/" in k}
    assert {k for k, decays in mask.items() if not decays} == exempt
    assert "bert/encoder/layer/0/attention/output/LayerNorm/scale" in exempt
    assert mask["bert/embeddings/word_embeddings/embedding"] and mask["bert/encoder/layer/1/output/dense/kernel"]
    nested = {"layer": {"dense": {"kernel": 0, "bias": 0}, "LayerNorm": {"scale": 0}}}
    assert decay_mask(nested) == {"layer": {"dense": {"kernel": True, "bias": False}, "LayerNorm": {"scale": False}}}


def reference_lamb(params, grads_per_step, config: OptimizerConfig, lr: float, bias_correction: bool = True):
    """LAMB as in BERT's reference optimizer, one leaf at a time, in float64: Adam moments with
    bias correction, decoupled weight decay and the trust ratio ‖w‖/‖u‖ only where decay applies."""
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    for step, grads in enumerate(grads_per_step, start=1):
        for k, w in params.items():
            g = np.asarray(grads[k], np.float64)
            m[k] = config.b1 * m[k] + (1 - config.b1) * g
            v[k] = config.b2 * v[k] + (1 - config.b2) * g * g
            c1, c2 = (1 - config.b1**step, 1 - config.b2**step) if bias_correction else (1.0, 1.0)
            update = (m[k] / c1) / (np.sqrt(v[k] / c2) + config.eps)
            decays = not (k.endswith("bias") or "LayerNorm" in k)
            ratio = 1.0
            if decays:
                update = update + config.weight_decay * w
                w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(update)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            params[k] = w - lr * ratio * update
    return params


def test_lamb_matches_the_reference_and_exempts_biases_from_the_trust_ratio():
    rng = np.random.default_rng(0)
    params = {
        "layer/dense/kernel": rng.normal(size=(6, 4)).astype(np.float32) * 0.02,
        "layer/dense/bias": np.zeros(4, np.float32),
        "layer/LayerNorm/scale": np.ones(4, np.float32),
    }
    grads = [{k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()} for _ in range(5)]
    config = OptimizerConfig(name="lamb", learning_rate=1e-2, weight_decay=0.1, max_grad_norm=0.0)
    tx = make_optimizer(config, total_steps=1_000_000)  # the schedule stays at its peak over 5 steps
    state, current = tx.init(params), params
    for g in grads:
        updates, state = tx.update(g, state, current)
        current = optax.apply_updates(current, updates)
    expected = reference_lamb(params, grads, config, lr=1e-2)
    # float64 reference. Each float32 step rounds ~10 times per entry (moments, corrections, root,
    # division, update) and takes norms of ≤ 24 terms: 5 steps·(10 + 24)·u ≈ 1e-5 relative; the
    # atol covers the zero-started bias's first digits. A bias step without the Adam bias correction
    # is 0.32× the right one at step 1 and fails the same bound (planted below).
    for k in params:
        np.testing.assert_allclose(np.asarray(current[k]), expected[k], rtol=2e-5, atol=1e-7, err_msg=k)
    wrong = reference_lamb(params, grads, config, lr=1e-2, bias_correction=False)
    assert not np.allclose(np.asarray(current["layer/dense/bias"]), wrong["layer/dense/bias"], rtol=2e-5, atol=1e-7)


def test_a_zero_bias_under_a_steady_gradient_moves_like_adam():
    # optax.lamb alone rescales the bias by ‖b‖/‖u‖ and it stays near its first step (≈ lr).
    params = {"dense/kernel": np.full((3, 3), 0.5, np.float32), "dense/bias": np.zeros(3, np.float32)}
    grads = {k: np.ones_like(v) for k, v in params.items()}
    config = OptimizerConfig(name="lamb", learning_rate=1e-3, weight_decay=0.0, max_grad_norm=0.0)
    tx = make_optimizer(config, total_steps=1_000_000)
    state = tx.init(params)
    step = jax.jit(lambda p, s: tx.update(grads, s, p))
    for _ in range(10):
        updates, state = step(params, state)
        params = optax.apply_updates(params, updates)
    # 10 Adam steps of g/(√g² + ε) = 1 − 1e-6 each, the linear decay's lr(1 − k/10⁶) (mean 4.5e-6
    # below peak) and 10 float32 adds (10·u): ≤ 6e-6 relative. optax.lamb alone is ~10× off.
    assert np.asarray(params["dense/bias"]) == pytest.approx(np.full(3, -10 * 1e-3), rel=2e-5)
