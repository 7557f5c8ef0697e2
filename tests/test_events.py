"""Event times read from trajectories (analysis.heads.events): the rule against a slow reference,
and intervals that cover the planted event at their nominal rate, so that an interval too narrow,
one too wide and one that resamples each step on its own all fail.

The coverage simulations plant per-sequence scores whose population mean rises smoothly in log
step, with a per-sequence scale shared by every step (a sequence that attends strongly does so at
every checkpoint: what pairing across steps is for) and independent noise on top. The event of
the population mean at the analysed steps is the truth; each simulation draws a fresh sample of
sequences and asks whether the paired-resampling interval covers it. With 300 simulations the
coverage's standard error at 0.90 is 0.017, so the ±0.05 band is about three of them wide: a
correct interval leaves it with probability ~0.3%, and the simulations are seeded.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from analysis.heads import events
from sieves import stats

STEPS = np.array([1, 2, 4, 8, 16, 32, 64, 128, 200, 300, 400, 500, 650, 800, 1000, 1300, 1600, 2000, 3000, 5000])
X = events.log_steps(STEPS)
SIMULATIONS = 300
SEQUENCES = 150
REPLICATES = 400
NOMINAL = events.INTERVAL[1] - events.INTERVAL[0]


def _slow_positions(x, y, falling=False):
    """The module doc's rule, one trajectory at a time, written as it reads."""
    v = -np.asarray(y, float) if falling else np.asarray(y, float)
    early, final = v[0], v[-1]
    if not final > early or not np.isfinite(v).all():
        return [np.nan] * 4
    found = []
    for p in events.LEVELS:
        level = early + p * (final - early)
        j = len(v) - 1
        while j > 0 and v[j - 1] >= level:
            j -= 1
        found.append(x[j - 1] + (level - v[j - 1]) / (v[j] - v[j - 1]) * (x[j] - x[j - 1]))
    start = max(found[0] - (found[2] - found[0]) / 8, x[0])
    return [start, *found]


def test_event_positions_match_the_slow_rule_on_random_trajectories():
    rng = np.random.default_rng(0)
    # Rising, falling back, flat, noisy: random walks with a drift cover every branch of the rule.
    y = np.cumsum(rng.normal(0.2, 1.0, size=(300, STEPS.size)), axis=1)
    fast = events.event_positions(X, y)
    slow = np.array([_slow_positions(X, row) for row in y])
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(slow))
    # Both compute the same few float64 operations in the same order: equal to the last bit or two.
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-12)
    falling = events.event_positions(X, -y, falling=True)
    np.testing.assert_array_equal(falling, fast)


def test_a_brief_excursion_is_no_event_and_a_flat_or_falling_trajectory_has_none():
    y = np.array([1.0, 1.0, 5.0, 1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 5.0])
    x = np.arange(10.0)
    pos = events.event_positions(x, y)
    # The 50% level (3.0) is passed at index 2 and lost again; the event is the crossing from which
    # the trajectory stays above it: between indices 5 (2.0) and 6 (3.0), at 6.
    assert pos[2] == pytest.approx(6.0)
    assert np.isnan(events.event_positions(x, np.ones(10))).all()
    assert np.isnan(events.event_positions(x, -np.arange(10.0))).all()
    assert list(events.statuses(np.stack([y, np.ones(10), [0, 9, 9, 9, 9, 9, 1, 1, 1, 2.0]]))) == [
        "rises", "no_rise", "falls_back",
    ]  # fmt: skip


def _sigmoid(x, centre=5.5, width=0.6, low=1.0, high=12.0):
    return low + (high - low) / (1 + np.exp(-(x - centre) / width))


def _ramp(x, start=3.5, stop=7.5, low=1.0, high=12.0):
    return low + (high - low) * np.clip((x - start) / (stop - start), 0, 1)


def _sample(rng, mean, sequences=SEQUENCES):
    """Per-sequence scores [n, S]: the mean trajectory times a per-sequence scale (shared across
    steps) plus independent noise."""
    scale = 1 + 0.35 * rng.standard_normal((sequences, 1))
    return mean[None, :] * scale + 1.0 * rng.standard_normal((sequences, mean.size))


def _coverage(mean, paired=True, seed=0, simulations=SIMULATIONS):
    """Per event, the share of simulations whose interval covers the population's event."""
    truth = events.event_positions(X, mean)
    rng = np.random.default_rng(seed)
    hits = np.zeros(len(events.EVENTS))
    for _ in range(simulations):
        scores = _sample(rng, mean)
        if paired:
            weights = stats.resample_weights(SEQUENCES, REPLICATES, rng)
            reps = weights @ scores / SEQUENCES
        else:  # each step resampled on its own: the pairing across steps lost
            reps = np.stack([stats.resample_weights(SEQUENCES, REPLICATES, rng) @ scores[:, s] / SEQUENCES
                             for s in range(STEPS.size)], axis=1)  # fmt: skip
        low, high, _ = events.quantile_interval(events.event_positions(X, reps))
        hits += (low <= truth) & (truth <= high)
    return hits / simulations


@pytest.mark.slow
@pytest.mark.parametrize("shape", [_sigmoid, _ramp], ids=["sigmoid", "linear"])
def test_event_intervals_cover_the_planted_event_at_their_nominal_rate(shape):
    coverage = _coverage(shape(X))
    print("coverage", dict(zip(events.EVENTS, coverage.round(3).tolist(), strict=True)))  # `pytest -rP`
    assert np.all(np.abs(coverage - NOMINAL) <= 0.05), dict(zip(events.EVENTS, coverage, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("interval", [(0.25, 0.75), (0.0005, 0.9995)], ids=["50%", "99.9%"])
def test_an_interval_too_narrow_or_too_wide_fails_the_coverage_bar(monkeypatch, interval):
    monkeypatch.setattr(events, "INTERVAL", interval)
    coverage = _coverage(_sigmoid(X), simulations=150)
    print("coverage", dict(zip(events.EVENTS, coverage.round(3).tolist(), strict=True)))
    assert np.all(np.abs(coverage - NOMINAL) > 0.05), dict(zip(events.EVENTS, coverage, strict=True))


@pytest.mark.slow
def test_resampling_each_step_on_its_own_fails_the_coverage_bar():
    # The per-sequence scale moves every step together and leaves the crossings where they are;
    # resampling steps separately turns it into noise between steps: intervals far too wide.
    coverage = _coverage(_sigmoid(X), paired=False, simulations=100)
    print("coverage", dict(zip(events.EVENTS, coverage.round(3).tolist(), strict=True)))
    # The bar is every event within ±0.05.
    assert not np.all(np.abs(coverage - NOMINAL) <= 0.05), dict(zip(events.EVENTS, coverage, strict=True))
    assert coverage.mean() - NOMINAL > 0.05


def _ratio_curves(weights, loss, masked):
    return (weights @ loss) / (weights @ masked)


@pytest.mark.slow
def test_a_held_out_curve_with_autocorrelated_noise_gets_its_nominal_coverage():
    """A falling loss curve, each evaluation the ratio of per-sequence loss sums to masked counts;
    each sequence's deviation follows an AR(1) process across evaluations (ρ = 0.8), as a held-out
    sequence that is hard stays hard. Resampling held-out sequences, paired across evaluations."""
    rng = np.random.default_rng(1)
    mean_loss = 9.0 - 5.0 / (1 + np.exp(-(X - 6.0) / 0.5))
    truth = events.event_positions(X, mean_loss, falling=True)
    hits = np.zeros(len(events.EVENTS))
    n = 200
    for _ in range(SIMULATIONS):
        masked = rng.integers(5, 25, size=(n, 1)).astype(float)
        noise = np.empty((n, STEPS.size))
        noise[:, 0] = rng.standard_normal(n)
        for s in range(1, STEPS.size):
            noise[:, s] = 0.8 * noise[:, s - 1] + 0.6 * rng.standard_normal(n)
        loss = masked * (mean_loss[None, :] + 1.5 * noise)
        weights = stats.resample_weights(n, REPLICATES, rng)
        low, high, _ = events.quantile_interval(
            events.event_positions(X, _ratio_curves(weights, loss, masked[:, 0][None, :].T.repeat(STEPS.size, 1)),
                                   falling=True))  # fmt: skip
        hits += (low <= truth) & (truth <= high)
    coverage = hits / SIMULATIONS
    print("coverage", dict(zip(events.EVENTS, coverage.round(3).tolist(), strict=True)))
    assert np.all(np.abs(coverage - NOMINAL) <= 0.05), dict(zip(events.EVENTS, coverage, strict=True))


@pytest.mark.slow
def test_the_joint_difference_recovers_a_planted_lead_at_its_nominal_coverage():
    """A head rising around step ~245 and a curve around ~665: the difference of their 50% events,
    from jointly drawn replicates (each its own sequences, drawn together), covers the planted
    difference at its nominal rate and is called "before"."""
    rng = np.random.default_rng(2)
    head, curve = _sigmoid(X, centre=5.5), _sigmoid(X, centre=6.5)
    truth = events.to_steps(events.event_positions(X, head)[2]) - events.to_steps(events.event_positions(X, curve)[2])
    assert truth < -300
    hits, before = 0, 0
    for _ in range(SIMULATIONS):
        a, b = _sample(rng, head), _sample(rng, curve)
        wa = stats.resample_weights(SEQUENCES, REPLICATES, rng)
        wb = stats.resample_weights(SEQUENCES, REPLICATES, rng)
        ra = events.to_steps(events.event_positions(X, wa @ a / SEQUENCES)[:, 2])
        rb = events.to_steps(events.event_positions(X, wb @ b / SEQUENCES)[:, 2])
        _, low, high = events.difference(ra, rb)
        hits += low <= truth <= high
        before += events.relation_of_difference(low, high) == "before"
    print(f"coverage {hits / SIMULATIONS:.3f}, called before in {before} of {SIMULATIONS}")
    assert abs(hits / SIMULATIONS - NOMINAL) <= 0.05
    assert before == SIMULATIONS


def test_the_earliest_event_is_the_minimum_in_each_replicate():
    rng = np.random.default_rng(3)
    reps = rng.uniform(0, 100, size=(50, 6))
    reps[rng.random(reps.shape) < 0.3] = np.nan
    reps[7] = np.nan
    slow = []
    for row in reps:
        present = [v for v in row if not np.isnan(v)]
        slow.append(min(present) if present else np.nan)
    np.testing.assert_array_equal(events.earliest(reps), np.array(slow))
    # A planted defect, the minimum of the point estimates carried into every replicate, differs.
    assert not np.array_equal(events.earliest(reps), np.full(50, np.nanmin(reps)))


def test_relation_of_difference_reads_the_interval_against_zero():
    assert events.relation_of_difference(-10, -1) == "before"
    assert events.relation_of_difference(-10, 0) == "overlapping"
    assert events.relation_of_difference(1, 10) == "after"
    assert events.relation_of_difference(np.nan, 10) == ""


def test_events_table_has_the_contract_columns_and_whole_steps():
    rows = pd.DataFrame([("mrpc", 0, h, "prev") for h in range(3)], columns=["task", "layer", "head", "role"])
    means = np.stack([_sigmoid(X), np.ones(STEPS.size), _ramp(X)], axis=1)
    rng = np.random.default_rng(4)
    reps = means[None] + 0.05 * rng.standard_normal((64, *means.shape))
    table = events.events_table(events.trajectories(rows, STEPS, means, reps))
    assert list(table.columns) == events.EVENT_COLUMNS
    assert len(table) == 3 * len(events.EVENTS)
    assert set(table["event"]) == set(events.EVENTS)
    flat = table[table["head"] == 1]
    assert (flat["status"] == "no_rise").all() and flat["step"].isna().all()
    risen = table[(table["head"] == 0)].set_index("event")
    assert risen.loc["rise_start", "step"] <= risen.loc["rise_10", "step"] <= risen.loc["rise_50", "step"]
    assert risen.loc["rise_50", "low"] <= risen.loc["rise_50", "step"] <= risen.loc["rise_50", "high"]
    assert str(table["step"].dtype) == "Int64"


def test_events_do_not_depend_on_a_threshold():
    # The rule reads nothing but the trajectory: an affine change of the score's units moves no event.
    y = _sigmoid(X)
    for a, b in itertools.product((0.5, 3.0), (-2.0, 10.0)):
        np.testing.assert_allclose(events.event_positions(X, a * y + b), events.event_positions(X, y), atol=1e-12)


# -- through analysis.track -------------------------------------------------------------------


def _planted_scoring(monkeypatch):
    """`analysis.track` scoring planted per-sequence scores: every head's mean rises smoothly in log
    step (each head at its own centre), with a per-sequence scale; the real scoring's shapes and
    indices are kept. The step being scored is read from the checkpoint loaded just before."""
    from analysis.heads import tracking

    loaded = {}
    real_load, real_score = tracking.from_pretrained, tracking.score_sequences

    def load(source, **kwargs):
        loaded["step"] = source.step
        return real_load(source, **kwargs)

    def score(scorer, sequences, config, timings):
        results = real_score(scorer, sequences, config, timings)
        x = np.log1p(loaded["step"])
        for task, result in results.items():
            rng = np.random.default_rng(len(task))
            for role, values in result.scores.items():
                n, layers, heads = values.shape
                centres = np.linspace(1.0, 4.0, layers * heads).reshape(layers, heads)
                mean = 1 + 8 / (1 + np.exp(-(x - centres) / 0.5))
                scale = 1 + 0.1 * rng.standard_normal((n, 1, 1))
                result.scores[role] = (mean[None] * scale).astype(values.dtype)
        return results

    monkeypatch.setattr(tracking, "from_pretrained", load)
    monkeypatch.setattr(tracking, "score_sequences", score)


def test_events_are_the_same_at_any_tau_while_the_onsets_move(monkeypatch, shared_data, tmp_path):
    from test_track import _flags, write_run

    from analysis import track

    _planted_scoring(monkeypatch)
    steps = (1, 3, 10, 31, 96)
    run = write_run(tmp_path / "run", shared_data, steps)
    _write_heldout(run, sorted({*steps, 2, 5, 7, 15, 20, 45, 60, 80}))
    outs = {}
    for tau in ("3", "5"):
        outs[tau] = tmp_path / f"tau{tau}"
        track.main(["--run", str(run), "--out", str(outs[tau]), "--tau", tau, "--bootstrap", "50",
                    "--scores-cache", str(tmp_path / f"cache{tau}"), "--no-figures",
                    *_flags(shared_data, tmp_path / "parses")])  # fmt: skip
    assert (outs["3"] / "events.csv").read_bytes() == (outs["5"] / "events.csv").read_bytes()
    assert (outs["3"] / "onset.csv").read_bytes() != (outs["5"] / "onset.csv").read_bytes()
    table = pd.read_csv(outs["3"] / "events.csv")
    assert list(table.columns) == events.EVENT_COLUMNS
    rises = table[(table["event"] == "rise_50") & (table["status"] == "rises")]
    assert len(rises) > 0 and rises["low"].notna().all()
    curves = pd.read_csv(outs["3"] / events.CURVE_EVENTS_CSV)
    loss = curves[curves["curve"] == "heldout_mlm_loss"].set_index("event")
    assert loss["low"].notna().all() and (loss["status"] == "rises").all()
    leads = pd.read_csv(outs["3"] / events.LEAD_LAG_CSV)
    assert leads["joint"].all() and set(leads["event"]) == set(events.EVENTS)
    assert set(leads["relation"]) <= {"before", "overlapping", "after"}
    # Every interval of lead_lag.csv regenerates from the replicates stored beside it.
    found, curve = events.load_lead_lag_replicates(outs["3"] / events.LEAD_LAG_REPLICATES)
    again = events.lead_lag(found, curve, "heldout_mlm_loss")
    pd.testing.assert_frame_equal(again, leads, check_dtype=False)
    curve_onsets = pd.read_csv(outs["3"] / "curve_onsets.csv").set_index("curve")
    assert curve_onsets.loc["heldout_mlm_loss", "interval_from"] == "sequences"
    robust = pd.read_csv(outs["3"] / "robustness.csv")
    assert set(robust["tau"]) == {2.0, 3.0, 5.0, 8.0} and set(robust["reading"]) == {"onset", "rise_start", "rise_50"}
    assert set(robust.loc[robust["reading"] == "onset", "cap"]) == {3, 4, 5, 6}
    # Both scores from the one scoring pass: the run's β and the share derived from it.
    assert list(pd.unique(robust["score"])) == ["beta", "share"]


def _write_heldout(run, steps, sequences=40):
    """metrics.jsonl's held-out rows and the per-sequence sums behind them at `steps` (evaluations
    between checkpoints too): a loss falling around step 20, each sequence with its own difficulty."""
    import json

    from analysis.common import heldout

    rng = np.random.default_rng(0)
    difficulty = 1 + 0.2 * rng.standard_normal(sequences)
    masked = rng.integers(3, 10, sequences).astype(np.int32)
    (run / heldout.SEQUENCES_DIR).mkdir()
    rows = []
    for step in steps:
        per_token = (4 + 5 / (1 + np.exp((np.log1p(step) - 3.0) / 0.5))) * difficulty
        loss = (per_token * masked).astype(np.float32)
        hits = np.minimum(masked, rng.binomial(masked, 0.1 + 0.8 * step / 100)).astype(np.int32)
        np.savez(run / heldout.SEQUENCES_DIR / f"step-{step:09d}.npz", mlm_loss=loss, mlm_hits=hits, masked=masked)
        rows.append(
            {
                "step": step,
                "heldout_mlm_loss": float(loss.sum() / masked.sum()),
                "heldout_mlm_accuracy": float(hits.sum() / masked.sum()),
                "heldout_sequences": sequences,
            }
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
