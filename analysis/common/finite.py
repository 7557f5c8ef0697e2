"""What an analysis does with a number that comes back non-finite from finite weights.

The load refuses weights that are NaN or infinite (`bertjax.pretrained.check_finite`); finite
weights can still overflow float32 in the forward pass (value weights of 3e38 made half the heads'
β NaN, and the summary counted them as heads holding no role). Such a reading is a broken model,
not a finding: every analysis stops with one line naming the first layer and head whose reading
is not finite, before anything is tested or written. One case is a legitimate model: a head whose
value vectors are 0 on every token (a pruned head) passes nothing on, so its norm-weighted
attention is 0/0, undefined. That head is named in a warning and its statistics are left empty
(NaN, untested), never written as 0."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.errors import UserError

log = logging.getLogger(__name__)


def silent_heads(attentions: jax.Array, key_weights: jax.Array | None, real: jax.Array) -> jax.Array:
    """bool [L, B, H]: the heads whose norm-weighted attention (`attentions` [L, B, H, T, T] times
    `key_weights` [L, B, H, T]) is undefined in a sequence: finite weights α and a value norm of
    exactly 0 at every real key. All False without key weights (the weights α are never 0/0), and
    in a padding row of a batch (no real token: nothing there to be undefined)."""
    if key_weights is None:
        return jnp.zeros(attentions.shape[:3], bool)
    keys = real[None, :, None, :]
    zero = jnp.all(jnp.where(keys, key_weights == 0, True), axis=-1)
    # An overflow that also zeroes the norms is still an overflow: its α is not finite.
    pairs = keys[..., None, :] & real[None, :, None, :, None]
    finite = jnp.all(jnp.where(pairs, jnp.isfinite(attentions), True), axis=(-2, -1))
    return zero & finite & real.any(-1)[None, :, None]


def check_finite(
    values: np.ndarray, what: str, where: str, silent: np.ndarray | bool = False, allowed: bool = False
) -> None:
    """One line naming the first layer and head whose `values` [..., L, H] are not finite where
    `silent` (broadcast to them) does not explain it: the forward pass overflowed. `allowed`
    (`--allow-nonfinite`): the weights may hold NaN, the load said so and that its results may be
    NaN; nothing is refused."""
    bad = ~np.isfinite(values) & ~np.broadcast_to(silent, values.shape)
    if bad.any() and not allowed:
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        layer, head = first[-2:]
        raise UserError(
            f"{where}: {what} of layer {layer} head {head} is {values[first]}, from finite weights: the forward "
            "pass overflows float32 (a weight too large for its products); the checkpoint is not usable as it is"
        )


def check_finite_output(values: np.ndarray, what: str, where: str, allowed: bool = False) -> None:
    """One line when `values`, an output no head owns (a classifier's logits), are not finite
    (`allowed` as `check_finite`'s)."""
    if not (allowed or np.isfinite(values).all()):
        raise UserError(
            f"{where}: {what} are not finite ({values[~np.isfinite(values)][0]}), from finite weights: the forward "
            "pass overflows float32 (a weight too large for its products); the checkpoint is not usable as it is"
        )


def warn_undefined(silent: np.ndarray, where: str, what: str) -> None:
    """A warning naming the heads (`silent`, bool [L, H]) whose norm-weighted attention is undefined."""
    heads = [f"layer {layer} head {head}" for layer, head in np.argwhere(silent)]
    if heads:
        log.warning(
            "%s: the norm-weighted attention of %s is undefined (the head passes nothing on: its value "
            "vectors are 0 on every token, as a pruned head's); %s left empty, not tested",
            where, ", ".join(heads), what,
        )  # fmt: skip
