"""The `mesh` section of a training config: how the devices split into the data and fsdp axes of
`bertjax.sharding`'s mesh. A module of its own, free of JAX, so that the training commands can list
its keys in `--help` without waiting for JAX to import."""

from __future__ import annotations

import dataclasses

from bertjax.settings import setting


@dataclasses.dataclass
class MeshConfig:
    data: int = setting(-1, help="devices along the data axis (each gets other examples); -1: all devices not used by fsdp")  # fmt: skip
    fsdp: int = setting(1, help="devices each array is split over (ZeRO-3 style: params, gradients, optimizer moments)")  # fmt: skip
