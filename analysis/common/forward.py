"""Batches for the forward passes of every analysis, and the devices they run on.

Batches are length-sorted and padded to a bucketed length (few compiled shapes, little wasted
compute) and to a fixed number of rows (one shape per bucket). `Devices` runs a jitted function
data parallel over this process's devices: the model replicated on each, every batch split along
its batch axis, the rows rounded up to a multiple of the device count (padding rows, like the
last batch's, hold no example and their outputs are dropped), so a result does not depend on how
many devices computed it beyond the order of float32 sums. `compiled` keeps every jitted forward
once per architecture in a process, so that no call compiles what an earlier one did, and
`DataParallel.compile_ahead` compiles the padded shapes a task will need side by side before its
first batch. `at_precision` runs a tool's computation under its `--precision`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
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
# The programs compiled ahead of their calls (`DataParallel.compile_ahead`), by function, static
# choices, state and argument shapes, and the precision they were traced under: kept for the
# process like `_COMPILED`, so a series' later checkpoints neither lower nor wait again.
_AHEAD: dict[tuple, concurrent.futures.Future] = {}


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
            yield chunk, pad_batch(chunk, rows or batch_size, padded_length(chunk, max_length))
            progress.update(len(chunk))


def padded_length(chunk: Sequence[EncodedSequence], max_length: int) -> int:
    """The length `padded_batches` pads `chunk` to."""
    return min(bucketed(max(s.length for s in chunk)), max_length)


def padded_lengths(seqs: Sequence[EncodedSequence], batch_size: int, max_length: int) -> list[int]:
    """Every length `padded_batches` will pad a batch of `seqs` to, shortest first."""
    return sorted({padded_length(chunk, max_length) for chunk in batches(seqs, batch_size)})


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
    """`fn(state, *arrays, **static)` with `state` replicated on every device and each array split
    along its batch axis (`batch_axes`, one per array; an array beyond them is not split). Without
    devices it is `fn` on the default device, as a single-device run always was. `static`: keyword
    arguments of a jitted `fn` that are the same in every call (its static arguments)."""

    def __init__(
        self,
        fn: Callable,
        state: Any,
        devices: Devices | None,
        batch_axes: Sequence[int],
        static: dict[str, Any] | None = None,
    ):
        self.fn, self.devices, self.batch_axes = fn, devices, tuple(batch_axes)
        self.static = dict(static or {})
        self.state = state if devices is None else sharding.replicate(state, devices.mesh)

    def rows(self, batch_size: int) -> int:
        return batch_size if self.devices is None else self.devices.rows(batch_size)

    def compile_ahead(self, examples: Iterable[tuple[np.ndarray, ...]]) -> None:
        """Compile `fn` for each example's argument shapes (host arrays as a call takes them; their
        values are not used) in worker threads, so a cold process compiles a task's padded lengths
        side by side rather than one at a time as its batches reach them; each call then waits for
        its own shape's program. The programs are the ones jit compiles at a call (lowered here, in
        the calling thread, under its precision), so outputs are unchanged. A no-op for an `fn` that
        jit did not build (nothing to lower ahead)."""
        if not hasattr(self.fn, "lower"):
            return
        for arrays in examples:
            key = self._ahead_key(arrays)
            if key in _AHEAD:
                continue
            lowered = self.fn.lower(self.state, *self._placed(arrays), **self.static)
            _AHEAD[key] = _ahead_pool().submit(lowered.compile)

    @functools.cached_property
    def _state_shapes(self) -> tuple:
        return tuple(map(_shape_and_type, jax.tree.leaves(self.state)))

    def _ahead_key(self, arrays: Sequence[Any]) -> tuple:
        shapes = tuple(map(_shape_and_type, arrays))
        mesh = None if self.devices is None else self.devices.mesh
        statics = tuple(sorted(self.static.items()))
        # jax.config sets each flag as an attribute at run time, which its class does not declare.
        precision = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]
        return self.fn, statics, self._state_shapes, mesh, shapes, precision

    def _placed(self, arrays: Sequence[Any]) -> tuple:
        if self.devices is None:
            return tuple(arrays)
        axes = self.batch_axes[: len(arrays)]
        placed = sharding.shard_batch(tuple(arrays[: len(axes)]), self.devices.mesh, axis=axes)
        return (*placed, *arrays[len(axes) :])

    def __call__(self, *arrays: Any) -> Any:
        ahead = _AHEAD.get(self._ahead_key(arrays)) if _AHEAD and hasattr(self.fn, "lower") else None
        if ahead is not None:
            # A failed compile is left to the call below, which raises it where the user sees it.
            concurrent.futures.wait([ahead])
        return self.fn(self.state, *self._placed(arrays), **self.static)


def _shape_and_type(x: Any) -> tuple:
    return np.shape(x), x.dtype if hasattr(x, "dtype") else np.result_type(x)


@functools.cache
def _ahead_pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1), "compile-ahead")
