"""The scores cache of `analysis.track` as a cache: an entry that cannot be read is scored again,
with a warning naming it, and the run's rows equal those of a run from a sound cache."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pandas as pd
import pytest
from test_track import write_checkpoint
from transformers import BertTokenizerFast

from analysis import track
from analysis.heads import tracking

STEPS = (2, 7)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, shared_data):
    workdir = tmp_path_factory.mktemp("run")
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(workdir / "tokenizer")
    for seed, step in enumerate(STEPS):
        write_checkpoint(workdir, step, seed)
    return workdir


@pytest.fixture(scope="module")
def sound(run_dir, shared_data, tmp_path_factory):
    """A first run: its cache (one entry a step) and its table."""
    root = tmp_path_factory.mktemp("sound")
    argv = ["--run", str(run_dir), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "8",
            "--batch-size", "8", "--max-length", "32", "--cache-dir", str(root / "parses"), "--no-figures"]  # fmt: skip
    track.main([*argv, "--out", str(root / "out"), "--scores-cache", str(root / "cache")])
    return argv, root / "cache", pd.read_csv(root / "out" / tracking.TRACK_CSV)


def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _random_bytes(path):
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


def _empty(path):
    path.write_bytes(b"")


def _object_array(path):
    # A well-formed archive whose arrays need pickle to load, which the cache never allows.
    with np.load(path) as stored:
        arrays = {k: stored[k] for k in stored.files}
    arrays["mrpc/local"] = np.array([{"a": 1}], dtype=object)
    with path.open("wb") as f:
        np.savez(f, **arrays)


def _bad_member(path):
    # One stored array's last byte flipped inside a well-formed archive: only its CRC finds it.
    with zipfile.ZipFile(path) as z:
        member = z.read("mrpc/local.npy")
    raw = bytearray(path.read_bytes())
    at = raw.find(member) + len(member) - 1
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [_truncated, _random_bytes, _empty, _object_array, _bad_member])
def test_an_unreadable_cache_entry_is_scored_again_with_a_warning(sound, tmp_path, caplog, damage):
    argv, cache, expected = sound
    copy = tmp_path / "cache"
    copy.mkdir()
    for entry in cache.glob("step-*.npz"):
        (copy / entry.name).write_bytes(entry.read_bytes())
    broken = sorted(copy.glob(f"step-{STEPS[1]:09d}-*.npz"))
    assert len(broken) == 1
    damage(broken[0])
    caplog.clear()

    track.main([*argv, "--out", str(tmp_path / "out"), "--scores-cache", str(copy)])

    (warning,) = [r.getMessage() for r in caplog.records if r.name == "analysis.heads.tracking"]
    assert str(broken[0]) in warning and "scored again" in warning
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["analysed_steps"] == [STEPS[1]] and run["cached_steps"] == [STEPS[0]]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "out" / tracking.TRACK_CSV), expected, check_exact=True)
    # the entry was replaced by a sound one: the next run reads every step from the cache
    caplog.clear()
    track.main([*argv, "--out", str(tmp_path / "out"), "--scores-cache", str(copy)])
    assert not [r for r in caplog.records if r.name == "analysis.heads.tracking"]
    assert json.loads((tmp_path / "out" / "run.json").read_text())["analysed_steps"] == []
