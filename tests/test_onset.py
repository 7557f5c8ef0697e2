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
    heldout = pd.DataFrame({"heldout_mlm_loss": [9.0, 8.0, 7.5, 3.0]}, index=pd.Index([1, 3, 7, 10], name="step"))
    sas = pd.DataFrame({"step": [1, 3, 10, 1, 3, 10], "relation": ["all"] * 3 + ["nsubj"] * 3,
                        "uas": [0.1, 0.12, 0.4, 0.2, 0.3, 0.5], "baseline_uas": [0.3] * 6})  # fmt: skip
    onset.plot_onset(track, "mrpc", tmp_path, "mrpc_onset", heldout=heldout, sas=sas)
    loss_axis, sas_axis, counts_axis = figures[0].axes
    drawn = {line.get_label(): list(line.get_ydata()) for line in counts_axis.lines if line.get_label()[0] != "_"}
    assert drawn == {"prev": [0, 1, 2], "sep": [1, 1, 0]}
    (loss, *_) = loss_axis.lines
    # only the analysed steps: step 7 has no checkpoint in the track
    assert loss.get_xdata().tolist() == [1, 3, 10] and loss.get_ydata().tolist() == [9.0, 8.0, 3.0]
    assert sas_axis.lines[0].get_ydata().tolist() == [0.1, 0.12, 0.4]
    # the steepest drop (3 → 10) is shaded on every panel, the SAS onset (step 3) dashed
    assert all(len(ax.patches) == 1 for ax in figures[0].axes)
    assert list(sas_axis.lines[-1].get_xdata()) == [3, 3]
    figures.clear()
    onset.plot_onset(track, "mrpc", tmp_path, "mrpc_onset")
    assert len(figures[0].axes) == 1


def _broken(steps: np.ndarray, break_step: int, top_step: int, noise: float, seed: int) -> np.ndarray:
    """Flat at 0.2 up to the break, a straight rise to 0.8 at `top_step`, flat after; plus noise."""
    rise = np.clip((steps - break_step) / (top_step - break_step), 0.0, 1.0)
    return 0.2 + 0.6 * rise + np.random.default_rng(seed).normal(0.0, noise, steps.size)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("break_step", [3000, 7000, 12000])
def test_the_ramp_onset_finds_a_known_break(break_step, seed):
    steps = np.arange(0, 20001, 1000)
    # Noise at 1/60 of the rise: the break is still the unique best ramp (a break one checkpoint
    # off misfits by ~0.6/5 at a point, ~7 noise SDs).
    values = _broken(steps, break_step, break_step + 5000, noise=0.01, seed=seed)
    assert onset.ramp_onset(steps, values) == break_step
    # The loss's reading: the same break on a falling curve.
    row = onset.curve_onset_row("loss", "", steps, 10.0 - values, falling=True)
    assert row["onset_step"] == break_step and row["steepest_rate"] < 0


def test_an_off_by_one_break_is_not_accepted():
    steps = np.arange(0, 20001, 1000)
    values = _broken(steps, 7000, 12000, noise=0.0, seed=0)
    assert onset.ramp_onset(steps, values) == 7000
    # Exact data: the ramp from 7000 to 12000 fits with residual 0, and the planted off-by-ones
    # (a break one checkpoint early or late) do not: they misfit.
    assert onset.ramp_onset(steps[7:], values[7:]) == 7000
    assert onset.ramp_onset(steps, np.append(values[1:], 0.8)) == 6000  # the curve a checkpoint earlier
    assert onset.ramp_onset(steps, np.insert(values[:-1], 0, 0.2)) == 8000  # a checkpoint later


def test_ramp_onset_against_a_brute_force_grid():
    """The least-squares ramp by a slow grid over (p, q) at each (b, e), on an irregular, noisy curve."""
    steps = np.array([0, 100, 300, 700, 1500, 3100, 6300])
    values = np.array([1.0, 1.1, 0.9, 1.6, 3.0, 4.2, 4.0])
    p, q = np.meshgrid(np.linspace(0.0, 2.0, 201), np.linspace(0.0, 0.01, 1001), indexing="ij")
    best, best_b = np.inf, None
    for i, b in enumerate(steps[:-1]):
        for e in steps[i + 1 :]:
            x = np.clip(steps - b, 0, e - b)
            sse = np.sum((values - p[..., None] - q[..., None] * x) ** 2, axis=-1).min()
            if sse < best - 1e-9:
                best, best_b = sse, b
    assert onset.ramp_onset(steps, values) == best_b


def test_steepest_change_and_curves_without_a_rise():
    steps = np.array([0, 10, 20, 40])
    # per e-fold of 1 + step: 1/ln 11 = 0.42, 2/ln(21/11) = 3.09, 2/ln(41/21) = 2.99
    assert onset.steepest_change(steps, np.array([0.0, 1.0, 3.0, 5.0])) == (10, 20, pytest.approx(2 / np.log(21 / 11)))
    # The planted per-step reading would pick the late pair of a log-spaced series' early wiggle:
    # 1 → 4 falls 0.5 (0.17 per step), 251 → 1000 falls 2.3 (0.003 per step, 1.66 per e-fold).
    log_spaced = np.array([1, 4, 16, 63, 251, 1000])
    loss = np.array([5.08, 5.04, 4.54, 3.95, 3.38, 1.08])
    assert onset.steepest_change(log_spaced, -loss)[:2] == (251, 1000)
    assert onset.steepest_change(steps, np.array([3.0, 2.0, 1.0, 0.0])) is None
    assert onset.ramp_onset(steps, np.array([5.0, 4.0, 3.0, 2.0])) is None  # the best ramp falls
    assert onset.ramp_onset(steps[:2], np.array([0.0, 1.0])) is None


def test_curve_onsets_reads_the_loss_sas_and_role_counts():
    steps = [0, 1000, 2000, 3000, 4000]
    track = _track({(0, 0, "prev"): [False, False, True, True, True], (0, 1, "prev"): [False, False, False, True, True]},
                   steps)  # fmt: skip
    heldout = pd.DataFrame({"heldout_mlm_loss": [9.0, 9.0, 8.9, 4.0, 3.9], "heldout_mlm_accuracy": [0, 0.1, 0.1, 0.1, 0.3]},
                           index=pd.Index(steps, name="step"))  # fmt: skip
    sas = pd.Series([0.1, 0.1, 0.1, 0.5, 0.6], index=steps)
    table = onset.curve_onsets(track, heldout, sas).set_index("curve")
    assert table.loc["heldout_mlm_loss", ["steepest_from", "steepest_to"]].tolist() == [2000, 3000]
    assert table.loc["heldout_mlm_loss", "steepest_rate"] == pytest.approx(-4.9 / np.log(3001 / 2001), rel=1e-12)
    # The accuracy is read as it rises: its steepest rise is where it leaves its plateau.
    assert table.loc["heldout_mlm_accuracy", ["steepest_from", "steepest_to"]].tolist() == [3000, 4000]
    assert table.loc["heldout_mlm_accuracy", "steepest_rate"] > 0
    assert table.loc["sas", "onset_step"] == 2000
    assert table.loc["heads:prev", "onset_step"] == 1000 and table.loc["heads:prev", "task"] == "mrpc"
