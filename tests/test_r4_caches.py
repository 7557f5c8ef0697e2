"""Round four of the reliability probe, the caches' share (issue 52, class 3): a track's scores
cache (and the figure cache inside it) is marked as one by `.bertjax-output`, so that a directory
that is not one is refused instead of filled, and an output's --overwrite does not replace it; an
unmarked cache of an earlier bertjax is taken and marked; runs starting together on one new cache
all use it."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from test_track import _flags, write_run

from analysis import roles, track
from analysis.heads import tracking
from bertjax import runinfo
from bertjax.errors import UserError


def _marker(directory: Path) -> str:
    return (directory / runinfo.OUTPUT_MARKER).read_text().strip()


def test_a_directory_holding_other_files_is_refused_as_a_scores_cache_and_left_as_it_was(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's notes\n")
    with pytest.raises(UserError) as refused:
        tracking.prepare_cache(mine, tmp_path / "out")
    assert str(refused.value) == (
        f"--scores-cache {mine} is not a scores cache: it holds notes.txt and no .bertjax-output marking it as one; "
        "give a new or empty directory, or an earlier track's cache"
    )
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_a_file_deep_in_a_subdirectory_is_named_and_an_output_of_another_kind_is_refused(tmp_path):
    cache = tmp_path / "cache"
    (cache / "figures").mkdir(parents=True)
    (cache / "figures" / "holiday.png").write_bytes(b"")
    with pytest.raises(UserError, match=r"it holds figures/holiday\.png and no"):
        tracking.prepare_cache(cache, tmp_path / "out")
    other = tmp_path / "roles-out"
    other.mkdir()
    (other / runinfo.OUTPUT_MARKER).write_text("roles output\n")
    with pytest.raises(UserError) as refused:
        tracking.prepare_cache(other, tmp_path / "out")
    assert str(refused.value) == (
        f"--scores-cache {other} holds another kind of output (roles output), not a scores cache; "
        "choose another directory"
    )


def test_a_path_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "cache"
    path.write_text("x")
    with pytest.raises(UserError, match=r"exists and is not a directory$"):
        tracking.prepare_cache(path, tmp_path / "out")


def test_a_new_cache_is_marked_and_an_unmarked_one_of_an_earlier_bertjax_is_taken(tmp_path):
    new = tmp_path / "new"
    tracking.prepare_cache(new, tmp_path / "out")
    assert _marker(new) == tracking.SCORES_CACHE
    # As the previous version left one: entries, the figure cache, a killed run's temporary, and
    # an across-seed run's caches under it.
    earlier = tmp_path / "earlier"
    names = [
        "step-000000040-0123456789abcdef.npz",
        "sas-000000040-0123456789abcdef.npz",
        ".step-000000080-0123456789abcdef.npz.k2j4h5.tmp",
        "figures/" + "a" * 64 + ".png",
        "figures/" + "b" * 64 + ".svg",
        "seed1/step-000000001-fedcba9876543210.npz",
        "seed1/figures/" + "c" * 64 + ".pdf",
    ]
    for name in names:
        (earlier / name).parent.mkdir(parents=True, exist_ok=True)
        (earlier / name).write_bytes(b"entry")
    tracking.prepare_cache(earlier, tmp_path / "out")
    assert _marker(earlier) == tracking.SCORES_CACHE
    assert all((earlier / name).read_bytes() == b"entry" for name in names)
    tracking.prepare_cache(earlier / "seed1", tmp_path / "out" / "seed1")
    tracking.prepare_cache(earlier, tmp_path / "out")  # a marked cache holding a marked one


def _prepare(cache: str, out: str, start) -> None:
    start.wait()
    tracking.prepare_cache(Path(cache), Path(out))


def test_runs_starting_together_on_one_new_cache_all_take_it(tmp_path):
    """Without the lock, a run listing the new directory while another wrote its marker saw a
    file no cache holds and was refused."""
    context = multiprocessing.get_context("fork")
    for attempt in range(10):
        cache = tmp_path / f"cache{attempt}"
        start = context.Barrier(4)
        workers = [context.Process(target=_prepare, args=(str(cache), str(tmp_path / "out"), start))
                   for _ in range(4)]  # fmt: skip
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert [w.exitcode for w in workers] == [0] * 4
        assert _marker(cache) == tracking.SCORES_CACHE


def test_a_track_refuses_a_foreign_scores_cache_and_an_output_does_not_replace_a_cache(
    shared_data, tmp_path, cli_error
):
    """A track run end to end: a user's folder as --scores-cache is refused before any scoring;
    a marked cache filled by a first run serves a second; a roles run's --out --overwrite onto the
    cache is refused by the cache's marker."""
    run = write_run(tmp_path / "run", shared_data, (1, 3))
    argv = ["--run", str(run), "--no-figures", "--bootstrap", "0", *_flags(shared_data, tmp_path / "parses")]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    message = cli_error(track.main, [*argv, "--out", str(tmp_path / "t0"), "--scores-cache", str(mine)])
    assert message.startswith(f"error: --scores-cache {mine} is not a scores cache: it holds thesis.tex")
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"] and not (tmp_path / "t0").exists()

    cache = tmp_path / "cache"
    track.main([*argv, "--out", str(tmp_path / "t1"), "--scores-cache", str(cache)])
    entries = sorted(cache.glob("step-*.npz"))
    assert len(entries) == 2 and _marker(cache) == tracking.SCORES_CACHE
    track.main([*argv, "--out", str(tmp_path / "t2"), "--scores-cache", str(cache)])
    assert (tmp_path / "t2" / "track.csv").read_bytes() == (tmp_path / "t1" / "track.csv").read_bytes()

    message = cli_error(roles.main, ["--ckpt", str(run / "checkpoints" / "3"), "--out", str(cache), "--overwrite",
                                     *_flags(shared_data, tmp_path / "parses")])  # fmt: skip
    assert message == (
        f"error: --out {cache} holds another kind of output ({tracking.SCORES_CACHE}), not an earlier roles output; "
        "--overwrite replaces only an output of the same kind (choose another --out)"
    )
    assert sorted(cache.glob("step-*.npz")) == entries
