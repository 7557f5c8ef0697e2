"""Reliability round four (issue 52): inputs a user names are read only when they are regular files.

A FIFO given as a CoNLL-U, GLUE or text file used to block the run forever (the read waits for a
writer), and /dev/zero to read until the memory ran out; every reader of a named input goes through
`bertjax.runinfo.read_input`, which now refuses both with one line, at once."""

from __future__ import annotations

import json
import os
import threading

import pytest

from bertjax import runinfo
from bertjax.errors import UserError
from sieves.parse import read_conllu


def _within(seconds: float, call):
    """`call()`'s exception, failing the test when it has not returned within `seconds`."""
    outcome = {}

    def target():
        try:
            call()
        except BaseException as error:  # noqa: BLE001 — handed back to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s"
    return outcome.get("error")


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipe_or_a_device_named_as_an_input_is_one_line_at_once(kind, tmp_path):
    if kind == "fifo":
        path = tmp_path / "trees.conllu"
        os.mkfifo(path)
    else:
        path = "/dev/zero"
    error = _within(10, lambda: read_conllu(path))
    assert isinstance(error, UserError)
    assert str(error) == f"{path}: not a regular file (a pipe, device or directory); give the file itself"


def test_an_input_over_the_size_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "big.tsv"
    path.write_bytes(b"x" * 2048)
    monkeypatch.setattr(runinfo, "MAX_INPUT_BYTES", 1024)
    with pytest.raises(UserError, match="over the"):
        runinfo.read_input(path)
    monkeypatch.setattr(runinfo, "MAX_INPUT_BYTES", 4096)
    assert runinfo.read_input(path) == b"x" * 2048


def test_a_cache_entry_holding_part_of_the_sequences_is_scored_again(shared_data, tmp_path, caplog):
    """A scores-cache entry whose task holds 10 of the run's 20 sequences (before: used, n = 10 at
    that step, no warning) is reported and its step scored again."""
    import numpy as np
    from test_track import _flags, write_run

    from analysis import track
    from analysis.heads import tracking

    run = write_run(tmp_path / "run", shared_data, (1, 3))
    argv = ["--run", str(run), "--scores-cache", str(tmp_path / "cache"), "--no-figures", "--bootstrap", "0",
            *_flags(shared_data, tmp_path / "parses")]  # fmt: skip
    track.main([*argv, "--out", str(tmp_path / "first")])
    entry = min((tmp_path / "cache").glob("step-000000003-*.npz"))
    stored = tracking.load_scores(entry)
    with np.load(entry) as f:
        about = f["about"]
    for result in stored.values():
        result.n_sequences = 10
    settings_and_identity = json.loads(str(about))
    tracking.save_scores(entry, stored, settings_and_identity["settings"], settings_and_identity["checkpoint"])
    track.main([*argv, "--out", str(tmp_path / "second")])
    assert any("sequences; its step is scored again" in r.getMessage() for r in caplog.records)
    first = (tmp_path / "first" / "track.csv").read_bytes()
    assert (tmp_path / "second" / "track.csv").read_bytes() == first
