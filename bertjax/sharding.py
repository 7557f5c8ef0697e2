"""The device mesh (data × fsdp) and the shardings of params, optimizer state and batches.

Batches are split over both axes (every device gets different examples). With fsdp > 1 each
array with an axis divisible by the fsdp size is split along its largest such axis (ZeRO-3 style:
params, gradients and optimizer moments are all partitioned); XLA inserts the all-gathers.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.errors import UserError

BATCH_AXES = ("data", "fsdp")


@dataclasses.dataclass
class MeshConfig:
    data: int = -1  # -1: all devices not used by fsdp
    fsdp: int = 1


def make_mesh(config: MeshConfig, devices: list | None = None) -> Mesh:
    devices = jax.devices() if devices is None else devices
    fsdp = config.fsdp
    data = len(devices) // fsdp if config.data == -1 else config.data
    if fsdp < 1 or data < 1 or data * fsdp != len(devices):
        raise UserError(f"mesh: data={config.data} × fsdp={config.fsdp} does not match {len(devices)} devices")
    return Mesh(np.asarray(devices).reshape(data, fsdp), BATCH_AXES)


def array_spec(shape: tuple[int, ...], fsdp: int) -> PartitionSpec:
    if fsdp == 1:
        return PartitionSpec()
    candidates = [axis for axis, size in enumerate(shape) if size % fsdp == 0]
    if not candidates:
        return PartitionSpec()
    axis = max(candidates, key=lambda a: shape[a])
    return PartitionSpec(*[("fsdp" if a == axis else None) for a in range(len(shape))])


def state_shardings(mesh: Mesh, abstract_tree):
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, array_spec(tuple(x.shape), fsdp)), abstract_tree)


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
