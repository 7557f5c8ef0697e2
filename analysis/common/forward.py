"""Batches for the forward passes of every analysis, and the devices they run on.

Batches are length-sorted and padded to a bucketed length (few compiled shapes, little wasted
compute) and to a fixed number of rows (one shape per bucket). `Devices` runs a jitted function
data parallel over this process's devices: the model replicated on each, every batch split along
its batch axis, the rows rounded up to a multiple of the device count (padding rows, like the
last batch's, hold no example and their outputs are dropped), so a result does not depend on how
many devices computed it beyond the order of float32 sums. `compiled` keeps every jitted forward
once per architecture in a process, so that no call compiles what an earlier one did. `at_precision`
runs a tool's computation under its `--precision`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from bertjax import cli, sharding
from bertjax.model import Model
from bertjax.precision import matmul_precision
from bertjax.progress import tqdm
from sieves.align import EncodedSequence, batches, bucketed, pad_batch

log = logging.getLogger(__name__)

# The jitted functions of every forward site, by site, architecture and static choices: kept for
# the process, since each load makes a fresh graphdef and a jit built around it compiles anew (a
# notebook re-running a cell, a series' checkpoints, the evaluators of one run).
_COMPILED: dict[tuple, Any] = {}


def at_precision(setting: str = "precision") -> Callable[[Callable], Callable]:
    """A tool's computation `compute(config, ...)` run under the matrix-product precision its
    config names at `setting` (a dotted attribute: "precision", "roles.precision"), so every
    forward pass in it is traced and dispatched under it: jit keys its cache on the precision, and
    a function compiled by an earlier call under another is not reused. Applied to the one function
    of each tool that its CLI's path and its API call both go through."""
    read = operator.attrgetter(setting)

    def wrap(compute: Callable) -> Callable:
        @functools.wraps(compute)
        def under_precision(config, *args, **kwargs):
            with matmul_precision(read(config)):
                return compute(config, *args, **kwargs)

        return under_precision

    return wrap


def padded_batches(
    seqs: Sequence[EncodedSequence], batch_size: int, max_length: int, desc: str, rows: int | None = None
) -> Iterator[tuple[list[EncodedSequence], dict[str, np.ndarray]]]:
    """(the sequences, their model inputs [rows, bucketed length]) of each length-sorted batch of
    `batch_size` sequences (`rows`, default `batch_size`, is ≥ it: `Devices.rows`), with a progress
    bar over the sequences; padding never goes past `max_length` (the encoding's, which fits the
    model's positions where a bucket may not)."""
    with tqdm(total=len(seqs), desc=desc, unit="seq") as progress:
        for chunk in batches(seqs, batch_size):
            cli.stop_if_terminated()
            length = bucketed(max(s.length for s in chunk))
            yield chunk, pad_batch(chunk, rows or batch_size, min(length, max_length))
            progress.update(len(chunk))


@dataclasses.dataclass(frozen=True)
class Devices:
    """This process's devices that run an analysis's forward passes, as a data-parallel mesh."""

    mesh: Mesh

    @classmethod
    def local(cls, count: int | None = None) -> Devices:
        """The first `count` local devices (`--devices`; None: all of them)."""
        return cls(sharding.analysis_mesh(count))

    @property
    def count(self) -> int:
        return self.mesh.size

    def rows(self, batch_size: int) -> int:
        """The rows a batch of `batch_size` sequences is padded to: a multiple of the devices."""
        return sharding.padded_size(batch_size, self.mesh)

    def record(self) -> dict[str, int]:
        """run.json's `"mesh"`: {axis: size}."""
        return sharding.mesh_record(self.mesh)


def compiled(build: Callable, *models: Model, static: tuple = ()) -> tuple[Any, tuple]:
    """(`build(*graphdefs, *static)`, the models' states): `build` returns jitted functions that take
    the states as arguments; it runs once per (build, the models' classes and configs, `static`) in
    a process and what it returned is used again for every later model of the same architecture.
    So it must close over nothing but its arguments: a module-level function, any per-call choice
    (a reduce function, an analysis kind) passed in `static` (hashable) rather than captured."""
    if "<locals>" in build.__qualname__:
        # A closure is a new key per call: the cache would grow and compile on every call.
        raise TypeError(f"{build.__qualname__}: compiled() needs a module-level build function")
    graphdefs, states = zip(*(nnx.split(model) for model in models), strict=True)
    # Keyed by class and config, not by the graphdef (a new one per instance): every checkpoint of
    # one architecture shares one compiled function.
    key = (build, *((type(model), model.config) for model in models), *static)
    if key not in _COMPILED:
        _COMPILED[key] = build(*graphdefs, *static)
    return _COMPILED[key], states


class DataParallel:
    """`fn(state, *arrays)` with `state` replicated on every device and each array split along its
    batch axis (`batch_axes`, one per array; an array beyond them is not split). Without devices it
    is `fn` on the default device, as a single-device run always was."""

    def __init__(self, fn: Callable, state: Any, devices: Devices | None, batch_axes: Sequence[int]):
        self.fn, self.devices, self.batch_axes = fn, devices, tuple(batch_axes)
        self.state = state if devices is None else sharding.replicate(state, devices.mesh)

    def rows(self, batch_size: int) -> int:
        return batch_size if self.devices is None else self.devices.rows(batch_size)

    def __call__(self, *arrays: Any) -> Any:
        if self.devices is not None:
            axes = self.batch_axes[: len(arrays)]
            placed = sharding.shard_batch(tuple(arrays[: len(axes)]), self.devices.mesh, axis=axes)
            arrays = (*placed, *arrays[len(axes) :])
        return self.fn(self.state, *arrays)
