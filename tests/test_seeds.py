"""The across-seed summary of onsets (analysis.heads.seeds) and `analysis.track --run A --run B`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_track import write_run

from analysis import track
from analysis.heads import onset, seeds, tracking
from analysis.heads.config import SEEDS_CSV
from bertjax.errors import UserError

STEPS = [1, 10, 100, 1000]


def _write_seed(directory, held_by_head: dict[int, list[bool]], changepoint: tuple[int, int, int]):
    """A track output directory of one task and role whose heads hold `prev` as given."""
    directory.mkdir(parents=True)
    rows = [{"step": s, "task": "mrpc", "layer": 0, "head": h, "role": "prev", "n": 50, "mean": 3.0,
             "assigned": flag} for h, flags in held_by_head.items() for s, flag in zip(STEPS, flags, strict=True)]  # fmt: skip
    track_table = pd.DataFrame(rows)
    track_table.to_csv(directory / "track.csv", index=False)
    onsets = onset.role_onsets(track_table)
    onsets["onset_low"] = onsets["onset_step"]
    onsets["onset_high"] = onsets["onset_step"]
    onsets.to_csv(directory / "onset.csv", index=False)
    step, low, high = changepoint
    pd.DataFrame([{"curve": onset.LOSS_CURVE, "task": "", "changepoint_step": step, "changepoint_low": low,
                   "changepoint_high": high}]).to_csv(directory / "curve_onsets.csv", index=False)  # fmt: skip


def test_the_summary_gives_each_seed_and_the_median_and_range(tmp_path):
    _write_seed(tmp_path / "s0", {0: [False, True, True, True], 1: [False, False, True, True]}, (10, 1, 10))
    _write_seed(tmp_path / "s1", {0: [False, False, True, True], 1: [False, False, False, True]}, (10, 10, 100))
    _write_seed(tmp_path / "s2", {0: [False, False, False, False], 1: [False, False, False, True]}, (100, 10, 100))
    table, tracks = seeds.summarize({name: tmp_path / name for name in ("s0", "s1", "s2")})
    per = table[table["seed"] != "all"].set_index("seed")
    assert per.loc["s0", "earliest_onset"] == 10 and per.loc["s1", "earliest_onset"] == 100
    assert np.isnan(per.loc["s2", "earliest_onset"]) and per.loc["s2", "end_only"] == 1
    assert per["heads_at_last_step"].tolist() == [2, 2, 1]
    assert per["vs_loss"].tolist() == ["overlapping", "overlapping", ""]
    (all_row,) = table[table["seed"] == "all"].itertuples()
    assert (all_row.seeds, all_row.seeds_with_onset) == (3, 2)
    assert (all_row.earliest_onset_median, all_row.earliest_onset_min, all_row.earliest_onset_max) == (55, 10, 100)
    assert (all_row.heads_at_last_step_median, all_row.heads_at_last_step_min) == (2, 1)
    paths = seeds.plot_seeds(tracks, "mrpc", tmp_path, "mrpc_seeds")
    assert [p.name for p in paths] == ["mrpc_seeds.png"]


def test_one_seed_or_a_directory_without_a_track_is_one_error(tmp_path):
    _write_seed(tmp_path / "s0", {0: [False, True, True, True]}, (10, 1, 10))
    with pytest.raises(UserError, match="at least two"):
        seeds.summarize({"s0": tmp_path / "s0"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no track\.csv"):
        seeds.summarize({"s0": tmp_path / "s0", "empty": tmp_path / "empty"})


def test_run_repeats_for_seeds():
    config, runs = track.parse_args(["--run", "a", "--run", "b", "--out", "x"])
    assert runs == ["a", "b"] and config.roles.ckpt == "a"
    config, runs = track.parse_args(["--run", "a", "--persistence", "3", "--correction-scope", "series"])
    assert runs == ["a"] and config.persistence == 3 and config.correction_scope == "series"


def _intervals(*rows):
    return pd.DataFrame(rows, columns=["step", "low", "high"], dtype=float)


def test_a_contrast_compares_every_pair_of_seeds():
    first = _intervals((1100, 1000, 1200), (1200, 1100, 1300))
    # the second recipe: one seed clearly later, one overlapping, one that never reached it
    second = _intervals((2000, 1900, 2100), (1300, 1250, 1400), (np.nan, np.nan, np.nan))
    got = seeds.contrast(first, second)
    # pairs (2000 − 1100, 2000 − 1200, 1300 − 1100, 1300 − 1200) = (900, 800, 200, 100)
    assert got == {
        "seeds_first": 2, "seeds_second": 2, "pairs": 4, "difference_median": 500.0, "difference_min": 100.0,
        "difference_max": 900.0, "after": 3, "overlapping": 1, "before": 0,
    }  # fmt: skip
    # the planted defect, the recipes swapped: every difference and relation turns over
    swapped = seeds.contrast(second, first)
    assert (swapped["difference_min"], swapped["difference_max"], swapped["before"]) == (-900.0, -100.0, 3)


def test_a_contrast_where_no_pair_has_the_quantity():
    got = seeds.contrast(_intervals((1100, 1000, 1200)), _intervals((np.nan, np.nan, np.nan)))
    assert got["pairs"] == 0 and np.isnan(got["difference_median"]) and got["seeds_second"] == 0


def test_the_across_seed_lines_print_counts_as_integers(tmp_path):
    """Issue 52: `onset none in 0.0 of 2.0 seeds` (the seed-"all" columns are floats in the table,
    where the per-seed rows leave them empty)."""
    _write_seed(tmp_path / "s0", {0: [False, False, False, True], 1: [False, False, False, False]}, (10, 1, 10))
    _write_seed(tmp_path / "s1", {0: [False, False, False, False], 1: [False, False, False, True]}, (10, 1, 10))
    table, _ = seeds.summarize({name: tmp_path / name for name in ("s0", "s1")})
    line = tracking.seeds_text(table, 2).splitlines()[1]
    assert line == "  mrpc prev: onset none in 0 of 2 seeds; heads at last step 1 [1, 1]"


def _seed_flags(shared_data, parse_cache) -> list[str]:
    return ["--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "8", "--batch-size", "8",
            "--max-length", "32", "--cache-dir", str(parse_cache), "--bootstrap", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory, shared_data) -> list[Path]:
    root = tmp_path_factory.mktemp("seeds")
    return [write_run(root / f"s{i}", shared_data, (1, 3)) for i in range(2)]


def test_the_summary_never_replaces_files_it_did_not_write(seed_runs, shared_data, tmp_path, cli_error):
    """Issue 52's data loss: a user's `seeds_onsets.csv` and `mrpc_seeds.png` in `--out` were
    replaced without `--overwrite`; now `--out` is one output, written as a one-run track's is."""
    out = tmp_path / "out"
    out.mkdir()
    (out / SEEDS_CSV).write_text("mine\n")
    (out / "mrpc_seeds.png").write_bytes(b"my figure")
    argv = ["--run", str(seed_runs[0]), "--run", str(seed_runs[1]), "--out", str(out), "--figures", "onset",
            *_seed_flags(shared_data, tmp_path / "parses")]  # fmt: skip
    for overwrite in ([], ["--overwrite"]):
        message = cli_error(track.main, [*argv, *overwrite])
        assert message.startswith(f"error: --out {out} is not an earlier {tracking.SEEDS_OUTPUT}")
    assert (out / SEEDS_CSV).read_text() == "mine\n" and (out / "mrpc_seeds.png").read_bytes() == b"my figure"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no cache, lock or temporary made


def test_an_across_seed_output_is_written_whole_and_replaced_by_its_next_run(seed_runs, shared_data, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--run", str(seed_runs[0]), "--run", str(seed_runs[1]), "--out", str(out), "--figures", "onset",
            *_seed_flags(shared_data, tmp_path / "parses")]  # fmt: skip
    track.main(argv)
    first = capsys.readouterr().out
    assert "from the cache" in first and re.search(r"in \d+ of 2 seeds", first), first
    assert (out / SEEDS_CSV).is_file() and (out / "mrpc_seeds.png").is_file()
    assert (out / "s0" / "track.csv").is_file() and (out / "s1" / "track.csv").is_file()
    # Each run's run.json names where its output is, not the temporary it was written into.
    assert json.loads((out / "s1" / "run.json").read_text())["config"]["roles"]["out"] == str(out / "s1")
    # The steps' scores are cached beside --out (not inside it, which the next run replaces).
    assert sorted(p.name for p in (tmp_path / "out.cache").iterdir()) == [".bertjax-output", "s0", "s1"]
    (out / "stale.txt").write_text("gone with the output it was put in")
    track.main(argv)  # the same command again: its own kind of output, replaced, every step from the cache
    again = capsys.readouterr().out
    assert "track: 2 checkpoints, 2 from the cache" in again
    assert not (out / "stale.txt").exists() and (out / SEEDS_CSV).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.cache", "parses"]


def test_one_run_given_twice_is_one_error(seed_runs, monkeypatch, cli_error, tmp_path):
    """Issue 52: `--run RUN --run ./RUN` counted as two seeds."""
    monkeypatch.chdir(seed_runs[0].parent)
    out = tmp_path / "out"
    message = cli_error(track.main, ["--run", "s0", "--run", "./s0/", "--out", str(out)])
    assert message == (f"error: --run {seed_runs[0]} is given twice (as s0 and ./s0/); "
                       "each seed's run once")  # fmt: skip
    assert not out.exists()
