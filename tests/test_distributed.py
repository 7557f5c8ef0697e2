"""bertjax.distributed: the example shares of the processes, the gathering of their unequal
results, a failure on one process failing all, and `--shard I/N`. The multi-process tests start
real JAX processes on localhost (jax 0.10.2's CPU backend runs collectives over gloo)."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bertjax import distributed
from bertjax.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@given(n=st.integers(0, 100_000), count=st.integers(1, 300))
def test_process_shares_are_contiguous_balanced_and_cover_every_example_once(n, count):
    shares = [distributed.process_share(n, index, count) for index in range(count)]
    assert shares[0].start == 0 and shares[-1].stop == n
    assert all(a.stop == b.start for a, b in itertools.pairwise(shares))
    lengths = [s.stop - s.start for s in shares]
    assert max(lengths) - min(lengths) <= 1 and min(lengths) >= 0


def test_one_process_reads_everything_and_gathers_nothing():
    assert distributed.process_share(7) == slice(0, 7)
    rows = np.arange(6.0).reshape(3, 2)
    assert distributed.gather_rows(rows) is rows
    assert distributed.process_flags(False) == [False]
    with distributed.all_ok("encoding"):
        pass
    with pytest.raises(UserError, match=r"^bad row$"), distributed.all_ok("encoding"):
        raise UserError("bad row")
    with pytest.raises(ValueError, match="process 2 of 2"):
        distributed.process_share(5, 2, 2)


def threads_as_processes(count: int, work) -> list:
    """`work(index, allgather)` on `count` threads that gather as processes would: each call of
    `allgather` returns every thread's array stacked in thread order."""
    barrier, slots, results = threading.Barrier(count), [None] * count, [None] * count

    def allgather(array):
        index = int(threading.current_thread().name)
        slots[index] = np.asarray(array)
        barrier.wait()
        stacked = np.stack(slots)
        barrier.wait()  # nobody overwrites a slot before everyone has read them all
        return stacked

    def run(index):
        try:
            results[index] = work(index, allgather)
        except (UserError, ValueError) as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(i,), name=str(i)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


@pytest.mark.parametrize("n", [0, 2, 11])
def test_unequal_shares_gather_in_process_order_with_their_dtypes(n):
    """Three processes with 11 examples read 4, 4, 3; with 2, one of them reads none."""
    rows = {
        "scores": np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) / 7,
        "index": np.arange(n, dtype=np.int64) + 2**40,  # above int32, as only a byte copy keeps it
        "exact": np.arange(n, dtype=np.float64) / 3,
        "kept": np.arange(n) % 2 == 0,
    }

    def work(index, allgather):
        share = distributed.process_share(n, index, 3)
        return distributed.gather_tree({k: v[share] for k, v in rows.items()}, allgather)

    for gathered in threads_as_processes(3, work):
        assert gathered.keys() == rows.keys()
        for key, expected in rows.items():
            assert gathered[key].dtype == expected.dtype
            np.testing.assert_array_equal(gathered[key], expected)


def test_rows_of_different_widths_on_the_processes_are_refused():
    results = threads_as_processes(2, lambda i, g: distributed.gather_rows(np.zeros((1, i + 1)), g))
    assert all(isinstance(r, ValueError) and "rows of [8, 16] bytes" in str(r) for r in results)


def test_a_failure_on_one_process_fails_every_process():
    def work(index, allgather):
        with distributed.all_ok("encoding", allgather):
            if index == 1:
                raise UserError("dev.tsv:3: bad row")
        return "done"

    results = threads_as_processes(3, work)
    assert [str(r) for r in results] == [
        "encoding failed on process 1 of 3 (its log says why)",
        "dev.tsv:3: bad row",
        "encoding failed on process 1 of 3 (its log says why)",
    ]


@pytest.mark.parametrize("text", ["2/2", "1/0", "0/0", "a/b", "-1/2", "1", "1/2/3", ""])
def test_a_bad_shard_is_one_line(text):
    with pytest.raises(UserError, match=rf"^--shard {text!r}: give I/N with 0 ≤ I < N"):
        distributed.parse_shard(text)


def test_parse_shard():
    assert distributed.parse_shard("0/1") == (0, 1)
    assert distributed.parse_shard("3/4") == (3, 4)


@given(n=st.integers(0, 500), count=st.integers(1, 40))
def test_shards_take_items_round_robin(n, count):
    items = [f"step{k}" for k in range(n)]
    shards = [distributed.shard_members(items, index, count) for index in range(count)]
    assert sorted(item for shard in shards for item in shard) == sorted(items)
    for index, shard in enumerate(shards):
        assert shard == [item for k, item in enumerate(items) if k % count == index]
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


WORKER = r"""
import os, sys
import numpy as np
from bertjax import distributed
from bertjax.errors import UserError

index, port, case = int(sys.argv[1]), sys.argv[2], sys.argv[3]
# A short heartbeat timeout, so that the death of a process is noticed in seconds (100 s by default).
distributed.initialize(True, coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=index,
                       heartbeat_timeout_seconds=3)
import jax
assert (jax.process_index(), jax.process_count()) == (index, 2)

if case == "gather":
    for n in (7, 1):  # shares of 4 and 3 examples; then of 1 and 0
        share = distributed.process_share(n)
        mine = {"scores": np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2)[share] / 3,
                "index": np.arange(n, dtype=np.int64)[share] + 2**40}
        gathered = distributed.gather_tree(mine)
        np.testing.assert_array_equal(gathered["scores"], np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2) / 3)
        np.testing.assert_array_equal(gathered["index"], np.arange(n, dtype=np.int64) + 2**40)
        assert gathered["index"].dtype == np.int64
        print("share", n, share.start, share.stop, flush=True)
    try:
        with distributed.all_ok("encoding"):
            if index == 1:
                raise UserError("dev.tsv:3: bad row")
    except UserError as error:
        print("error:", error, flush=True)
elif case == "die":
    if index == 1:
        os._exit(3)
    distributed.gather_rows(np.zeros(3))
    print("gathered without process 1", flush=True)
"""


def test_two_processes_gather_unequal_shares_and_fail_together(localhost_job):
    (rc0, out0, err0), (rc1, out1, err1) = localhost_job(WORKER, "gather", timeout=60)
    assert rc0 == 0, err0[-3000:]
    assert rc1 == 0, err1[-3000:]
    assert out0 == [
        "share 7 0 4",
        "share 1 0 1",
        "error: encoding failed on process 1 of 2 (its log says why)",
    ]
    assert out1 == ["share 7 4 7", "share 1 1 1", "error: dev.tsv:3: bad row"]


def test_a_process_that_dies_stops_the_others(localhost_job):
    """JAX's coordination service aborts the survivor once the dead process's heartbeats stop:
    a non-zero exit in seconds, never a hang and never a result without the missing share."""
    (rc0, out0, err0), (rc1, _, _) = localhost_job(WORKER, "die", timeout=60)
    assert rc1 == 3
    assert rc0 != 0 and out0 == []
    assert "stopped sending heartbeats" in err0, err0[-3000:]
