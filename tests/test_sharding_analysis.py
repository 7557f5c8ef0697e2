"""The analyses' mesh helpers in bertjax.sharding: a batch split over 1, 2, 4 or 8 (fake CPU)
devices, padded when they do not divide it, gives the one-device result; and their one-line errors."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bertjax import sharding
from bertjax.errors import UserError


@given(batch=st.integers(1, 10_000), devices=st.integers(1, 512))
def test_padded_size_is_the_next_multiple_of_the_device_count(batch, devices):
    size = sharding.padded_size(batch, types.SimpleNamespace(size=devices))
    assert size % devices == 0 and batch <= size < batch + devices


def test_the_mesh_takes_all_local_devices_and_is_recorded_by_axis():
    mesh = sharding.analysis_mesh()
    assert mesh.devices.size == len(jax.local_devices())
    assert sharding.mesh_record(mesh) == {"data": len(jax.local_devices()), "fsdp": 1}


@pytest.mark.parametrize("devices", [0, -1, len(jax.local_devices()) + 1])
def test_a_device_count_outside_the_local_devices_is_one_line(devices):
    with pytest.raises(UserError, match=rf"^--devices {devices}: this process has \d+ device\(s\); give 1 to \d+$"):
        sharding.analysis_mesh(devices)


def test_an_fsdp_size_that_does_not_divide_the_devices_is_one_line():
    with pytest.raises(UserError, match=r"^--fsdp 2 must be a positive divisor of the 1 devices in use$"):
        sharding.analysis_mesh(1, fsdp=2)


def test_arrays_under_the_floor_stay_whole_and_larger_ones_split():
    floor = sharding.MIN_SHARDED_BYTES
    assert sharding.array_spec((512, 1024), 4, floor) == jax.sharding.PartitionSpec(None, "fsdp")
    assert sharding.array_spec((1024, 1023), 4, floor) == jax.sharding.PartitionSpec("fsdp", None)
    assert sharding.array_spec((1024, 1024), 4, floor - 1) == jax.sharding.PartitionSpec()
    assert sharding.array_spec((1024, 1024), 1, floor) == jax.sharding.PartitionSpec()


def test_shard_batch_keeps_structure_values_and_each_arrays_batch_axis():
    mesh = sharding.analysis_mesh()
    batch = {"ids": np.arange(6).reshape(3, 2), "sieves": np.ones((4, 3, 2, 2), bool)}
    placed = sharding.shard_batch(batch, mesh, axis={"ids": 0, "sieves": 1})
    assert placed["sieves"].sharding.spec == jax.sharding.PartitionSpec(None, ("data", "fsdp"))
    for key in batch:
        np.testing.assert_array_equal(np.asarray(placed[key]), batch[key])
    pair = sharding.shard_batch((batch["ids"], batch["ids"].T), mesh, axis=(0, 1))
    assert [p.shape for p in pair] == [(3, 2), (2, 3)]
    assert sharding.replicate({"w": np.ones(3)}, mesh)["w"].sharding.is_fully_replicated


AGREEMENT = r"""
import jax, numpy as np
from bertjax import sharding
from bertjax.errors import UserError

assert len(jax.local_devices()) == 8
rng = np.random.default_rng(0)
R, T, D = 3, 6, 16
w = rng.standard_normal((D, D)).astype(np.float32)
sharding.MIN_SHARDED_BYTES = 0  # w is 1 KB: split it anyway, to test the split


@jax.jit
def score(w, batch):
    # [R, B]: role r's sum over the sieve's tokens t of Σ_j (x[b, t] @ w)_j; a per-sequence score.
    per_token = (batch["x"] @ w).sum(-1)
    return (batch["sieve"] * per_token[None]).sum(-1)


def reference(x, sieve):
    exact = np.einsum("rbt,bti,ij->rb", sieve, x.astype(np.float64), w.astype(np.float64))
    magnitude = np.einsum("rbt,bti,ij->rb", sieve, np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)))
    return exact, magnitude


# Each score sums at most T·D·D float32 products; in any order (XLA's, which depends on the shapes
# each device gets) that is within K·2^-24 of the sum of the products' magnitudes (γ_K, first order).
K = T * D * D
bound = lambda magnitude: K * 2.0**-24 * magnitude

worst = 0.0
for devices, fsdp in [(1, 1), (2, 1), (4, 1), (8, 1), (8, 4)]:
    mesh = sharding.analysis_mesh(devices, fsdp=fsdp)
    assert mesh.devices.flatten().tolist() == jax.local_devices()[:devices]
    assert sharding.mesh_record(mesh) == {"data": devices // fsdp, "fsdp": fsdp}
    if fsdp == 1:
        params = sharding.replicate(w, mesh)
    else:
        params = jax.device_put(w, sharding.state_shardings(mesh, w))
        assert "fsdp" in str(params.sharding.spec)
    for B in (5, 7, 8):
        x = rng.standard_normal((B, T, D)).astype(np.float32)
        sieve = rng.random((R, B, T)) < 0.5
        batch = sharding.shard_batch({"x": x, "sieve": sieve}, mesh, axis={"x": 0, "sieve": 1})
        assert batch["x"].shape[0] == sharding.padded_size(B, mesh) == -(-B // devices) * devices
        padded = np.asarray(score(params, batch))
        scores = padded[:, :B]
        exact, magnitude = reference(x, sieve)
        error = np.abs(scores - exact)
        relative = float(np.max(error / np.where(magnitude > 0, magnitude, 1)))  # an empty sieve scores 0 exactly
        assert np.all(error <= bound(magnitude)), (devices, fsdp, B, relative)
        worst = max(worst, relative)
        # The same bound catches a wrong implementation: rows one place out of order, or a sum over
        # the batch that keeps the padding rows (the repeated last example) instead of dropping them.
        shifted = np.roll(scores, 1, axis=1)
        assert np.any(np.abs(shifted - exact) > bound(magnitude))
        if padded.shape[1] > B:
            total, total_bound = exact.sum(1), bound(magnitude.sum(1))
            assert np.all(np.abs(scores.sum(1) - total) <= total_bound)
            assert np.any(np.abs(padded.sum(1) - total) > total_bound)

for devices in (0, 9):
    try:
        sharding.analysis_mesh(devices)
        raise AssertionError(f"--devices {devices} accepted")
    except UserError as error:
        assert str(error).startswith(f"--devices {devices}: this process has 8 device(s)"), error
print("worst relative error", worst, "bound", K * 2.0**-24)
"""


def test_a_sharded_padded_batch_scores_as_on_one_device(fake_devices):
    """1, 2, 4 and 8 devices (and 8 as 2 × 4 with the params split along fsdp), batches of 5 and 7
    that the devices do not divide and one of 8 that they do: each per-sequence score within its
    float32 rounding bound of the float64 reference, so every mesh agrees with one device."""
    out = fake_devices(AGREEMENT, devices=8)
    assert "worst relative error" in out
    print(out)  # the margin, with -s
