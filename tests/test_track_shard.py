"""`analysis.track --shard I/N`: independent jobs split a run's checkpoints and share the scores
cache, writing nothing into --out; a last invocation without --shard scores nothing and writes the
same outputs as one plain run. Two shards run as two processes at once; bad --shard values are one
line before anything is written; the parse cache takes two writers at once."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_track import write_run

from analysis import track
from analysis.common import examples
from analysis.heads import tracking
from bertjax import cli
from bertjax.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

# Shard 0 of 2 takes steps 1 and 10, shard 1 takes step 3 (round-robin in step order).
STEPS = (1, 3, 10)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, shared_data) -> Path:
    return write_run(tmp_path_factory.mktemp("run"), shared_data, STEPS)


@pytest.fixture(scope="module")
def flags(run_dir, shared_data, tmp_path_factory) -> list[str]:
    # Length 32 keeps every batch in one padded shape: one compile per process.
    return ["--run", str(run_dir), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "16",
            "--batch-size", "8", "--max-length", "32", "--cache-dir", str(tmp_path_factory.mktemp("parses")),
            "--no-figures"]  # fmt: skip


def cache_entries(cache: Path) -> list[str]:
    """Its files but the marker that makes it a scores cache."""
    return sorted(p.name for p in cache.iterdir() if p.name != ".bertjax-output") if cache.is_dir() else []


@pytest.fixture(scope="module")
def sharded(flags, tmp_path_factory):
    """`--shard 0/2` and `--shard 1/2` as two processes started together, on one cache."""
    jobs = tmp_path_factory.mktemp("jobs")
    out, cache = jobs / "out", jobs / "cache"
    command = [sys.executable, "-m", "analysis.track", *flags, "--out", str(out), "--scores-cache", str(cache)]
    processes = [
        subprocess.Popen([*command, "--shard", f"{i}/2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    results = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=300)
            results.append((process.returncode, stdout, stderr))
    finally:
        for process in processes:
            process.kill()
            process.wait()
    for code, _, stderr in results:
        assert code == 0, stderr[-3000:]
    return out, cache, [stdout for _, stdout, _ in results]


@pytest.mark.slow  # the `sharded` fixture: two shard processes and their imports, ~26 s of CPU
def test_two_shards_at_once_fill_the_cache_and_leave_no_out(sharded):
    out, cache, stdouts = sharded
    # Nothing beside the cache: no --out, no temporary or lock of it.
    assert sorted(p.name for p in out.parent.iterdir()) == ["cache"]
    # One entry per step and no temporary left.
    entries = cache_entries(cache)
    assert [e.split("-")[1] for e in entries] == [f"{s:09d}" for s in STEPS]
    assert not [e for e in entries if e.endswith(".tmp.npz")]
    assert "--shard 0/2: 2 of 3 checkpoints are this shard's (steps [1, 10])" in stdouts[0]
    assert "--shard 1/2: 1 of 3 checkpoints are this shard's (steps [3])" in stdouts[1]
    for stdout in stdouts:
        assert f"into {cache}" in stdout and "wrote nothing into --out" in stdout


@pytest.mark.slow  # the `sharded` fixture, when run alone
def test_the_merge_scores_nothing_and_writes_what_one_plain_run_writes(sharded, flags, tmp_path, monkeypatch):
    out, cache, _ = sharded
    plain = tmp_path / "plain"
    track.main([*flags, "--out", str(plain), "--scores-cache", str(tmp_path / "plain-cache")])

    loaded = []
    monkeypatch.setattr(tracking, "from_pretrained", lambda *a, **k: loaded.append(a))
    try:
        track.main([*flags, "--out", str(out), "--scores-cache", str(cache)])
        assert loaded == []
        assert (out / tracking.TRACK_CSV).read_bytes() == (plain / tracking.TRACK_CSV).read_bytes()
        run = json.loads((out / "run.json").read_text())
        assert run["analysed_steps"] == [] and run["cached_steps"] == list(STEPS)
        assert run["config"]["shard"] is None
    finally:
        # The other tests expect the state the shards left.
        if out.exists():
            out.rename(tmp_path / "merged")


@pytest.mark.slow  # the `sharded` fixture, when run alone
def test_a_shard_whose_members_are_cached_scores_nothing(sharded, flags, monkeypatch, capsys):
    out, cache, _ = sharded
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    loaded, encoded = [], []
    monkeypatch.setattr(tracking, "from_pretrained", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(examples, "encode_tasks", lambda *a: encoded.append(a) or {})
    track.main([*flags, "--out", str(out), "--scores-cache", str(cache), "--shard", "0/2"])
    printed = capsys.readouterr().out
    assert "2 from the cache" in printed and "0 to analyse" in printed
    # More jobs than checkpoints: the fourth of four has none.
    track.main([*flags, "--out", str(out), "--scores-cache", str(cache), "--shard", "3/4"])
    assert "0 of 3 checkpoints are this shard's" in capsys.readouterr().out
    assert loaded == [] and encoded == []
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before
    assert not out.exists()


@pytest.mark.parametrize("shard", ["2/2", "1/0", "x"])
def test_a_bad_shard_is_one_line_and_writes_nothing(flags, tmp_path, capsys, shard):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        cli.run(track.main, [*flags, "--out", str(out), "--shard", shard])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --shard '{shard}': give I/N") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_html_goes_with_the_merge_not_a_shard(flags, tmp_path, cli_error):
    line = cli_error(track.main, [*flags, "--out", str(tmp_path / "out"), "--shard", "0/2", "--html"])
    assert line.startswith("error: --html: a --shard job writes no outputs")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_cache_write_leaves_no_temporary(tmp_path, monkeypatch):
    def torn(file, **arrays):
        file.write(b"PK")  # the start of a zip, then the disk fills
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", torn)
    entry = tmp_path / "step-000000001-0.npz"
    with pytest.raises(UserError, match="no space left writing the scores cache entry"):
        tracking.save_scores(entry, {}, {}, {"step": 1})
    assert list(tmp_path.iterdir()) == []


# Two processes put overlapping parses into one cache, committing every 4 rows: sqlite's locking
# (and its 5 s busy wait) must serialise them, with no "database is locked" and no lost row.
PARSE_WRITER = """
import sys
from pathlib import Path
from sieves import parse

class Parser(parse.SpacyParser):
    def __init__(self, cache_dir):
        self.name, self.version, self.batch_size = "test", "1", 4
        self.cache_path = Path(cache_dir) / parse._CACHE_FILE

    def _run_spacy(self, texts):
        return iter([()] * len(texts))  # no words: only the cache's traffic matters here

parser = Parser(sys.argv[1])
for round in range(20):
    texts = [f"{sys.argv[2]} {round} {i}" for i in range(100)] + [f"both {round} {i}" for i in range(100)]
    assert len(parser.parse(texts)) == 200
"""


def test_two_processes_share_the_parse_cache(tmp_path):
    processes = [
        subprocess.Popen([sys.executable, "-c", PARSE_WRITER, str(tmp_path), name], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]  # fmt: skip
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-3000:]
    with sqlite3.connect(tmp_path / "spacy_parses.sqlite3") as connection:
        (rows,) = connection.execute("SELECT count(*) FROM parses").fetchone()
    assert rows == 2 * 20 * 100 + 20 * 100
