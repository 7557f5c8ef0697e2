"""Role onset: the first step from which a head holds a role at every later step."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis.heads import onset
from bertjax.errors import UserError


def _track(held: dict[tuple[int, int, str], list[bool]], steps: list[int]) -> pd.DataFrame:
    rows = []
    for (layer, head, role), flags in held.items():
        for i, (step, flag) in enumerate(zip(steps, flags, strict=True)):
            rows.append({"step": step, "task": "mrpc", "layer": layer, "head": head, "role": role,
                         "mean": 1.0 + i + layer, "assigned": flag})  # fmt: skip
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # the order of track.csv must not matter


def _slow_onset(flags: list[bool]) -> int | None:
    """The first index from which every later flag is set."""
    for i in range(len(flags)):
        if all(flags[i:]):
            return i
    return None


@given(st.lists(st.booleans(), min_size=1, max_size=12))
def test_onset_is_the_first_step_held_at_every_later_step(flags):
    steps = sorted(np.random.default_rng(len(flags)).choice(10_000, size=len(flags), replace=False).tolist())
    table = onset.role_onsets(_track({(0, 0, "prev"): flags}, steps))
    (row,) = table.itertuples()
    expected = _slow_onset(flags)
    if expected is None:
        assert pd.isna(row.onset_step) and np.isnan(row.mean_at_onset)
    else:
        assert row.onset_step == steps[expected] and row.mean_at_onset == 1.0 + expected
    assert row.held_at_last_step == flags[-1]


def test_a_flickering_role_dates_from_when_it_last_came_on():
    steps = [1, 2, 5, 9, 16]
    track = _track({(0, 1, "prev"): [True, False, True, True, True], (1, 0, "sep"): [True, True, True, True, False],
                    (1, 1, "sep"): [False, False, False, True, True]}, steps)  # fmt: skip
    table = onset.role_onsets(track).set_index(["layer", "head", "role"])
    assert table.loc[(0, 1, "prev"), "onset_step"] == 5
    assert pd.isna(table.loc[(1, 0, "sep"), "onset_step"])  # lost at the last step: no onset
    assert table.loc[(1, 1, "sep"), "onset_step"] == 9 and table.loc[(1, 1, "sep"), "mean_at_onset"] == 1.0 + 3 + 1
    printed = onset.format_onsets(track, onset.role_onsets(track))
    lines = {line.split()[0]: line.split()[1:] for line in printed.splitlines()[3:]}
    # prev: first held at step 1, held from step 5, 1 head at the end; sep: first held 1, from 9, 1 head
    assert lines == {"prev": ["1", "5", "1"], "sep": ["1", "9", "1"]}


def test_heldout_metrics_are_read_per_step_the_last_record_winning(tmp_path):
    assert onset.read_heldout(tmp_path) is None
    records = [{"step": 1, "loss": 9.0}, {"step": 1, "heldout_mlm_accuracy": 0.1, "heldout_mlm_loss": 8.0},
               {"step": 5, "heldout_mlm_accuracy": 0.2, "heldout_mlm_loss": 7.0},
               {"step": 5, "heldout_mlm_accuracy": 0.25, "heldout_mlm_loss": 6.5}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    heldout = onset.read_heldout(tmp_path)
    assert heldout["heldout_mlm_accuracy"].to_dict() == {1: 0.1, 5: 0.25}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n")
    assert onset.read_heldout(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[1]) + '\n{"step": 5, "heldout_ml')
    with pytest.raises(UserError, match=r"metrics\.jsonl:2: not a JSON row"):
        onset.read_heldout(tmp_path)


def test_the_onset_figure_counts_heads_and_draws_heldout_accuracy(monkeypatch, tmp_path):
    steps = [1, 3, 10]
    track = _track({(0, 0, "prev"): [False, True, True], (0, 1, "prev"): [False, False, True],
                    (0, 0, "sep"): [True, True, False]}, steps)  # fmt: skip
    assert onset.heads_holding(track, "mrpc").to_dict("list") == {"prev": [0, 1, 2], "sep": [1, 1, 0]}
    figures = []
    monkeypatch.setattr(onset, "save_figure", lambda fig, out_dir, stem: figures.append(fig) or [])
    heldout = pd.DataFrame({"heldout_mlm_accuracy": [0.05, 0.1, 0.2, 0.3]}, index=pd.Index([1, 3, 7, 10], name="step"))
    onset.plot_onset(track, "mrpc", tmp_path, "mrpc_onset", heldout=heldout)
    counts_axis, accuracy_axis = figures[0].axes
    drawn = {line.get_label(): line.get_ydata().tolist() for line in counts_axis.lines}
    assert drawn == {"prev": [0, 1, 2], "sep": [1, 1, 0]}
    (accuracy,) = accuracy_axis.lines
    # only the analysed steps: step 7 has no checkpoint in the track
    assert accuracy.get_xdata().tolist() == [1, 3, 10] and accuracy.get_ydata().tolist() == [0.05, 0.1, 0.3]
    figures.clear()
    onset.plot_onset(track, "mrpc", tmp_path, "mrpc_onset")
    assert len(figures[0].axes) == 1
