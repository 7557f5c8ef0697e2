"""docs/emergence.md holds exactly what docs/emergence_page.py derives from the committed files: a
number on the page without a file and a script behind it fails here."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def page_script(docs_script):
    return docs_script("emergence_page")


@pytest.fixture(scope="module")
def generated(page_script, shared_data) -> dict[str, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BERTJAX_DATA", str(shared_data))
        return {name: make() for name, make in page_script.BLOCKS.items()}


def _block(page_script, page: str, name: str) -> str:
    return page[slice(*page_script.block_span(page, name))]


@pytest.mark.parametrize("name", ["headline", "seeds-data", "seeds-runs", "seeds-convention", "seeds-onsets", "seeds-contrasts", "seeds-cls",
                                  "seeds-corrected", "seeds-lengths", "synthetic", "family", "family-verdict",
                                  "history-heldout", "history-roles", "history-changepoints", "plateau", "gpu-size",
                                  "steering", "steering-issue", "steering-issue-plateau", "steering-issue-lr", "steering-real",
                                  "steering-real-attention"])  # fmt: skip
def test_each_block_of_the_page_is_what_the_files_give(page_script, generated, name):
    assert set(generated) == set(page_script.BLOCKS)
    assert _block(page_script, (DOCS / "emergence.md").read_text(), name) == generated[name]


def test_a_changed_number_fails(page_script, generated):
    """The planted defect: a page whose loss changepoint was edited by hand."""
    page = (DOCS / "emergence.md").read_text().replace("| mlm-s0 | 1750 [", "| mlm-s0 | 1500 [", 1)
    assert _block(page_script, page, "seeds-runs") != generated["seeds-runs"]


def test_the_committed_seed_summaries_are_the_scripts(page_script):
    seeds_script = sys.modules["emergence_seeds"]
    for recipe, table in seeds_script.summaries().items():
        key = seeds_script.RECIPE_KEYS[recipe]
        committed = pd.read_csv(seeds_script.SEEDS / f"{key}_seeds_onsets.csv")
        # as written: through CSV, where an empty relation reads back as NaN
        derived = pd.read_csv(io.StringIO(table.to_csv(index=False)))
        pd.testing.assert_frame_equal(committed, derived)


def test_the_family_keeps_every_word_whole_and_its_first_member_is_the_recipes_run(page_script):
    family = sys.modules["emergence_family"]
    summary = pd.read_csv(family.COMMITTED / "summary.csv")
    assert sorted(summary["member"]) == sorted(m.name for m in family.MEMBERS)
    assert (summary["split_words"] == 0).all()
    for name in ("onset.csv", "curve_onsets.csv", "track.csv"):
        recipe = (DOCS / "emergence" / "synthetic" / name).read_bytes()
        assert (family.COMMITTED / "w64-2x2-s0" / name).read_bytes() == recipe, name


def test_roles_by_step_gives_the_committed_tables_columns(page_script):
    """The single-seed runs' roles_by_step.csv has no track.csv behind it any more; the function that
    made it, run on a seed's track, gives the same columns and one row per step, task and role."""
    seeds_script = sys.modules["emergence_seeds"]
    track = pd.read_csv(seeds_script.SEEDS / "mlm-s0" / "track" / "track.csv.gz")
    table = page_script.roles_by_step(track)
    committed = pd.read_csv(DOCS / "emergence" / "real" / "roles_by_step.csv")
    assert list(table.columns) == list(committed.columns)
    assert len(table) == track.groupby(["step", "task", "role"]).ngroups
    last = table[(table["step"] == track["step"].max()) & (table["task"] == "mrpc") & (table["role"] == "next")]
    held = track[(track["step"] == track["step"].max()) & (track["task"] == "mrpc") & (track["role"] == "next")]
    assert last["heads_held"].item() == held["assigned"].sum()
    assert last["max_mean_beta"].item() == pytest.approx(held["mean"].max(), abs=5e-5)  # rounded to 4 places


def test_the_real_text_summary_is_the_committed_runs(page_script):
    """steering-real/summary.csv is what the reader derives from the committed runs (none: no summary)."""
    steering = sys.modules["emergence_steering"]
    derived = steering.summarize_real()
    path = steering.REAL.committed / "summary.csv"
    if derived.empty:
        assert not path.exists()
        return
    pd.testing.assert_frame_equal(pd.read_csv(path), pd.read_csv(io.StringIO(derived.to_csv(index=False))))


def test_the_real_text_reading_states_a_direction_only_when_every_seed_shows_it(page_script):
    """The rule fixed before the steered runs: per condition, a direction across seeds only when
    every seed's drop shift interval lies on the same side of 0. Planted on the committed summary:
    the seeds made to agree (later; no shift) and to disagree."""
    steering = sys.modules["emergence_steering"]
    summary = pd.read_csv(steering.REAL.committed / "summary.csv")
    cls = summary["condition"] == "cls"

    def reading(low: list[float], high: list[float]) -> str:
        planted = summary.copy()
        planted.loc[cls, "drop_shift_low"], planted.loc[cls, "drop_shift_high"] = low, high
        line = steering.real_table(planted).splitlines()[-1]
        return line[line.index("Suppressing [CLS]") :]

    assert reading([20, 5], [60, 90]).endswith(
        "later in 2, earlier in 0, no shift detected in 0, of 2 seeds; later in every seed.**"
    )
    assert reading([-20, -5], [-1, -2]).endswith("; earlier in every seed.**")
    assert reading([-20, -5], [10, 2]).endswith("no shift detected in 2, of 2 seeds; no shift detected in any seed.**")
    assert reading([20, -95], [60, -43]).endswith(
        "later in 1, earlier in 1, no shift detected in 0, of 2 seeds; no direction across the seeds.**"
    )
    assert reading([20, -5], [60, 2]).endswith("; no direction across the seeds.**")


def test_the_role_attention_table_reads_the_last_step_of_the_set_task_only(page_script, tmp_path):
    """Each cell is the mean over heads of β̄ and the largest, at the set's last step on its task:
    rows of another step or task, planted with other values, must not enter it."""
    steering = sys.modules["emergence_steering"]
    real = steering.RealSet(tmp_path, steps=8000, task="mrpc", seeds=(0,))
    rows = [
        dict(step=step, task=task, layer=0, head=head, role=role, mean=value + 100 * (step != 8000) + 50 * (task != "mrpc"))
        for step in (1000, 8000) for task in ("mrpc", "sst2") for role, values in
        (("prev", (1.0, 4.0)), ("next", (2.0, 2.5)), ("cls", (0.5, 9.0))) for head, value in enumerate(values)
    ]  # fmt: skip
    (tmp_path / "s0-plain").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "s0-plain" / "track.csv.gz", index=False)
    table = steering.real_role_attention(real).splitlines()
    assert table[2:] == ["| s0-plain | 2.50 (4.00) | 2.25 (2.50) | 4.75 (9.00) |"]


def _steering_run(folder: Path, curve_replicates, point, onsets_seed: int = 0) -> Path:
    """A run folder as the real-text set's reader sees it: the track's run.json (how its resamples
    were drawn) and the lead/lag replicates of its held-out loss curve's events."""
    from analysis.heads import events

    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"onsets": {"replicates": len(curve_replicates), "seed": onsets_seed},
                                                 "analysed_steps": [1000, 2000, 8000]}))  # fmt: skip
    events.save_lead_lag_replicates(folder / events.LEAD_LAG_REPLICATES, {},
                                    events.Earliest(1, np.asarray(point, float), np.asarray(curve_replicates, float)))  # fmt: skip
    return folder


def test_the_drop_shift_pairs_the_two_runs_resamples(page_script, tmp_path):
    """steered − unsteered 50% point of the held-out loss, replicate by replicate: the interval is
    the 5–95% of the paired differences (a slow reference: the sorted differences' 50th and 950th
    of 1000, inverted-CDF quantiles). The runs share most of their resampling noise (the same
    held-out sequences drawn), so pairing narrows the interval: planted, an unpaired interval (the
    unsteered run's replicates shuffled) is too wide, and one at 25–75% too narrow; both fail."""
    steering = sys.modules["emergence_steering"]
    rng = np.random.default_rng(0)
    shared = rng.normal(1700, 120, size=1000)  # the held-out resample's effect, common to both runs
    plain = np.stack([shared - 300, shared - 100, shared + rng.normal(0, 15, 1000), shared + 400], axis=1)
    steered = plain + 150 + rng.normal(0, 15, size=plain.shape)
    a = _steering_run(tmp_path / "steered", steered, [1400, 1600, 1850, 2100])
    b = _steering_run(tmp_path / "plain", plain, [1400, 1600, 1700, 2100])
    point, low, high = steering.drop_shift(a, b)
    ordered = sorted(steered[i, 2] - plain[i, 2] for i in range(1000))
    assert point == 150 and (low, high) == pytest.approx((ordered[49], ordered[949]), abs=1e-3)  # float32 storage
    assert 100 < low < 150 < high < 200
    unpaired = np.sort(steered[:, 2] - rng.permutation(plain[:, 2]))
    assert unpaired[949] - unpaired[49] > 4 * (high - low)
    narrow = np.quantile(np.array(ordered), [0.25, 0.75], method="inverted_cdf")
    assert (narrow[0], narrow[1]) != pytest.approx((low, high), abs=1e-3)
    # Runs resampled differently do not pair: refused.
    c = _steering_run(tmp_path / "other-seed", plain, [1400, 1600, 1700, 2100], onsets_seed=1)
    with pytest.raises(SystemExit, match="different onsets"):
        steering.drop_shift(a, c)
