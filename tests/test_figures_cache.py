"""The scores cache of `analysis.track` as a cache: an entry that cannot be read is scored again,
with a warning naming it, and the run's rows equal those of a run from a sound cache."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_track import write_run

from analysis import track
from analysis.heads import tracking

STEPS = (2, 7)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, shared_data) -> Path:
    return write_run(tmp_path_factory.mktemp("run"), shared_data, STEPS)


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


def test_a_figure_is_drawn_once_per_content(tmp_path):
    from analysis.common import figures
    from analysis.common.figures import FigureCache, figure_formats

    drawn = []

    def draw(out_dir, stem, label):
        drawn.append(label)
        paths = [out_dir / f"{stem}.{fmt}" for fmt in figures._formats.get()]
        for path in paths:
            path.write_bytes(label.encode())
        return paths

    cache = FigureCache(tmp_path / "cache", [figures])
    first, again = tmp_path / "first", tmp_path / "again"
    first.mkdir()
    with figure_formats(["png", "svg"]):
        made = cache.figure("mrpc_x", b"rows", lambda: draw(first, "mrpc_x", "one"), first)
        copied = cache.figure("mrpc_x", b"rows", lambda: draw(again, "mrpc_x", "two"), again)
    assert drawn == ["one"] and [p.name for p in copied] == ["mrpc_x.png", "mrpc_x.svg"]
    assert [p.read_bytes() for p in copied] == [p.read_bytes() for p in made]
    # Other data, another stem, another set of formats: drawn.
    with figure_formats(["png", "svg"]):
        cache.figure("mrpc_x", b"other rows", lambda: draw(again, "mrpc_x", "three"), again)
        cache.figure("sst2_x", b"rows", lambda: draw(again, "sst2_x", "four"), again)
    with figure_formats(["png"]):
        cache.figure("mrpc_x", b"rows", lambda: draw(again, "mrpc_x", "five"), again)
    # Other drawing code (a module more, standing in for an edited one): drawn.
    with figure_formats(["png", "svg"]):
        FigureCache(tmp_path / "cache", [figures, pytest]).figure(
            "mrpc_x", b"rows", lambda: draw(again, "mrpc_x", "six"), again
        )
    assert drawn == ["one", "three", "four", "five", "six"]
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no temporaries left


def test_a_rerun_copies_its_figures_and_a_new_tau_redraws_them(run_dir, shared_data, tmp_path, monkeypatch):
    argv = ["--run", str(run_dir), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "8",
            "--batch-size", "8", "--max-length", "32", "--cache-dir", str(tmp_path / "parses"),
            "--scores-cache", str(tmp_path / "cache")]  # fmt: skip
    track.main([*argv, "--out", str(tmp_path / "first")])
    pngs = sorted(p.name for p in (tmp_path / "first").glob("*.png"))
    assert len(pngs) == 4

    def refuse(*args, **kwargs):
        raise AssertionError("a figure was drawn again")

    with monkeypatch.context() as patch:
        for name in ("plot_role_fractions", "plot_emergence", "plot_mean_beta"):
            patch.setattr(tracking, name, refuse)
        patch.setattr(tracking.onset, "plot_onset", refuse)
        track.main([*argv, "--out", str(tmp_path / "again")])
    for name in pngs:
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "first" / name).read_bytes()
    run = json.loads((tmp_path / "again" / "run.json").read_text())
    assert sorted(run["figures"]) == pngs

    drawn = []
    real = tracking.plot_mean_beta
    monkeypatch.setattr(tracking, "plot_mean_beta", lambda *a, **k: drawn.append(1) or real(*a, **k))
    track.main([*argv, "--out", str(tmp_path / "tau"), "--tau", "1.5"])
    assert drawn == [1]  # τ is drawn in the mean-β figure


def test_a_cached_rerun_loads_neither_spacy_nor_transformers(sound):
    """What makes a re-run fast (BENCHMARKS.md row 7): with every step in the scores cache, the
    cache key is computed from files (the tokenizer's, spaCy's meta.json) and nothing is encoded."""
    argv, cache, expected = sound
    out = cache.parent / "rerun"
    script = ("import sys; from analysis import track; track.main(sys.argv[1:]); "
              "print('loaded:', sorted(m for m in ('transformers', 'spacy', 'torch') if m in sys.modules))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", script, *argv, "--out", str(out), "--scores-cache", str(cache)],
                            capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert result.stdout.splitlines()[-1] == "loaded: []"
    assert json.loads((out / "run.json").read_text())["analysed_steps"] == []
    pd.testing.assert_frame_equal(pd.read_csv(out / tracking.TRACK_CSV), expected, check_exact=True)
