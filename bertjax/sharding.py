"""The device mesh (data × fsdp) and the shardings of params, optimizer state and batches.

Batches are split over both axes (every device gets different examples). With fsdp > 1 each
array of at least `MIN_SHARDED_BYTES` with an axis divisible by the fsdp size is split along its
largest such axis (ZeRO-3 style: params, gradients and optimizer moments are all partitioned); XLA
inserts the all-gathers. Smaller arrays stay whole on every device, as big_vision leaves them.

Training builds one mesh over every device of every process (`make_mesh`, `global_batch`). The
analyses build one per process over its own devices (`analysis_mesh`): each process scores its
own share of the examples with no collective on the device side, and only the per-sequence
scores meet on the hosts (`bertjax.distributed`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.errors import UserError
from bertjax.mesh_config import MeshConfig

BATCH_AXES = ("data", "fsdp")
# Below this an array is replicated: splitting it saves less memory than its all-gathers cost in
# latency (big_vision's floor). Read at each call, so that a test can split arrays of a few KB.
MIN_SHARDED_BYTES = 4 * 2**20


def make_mesh(config: MeshConfig, devices: list | None = None) -> Mesh:
    devices = jax.devices() if devices is None else devices
    fsdp = config.fsdp
    data = len(devices) // max(fsdp, 1) if config.data == -1 else config.data
    if fsdp < 1 or data < 1 or data * fsdp != len(devices):
        raise UserError(f"mesh: data={config.data} × fsdp={config.fsdp} does not match {len(devices)} devices")
    return Mesh(np.asarray(devices).reshape(data, fsdp), BATCH_AXES)


def array_spec(shape: tuple[int, ...], fsdp: int, nbytes: int) -> PartitionSpec:
    """How an array of `shape` and `nbytes` splits over `fsdp` devices."""
    if fsdp == 1 or nbytes < MIN_SHARDED_BYTES:
        return PartitionSpec()
    candidates = [axis for axis, size in enumerate(shape) if size % fsdp == 0]
    if not candidates:
        return PartitionSpec()
    axis = max(candidates, key=lambda a: shape[a])
    return PartitionSpec(*[("fsdp" if a == axis else None) for a in range(len(shape))])


def state_shardings(mesh: Mesh, abstract_tree):
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, array_spec(tuple(x.shape), fsdp, _nbytes(x))), abstract_tree)


def _nbytes(x: Any) -> int:
    return math.prod(x.shape) * np.dtype(x.dtype).itemsize


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def check_batch_size(flag: str, size: int, mesh: Mesh) -> None:
    """A batch splits evenly over the mesh's devices (both batch axes), or the run cannot start."""
    if size < 1 or size % mesh.size:
        raise UserError(f"{flag} {size} must be a positive multiple of the {mesh.size} devices it is split over")


def global_batch(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles each host's slice of the batch into one global array per key."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}


def analysis_mesh(devices: int | None = None, fsdp: int = 1) -> Mesh:
    """A (data, fsdp) mesh over this process's first `devices` local devices (None: all of them).

    fsdp > 1 is for a model too large for one device: its params go through `state_shardings`
    (split along fsdp) instead of `replicate`, and batches still split over both axes.
    """
    local = jax.local_devices()
    count = len(local) if devices is None else devices
    if not 1 <= count <= len(local):
        raise UserError(f"--devices {devices}: this process has {len(local)} device(s); give 1 to {len(local)}")
    if fsdp < 1 or count % fsdp:
        raise UserError(f"--fsdp {fsdp} must be a positive divisor of the {count} devices in use")
    return make_mesh(MeshConfig(fsdp=fsdp), local[:count])


def padded_size(batch_size: int, mesh: Mesh) -> int:
    """`batch_size` rounded up to a multiple of the mesh's devices: the size `shard_batch` pads to."""
    return -(-batch_size // mesh.size) * mesh.size


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Every leaf of `tree` whole on every device of `mesh`."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def shard_batch(arrays: Any, mesh: Mesh, axis: Any = 0) -> Any:
    """Host arrays (a dict or tuple) put on `mesh` with their batch axis split over both mesh axes.

    `axis` is each array's batch axis: one int for all, or a dict / tuple of ints matching
    `arrays` (the sieve arrays [R, B, T, T] have theirs at 1). A batch that the devices do not
    divide is padded up to `padded_size` by repeating its last example, so the padded rows compute
    finite values like any other; they are not examples, so callers drop them (`out[:n]`) or weight
    them 0 before reducing over the batch.
    """
    axes = jax.tree.map(lambda _: axis, arrays) if isinstance(axis, int) else axis

    def put(array: np.ndarray, batch_axis: int) -> jax.Array:
        size = array.shape[batch_axis]
        missing = padded_size(size, mesh) - size
        if missing:
            last = np.take(array, [size - 1], axis=batch_axis)
            array = np.concatenate([array, np.repeat(last, missing, axis=batch_axis)], axis=batch_axis)
        spec = PartitionSpec(*[None] * batch_axis, BATCH_AXES)
        return jax.device_put(array, NamedSharding(mesh, spec))

    return jax.tree.map(put, arrays, axes)


def mesh_record(mesh: Mesh) -> dict[str, int]:
    """The mesh as run.json records it: {axis name: size}."""
    return {name: int(size) for name, size in mesh.shape.items()}
