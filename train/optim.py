"""Optimizers: LAMB (You et al. 2019, the paper's) or AdamW, with linear warm-up then polynomial
decay, global-norm clipping, and weight decay (and LAMB's trust ratio) that skips LayerNorm
parameters and biases."""

from __future__ import annotations

import jax
import optax

from bertjax.checkpoint import SEP
from train.config import OptimizerConfig


def schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    steps = config.warmup_steps if config.warmup_fraction is None else round(config.warmup_fraction * total_steps)
    warmup = min(steps, total_steps)
    decay = optax.polynomial_schedule(
        init_value=config.learning_rate,
        end_value=config.end_learning_rate,
        power=config.decay_power,
        transition_steps=max(total_steps - warmup, 1),
    )
    if warmup == 0:
        return decay
    ramp = optax.linear_schedule(0.0, config.learning_rate, warmup)
    return optax.join_schedules([ramp, decay], boundaries=[warmup])


def decay_mask(params):
    """True where weight decay applies: every parameter but LayerNorm scales/biases and biases.
    Takes nested trees and flat dicts keyed by "a/b/c" paths (the trainer's, `flatten_params`)."""

    def decays(path, _):
        names = [name for p in path for name in str(getattr(p, "key", getattr(p, "name", p))).split(SEP)]
        return names[-1] not in ("bias", "scale") and "LayerNorm" not in names

    return jax.tree_util.tree_map_with_path(decays, params)


def lamb(config: OptimizerConfig, lr: optax.Schedule) -> optax.GradientTransformation:
    """LAMB with the reference implementations' exclusions: parameters without weight decay take
    no trust ratio either (`exclude_from_layer_adaptation` in BERT's and ALBERT's LAMB, apex's
    default). `optax.lamb` rescales every leaf by ‖w‖/‖u‖, which pins a zero-initialised bias
    near zero: its steps shrink to lr·‖b‖."""
    return optax.chain(
        optax.scale_by_adam(config.b1, config.b2, config.eps),
        optax.add_decayed_weights(config.weight_decay, decay_mask),
        optax.masked(optax.scale_by_trust_ratio(), decay_mask),
        optax.scale_by_learning_rate(lr),
    )


def make_optimizer(config: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    lr = schedule(config, total_steps)
    if config.name == "lamb":
        core = lamb(config, lr)
    else:
        core = optax.adamw(lr, config.b1, config.b2, config.eps, weight_decay=config.weight_decay, mask=decay_mask)
    clip = optax.clip_by_global_norm(config.max_grad_norm) if config.max_grad_norm > 0 else optax.identity()
    return optax.chain(clip, core)
