"""Steering head roles during pre-training: a penalty on a role's sieve bias β, from the training
batch's own attention, added to the loss (the `intervene` section, docs/pretraining.md).

β is the analyses' (`sieves.kernel.sieve_scores`, the per-sequence mean over the scored rows of
docs/roles.md's β), on the sieves of docs/roles.md's positional roles. Those depend only on where the real
tokens, [CLS] and the [SEP]s are, so they are built here in jnp inside the step (`layout_masks`,
equal to `sieves.builders.build_batch` on the same sequences: tests/test_interventions.py) rather
than on the host for every batch. The specials come from the pre-training layout, `[CLS] A [SEP]
B [SEP]` (`train.instances.pack`): [CLS] at position 0, a [SEP] where the token type changes and at
the last real token. Not from the ids: masked-LM's random replacement may put a [CLS] or [SEP] id
anywhere, and the sequence the model reads has [MASK] where the text had the token.

The penalty of one intervention, on the (layer, head) pairs it selects, β̄ each head's batch mean
of the per-sequence β (sequences with a scored row):

    suppress:  weight · mean_heads relu(log β̄)             (zero once β̄ ≤ 1, chance)
    promote:   weight · mean_heads relu(log τ − log β̄)     (zero once β̄ ≥ τ, `target`)

A hinge on log β, because: it is zero at the goal, so it steers without pulling a head past it
(suppress does not make heads avoid the sieve, which would be a role of its own); log makes it
scale-free across roles whose β ranges differ by orders of magnitude (cls reaches n, prev n/2, local
n/5 on an n-token sequence), so one weight means the same for every role; and its gradient in β,
1/β̄, is at most 1 on suppress's active side (β̄ > 1), bounded however far a head is from chance.
Promote's 1/β̄ grows as β̄ → 0; β̄ is floored at `BETA_FLOOR` so a head that gives the sieve no
attention at all gets a large, finite gradient rather than an infinite one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from bertjax.errors import UserError
from sieves.builders import ROLES, SieveOptions
from sieves.kernel import sieve_scores
from train.config import InterventionConfig

MODES = ("suppress", "promote")
CHANCE = 1.0  # β of attention spread uniformly over the real tokens
BETA_FLOOR = 1e-6  # promote's log β̄ is read at max(β̄, this): chance is 1, so this is no attention at all


def _offsets(length: int) -> jax.Array:
    """offsets[t, s] = s − t."""
    positions = jnp.arange(length)
    return positions[None, :] - positions[:, None]


def _columns(keys: jax.Array) -> jax.Array:
    """S(t) = the keys marked, for every row t: [B, T] → [B, T, T]."""
    return jnp.broadcast_to(keys[:, None, :], (*keys.shape, keys.shape[-1]))


def _local(layout: dict[str, jax.Array], options: SieveOptions) -> jax.Array:
    return jnp.abs(_offsets(layout["real"].shape[-1]))[None] <= options.window


def _prev(layout: dict[str, jax.Array], options: SieveOptions) -> jax.Array:
    offsets = _offsets(layout["real"].shape[-1])[None]
    return (offsets >= -options.window) & (offsets <= -1)


def _next(layout: dict[str, jax.Array], options: SieveOptions) -> jax.Array:
    offsets = _offsets(layout["real"].shape[-1])[None]
    return (offsets >= 1) & (offsets <= options.window)


def _block(layout: dict[str, jax.Array], options: SieveOptions) -> jax.Array:
    segments = layout["segments"]
    row_segment = jnp.where(layout["first_sep"], 1, segments) if options.first_sep_in_b else segments
    return (row_segment[:, :, None] == segments[:, None, :]) & ~layout["special"][:, None, :]


# The positional roles' sieves S(t) on the padded batch, before they are cut to the real tokens.
# A role's scored rows are then the real tokens (those that are not special without
# `special_rows`) whose S(t) keeps a real token: that drops prev's first row and next's last, as
# their builders do, and every row of a sequence whose segment holds no other token.
LAYOUT_SIEVES = {
    "local": _local,
    "prev": _prev,
    "next": _next,
    "block": _block,
    "cls": lambda layout, options: _columns(layout["is_cls"]),
    "sep": lambda layout, options: _columns(layout["is_sep"]),
    "delimiter": lambda layout, options: _columns(layout["is_cls"] | layout["is_sep"]),
}
STEERABLE = tuple(LAYOUT_SIEVES)


def layout(attention_mask: jax.Array, token_type_ids: jax.Array) -> dict[str, jax.Array]:
    """Where the real tokens, [CLS], the [SEP]s and the segments are in pre-training batches
    ([B, T] each; see the module's doc)."""
    real = attention_mask > 0
    length = real.shape[-1]
    positions = jnp.arange(length)[None, :]
    n = real.sum(-1, keepdims=True)
    types = token_type_ids.astype(jnp.int32)
    following = jnp.concatenate([types[:, 1:], types[:, -1:]], axis=1)
    is_sep = real & ((positions == n - 1) | (following != types))
    is_cls = real & (positions == 0)
    first = jnp.argmax(is_sep, axis=-1)[:, None]
    # `EncodedSequence.segments`: 0 up to and including the first separator, 1 after it.
    segments = jnp.where(is_sep.any(-1, keepdims=True), positions > first, types != 0).astype(jnp.int32)
    return {
        "real": real,
        "is_cls": is_cls,
        "is_sep": is_sep,
        "special": is_cls | is_sep,
        "segments": segments,
        "first_sep": is_sep & (positions == first),
    }


def layout_masks(
    roles: Sequence[str], attention_mask: jax.Array, token_type_ids: jax.Array, options: SieveOptions | None = None
) -> tuple[jax.Array, jax.Array]:
    """`sieves.builders.build_batch`'s masks for the positional `roles` of a padded pre-training
    batch: rows bool[R, B, T], sieves bool[R, B, T, T], padding rows and columns False; `options`
    the builders' (default: the analyses' defaults)."""
    options = options or SieveOptions()
    where = layout(attention_mask, token_type_ids)
    real = where["real"]
    scored = real if options.special_rows else real & ~where["special"]
    rows, sieves = [], []
    for role in roles:
        sieve = LAYOUT_SIEVES[role](where, options) & real[:, :, None] & real[:, None, :]
        sieves.append(sieve)
        rows.append(scored & sieve.any(-1))
    return jnp.stack(rows), jnp.stack(sieves)


@dataclasses.dataclass(frozen=True)
class Steering:
    """One intervention, resolved: the role, the (layer, head) pairs and the step window [start,
    stop) it acts on (`stop` None: to the end)."""

    name: str
    role: str
    mode: str
    weight: float
    target: float
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    start: int
    stop: int | None


def check_config(entries: Sequence[InterventionConfig], num_layers: int, num_heads: int) -> list[Steering]:
    """The `intervene` section's errors, one line each naming the entry's key, before any data
    work; the entries resolved for the model's `num_layers` × `num_heads` heads."""
    resolved = []
    for i, entry in enumerate(entries):
        key = f"intervene.{i}"
        role = ROLES.get(entry.role)
        if role is None:
            raise UserError(f"{key}.role: {entry.role!r} is not a role; steerable: {', '.join(STEERABLE)}")
        if role.needs_parse:
            raise UserError(
                f"{key}.role: {entry.role} needs dependency parses, which the pre-training data does not carry; "
                f"steerable: {', '.join(STEERABLE)}"
            )
        if entry.role not in LAYOUT_SIEVES:
            raise UserError(f"{key}.role: {entry.role} has no sieve built in the step; steerable: {', '.join(STEERABLE)}")  # fmt: skip
        if entry.mode not in MODES:
            raise UserError(f"{key}.mode: {entry.mode!r} is not {' or '.join(MODES)}")
        if not math.isfinite(entry.weight) or entry.weight < 0:
            raise UserError(f"{key}.weight: must be a finite number ≥ 0, got {entry.weight}")
        if not math.isfinite(entry.target) or entry.target <= 0:
            raise UserError(f"{key}.target: must be a finite number > 0 (a β), got {entry.target}")
        layers = _indices(f"{key}.layers", entry.layers, num_layers, "layers")
        heads = _indices(f"{key}.heads", entry.heads, num_heads, "heads per layer")
        if entry.start < 0:
            raise UserError(f"{key}.start: must be a step ≥ 0, got {entry.start}")
        if entry.stop is not None and entry.stop <= entry.start:
            raise UserError(f"{key}.stop: {entry.stop} is not after start {entry.start}; the window [start, stop) is empty")  # fmt: skip
        settings = {k: getattr(entry, k) for k in ("role", "mode", "weight", "target", "start", "stop")}
        resolved.append(Steering(name=f"{i}-{entry.role}", layers=layers, heads=heads, **settings))
    return resolved


def _indices(key: str, given: list[int] | None, count: int, what: str) -> tuple[int, ...]:
    if given is None:
        return tuple(range(count))
    if not given:
        raise UserError(f"{key}: name at least one, or null for all {count}")
    outside = [i for i in given if not 0 <= i < count]
    if outside:
        raise UserError(f"{key}: {outside[0]} is out of range; the model has {count} {what} (0 to {count - 1})")
    if len(set(given)) < len(given):
        raise UserError(f"{key}: {given} names one twice")
    return tuple(given)


def hinge(beta: jax.Array, mode: str, target: float) -> jax.Array:
    """relu(log β) (suppress) or relu(log target − log β) (promote), elementwise; written with
    max / min so that log is never taken of 0 and no gradient is 0 · ∞."""
    if mode == "suppress":
        return jnp.log(jnp.maximum(beta, CHANCE))
    return math.log(target) - jnp.log(jnp.clip(beta, BETA_FLOOR, target))


def head_betas(
    attentions: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array, roles: Sequence[str]
) -> jax.Array:
    """Each head's batch mean of the per-sequence β, [R, L, H], for `roles` on attention
    probabilities [L, B, H, T, T] of a pre-training batch; a sequence with no scored row for a role
    (a lone real token) is left out of that role's mean, as the analyses leave it out of the test."""
    rows, sieves = layout_masks(roles, attention_mask, token_type_ids)
    scores, counts = sieve_scores(attentions, attention_mask > 0, rows, sieves)  # [R, B, L, H], [R, B]
    scored = (counts > 0)[:, :, None, None]
    total = jnp.where(scored, scores, 0).sum(1)
    return total / jnp.maximum(scored.sum(1), 1).astype(total.dtype)


def steering_terms(
    steerings: Sequence[Steering], attentions: Sequence[jax.Array], attention_mask: jax.Array,
    token_type_ids: jax.Array,
) -> dict[str, tuple[jax.Array, jax.Array]]:  # fmt: skip
    """name → (penalty, mean β̄ over the heads it selects) of each intervention, from the model's
    attention probabilities (one [B, H, T, T] array per layer). The step window is not applied."""
    roles = list(dict.fromkeys(s.role for s in steerings))
    layers = sorted({layer for s in steerings for layer in s.layers})
    # Only the layers steered are stacked and scored.
    betas = head_betas(jnp.stack([attentions[layer] for layer in layers]), attention_mask, token_type_ids, roles)
    terms = {}
    for s in steerings:
        selected = betas[roles.index(s.role)][jnp.array([layers.index(layer) for layer in s.layers])][:, jnp.array(s.heads)]  # fmt: skip
        terms[s.name] = (s.weight * hinge(selected, s.mode, s.target).mean(), selected.mean())
    return terms


def active(steering: Steering, step: jax.Array) -> jax.Array:
    """1.0 while the update from `step` lies in the window, else 0.0: a traced mask, so one compiled
    step serves the whole run."""
    inside = step >= steering.start
    if steering.stop is not None:
        inside = inside & (step < steering.stop)
    return inside.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Interventions:
    """The loss's steering term: `(attentions, batch, step) → (penalty, metrics)`, the penalties
    summed over the interventions active at `step`; logged per intervention as
    `intervene/<i>-<role>` (its penalty, 0 outside its window) and `intervene/<i>-<role>/beta`."""

    steerings: tuple[Steering, ...]

    def __call__(
        self, attentions: Sequence[jax.Array], batch: dict[str, jax.Array], step: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        terms = steering_terms(self.steerings, attentions, batch["attention_mask"], batch["token_type_ids"])
        total, metrics = jnp.zeros((), jnp.float32), {}
        for s in self.steerings:
            penalty, beta = terms[s.name]
            applied = penalty * active(s, step)
            total = total + applied
            metrics[f"intervene/{s.name}"] = applied
            metrics[f"intervene/{s.name}/beta"] = beta
        return total, metrics
