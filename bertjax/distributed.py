"""Several processes (hosts) on one analysis: who reads which examples, and how results meet.

Two ways to spread work. With `--distributed` every process joins one JAX job
(`initialize`), reads its own contiguous share of the examples (`process_share`), scores it on
its own devices, and the hosts gather the per-sequence results in process order (`gather_rows`);
`all_ok` makes a failure on one process fail all of them together. With `--shard I/N`
(`parse_shard`, `shard_members`) independent jobs split a list of items with no collective at all.

A process that dies outright (killed, out of memory) cannot take part in any of this: JAX's
coordination service notices its missing heartbeats (after `heartbeat_timeout_seconds`, 100 s by
default) and aborts every other process.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import jax
import numpy as np

from bertjax.errors import UserError

T = TypeVar("T")
Allgather = Callable[[np.ndarray], np.ndarray]


def initialize(distributed: bool, **explicit: Any) -> None:
    """Joins this process to the job when asked. JAX finds the coordinator, the process count and
    this process's id itself on SLURM, Open MPI, Kubernetes and TPU VMs; `explicit` passes them
    for anything else (`coordinator_address=`, `num_processes=`, `process_id=`, as the tests do)."""
    if not distributed or jax.distributed.is_initialized():  # a caller may have joined it already
        return
    try:
        jax.distributed.initialize(**explicit)
    except RuntimeError as e:
        if "must be called before" not in str(e):
            raise
        # A notebook that ran any JAX cell (or loaded a model) is past the point where a process joins.
        raise UserError(
            "--distributed: this process has already started JAX, and a process joins a job before its first "
            "JAX call; call jax.distributed.initialize() first thing in the process and leave distributed out"
        ) from None


def process_share(n: int, index: int | None = None, count: int | None = None) -> slice:
    """The examples process `index` of `count` reads: a contiguous slice of range(n). Shares are in
    process order, cover every example once, and differ in length by at most one."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    if not 0 <= index < count:
        raise ValueError(f"process {index} of {count}")
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


def _allgather(array: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array))


def gather_rows(array: np.ndarray, allgather: Allgather | None = None) -> np.ndarray:
    """Every process's `array` concatenated along axis 0 in process order; shares may differ in
    length (even be empty), but not in their other axes or dtype. Every process must call it.

    The rows travel as raw bytes, so float64 and int64 arrive unchanged (a JAX array without x64
    would make them 32-bit). `allgather` is `process_allgather` (stack one array per process).
    """
    if allgather is None:
        if jax.process_count() == 1:
            return array
        allgather = _allgather
    array = np.ascontiguousarray(array)
    row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:]))
    shapes = allgather(np.asarray([len(array), row_bytes], np.int32))
    if len(set(shapes[:, 1].tolist())) > 1:
        raise ValueError(f"gather_rows: rows of {shapes[:, 1].tolist()} bytes on the processes; they must agree")
    lengths = shapes[:, 0].tolist()
    # At least one row, so that no process sends a zero-size array.
    longest = max(*lengths, 1)
    padded = np.zeros((longest, row_bytes), np.uint8)
    padded[: len(array)] = array.view(np.uint8).reshape(len(array), row_bytes)
    gathered = allgather(padded)
    rows = np.concatenate([gathered[p, :length] for p, length in enumerate(lengths)])
    return rows.view(array.dtype).reshape(-1, *array.shape[1:])


def gather_tree(tree: Any, allgather: Allgather | None = None) -> Any:
    """`gather_rows` on every leaf (a dict of per-sequence arrays, say)."""
    return jax.tree.map(lambda leaf: gather_rows(leaf, allgather), tree)


def process_flags(ok: bool, allgather: Allgather | None = None) -> list[bool]:
    """Every process's `ok`, in process order (every process must call it)."""
    if allgather is None:
        if jax.process_count() == 1:
            return [ok]
        allgather = _allgather
    return [bool(flag) for flag in allgather(np.asarray([ok], np.int32))[:, 0]]


@contextlib.contextmanager
def all_ok(what: str, allgather: Allgather | None = None) -> Iterator[None]:
    """A block that every process runs: if it fails on any process, it fails on all of them. The
    process at fault raises its own error; the others raise one line naming it.

    Each process reports at the end of the block, so the block itself must need no collective
    (reading, encoding and scoring one's own share); a process that failed early would never
    join it."""
    try:
        yield
    except Exception:
        process_flags(False, allgather)
        raise
    flags = process_flags(True, allgather)
    failed = [str(p) for p, flag in enumerate(flags) if not flag]
    if failed:
        raise UserError(f"{what} failed on process {', '.join(failed)} of {len(flags)} (its log says why)")


def parse_shard(text: str) -> tuple[int, int]:
    """`--shard I/N` as (I, N): this job is number I (0-based) of N."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not int(match[1]) < int(match[2]):
        raise UserError(f"--shard {text!r}: give I/N with 0 ≤ I < N, e.g. --shard 0/4 … --shard 3/4")
    return int(match[1]), int(match[2])


def shard_members(items: Sequence[T], index: int, count: int) -> list[T]:
    """The items job `index` of `count` takes: every count-th from the index-th (round-robin), so
    that a series ordered by cost (checkpoints, early to late) splits evenly."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}")
    return list(items[index::count])
