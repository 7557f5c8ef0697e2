"""Optimizers: LAMB (You et al. 2019, the paper's) or AdamW, with linear warm-up then polynomial
decay, global-norm clipping, and weight decay (and LAMB's trust ratio) that skips LayerNorm
parameters and biases."""

from __future__ import annotations

import dataclasses
import math

import jax
import optax

from bertjax.checkpoint import SEP
from bertjax.errors import UserError

OPTIMIZERS = ("lamb", "adamw")


@dataclasses.dataclass
class OptimizerConfig:
    name: str = "lamb"  # lamb | adamw
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    # Warm-up as a share of the step budget instead (exclusive with warmup_steps): the schedule then
    # keeps its shape when the budget changes, e.g. 0.5 for Cramming's triangle (Izsak et al. 2021
    # and Geiping & Goldstein 2022 end warm-up and decay with the budget). The decay always ends at
    # the last step.
    warmup_fraction: float | None = None
    decay_power: float = 1.0  # 1.0: linear decay, as in BERT
    end_learning_rate: float = 0.0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    max_grad_norm: float = 1.0  # 0 disables clipping

    def __post_init__(self) -> None:
        # Checked with the other settings, before a run writes anything: a NaN rate would only
        # show as a non-finite update at step 1. Every config names this section `optimizer`.
        if self.name not in OPTIMIZERS:
            raise UserError(f"optimizer.name: {self.name!r} is not {' or '.join(OPTIMIZERS)}")
        for name in ("learning_rate", "end_learning_rate"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise UserError(f"optimizer.{name}: must be a finite number ≥ 0, got {value}")
        for name, low, high in (("b1", 0, 1), ("b2", 0, 1)):  # Adam's moment decays: in [0, 1)
            value = getattr(self, name)
            if not low <= value < high:
                raise UserError(f"optimizer.{name}: must be in [0, 1), got {value}")
        # Accepted before, and trained on: a negative eps or decay turned the update around, a NaN
        # clipping norm turned every update into NaN.
        for name in ("eps", "weight_decay", "max_grad_norm", "decay_power"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise UserError(f"optimizer.{name}: must be a finite number ≥ 0, got {value}")
        if self.warmup_fraction is not None:
            if not 0 <= self.warmup_fraction <= 1:
                raise UserError(f"optimizer.warmup_fraction: must be in [0, 1], got {self.warmup_fraction}")
            if self.warmup_steps:
                raise UserError("optimizer.warmup_fraction: set it or warmup_steps, not both")


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
