"""docs/emergence.md holds exactly what docs/emergence_page.py derives from the committed files: a
number on the page without a file and a script behind it fails here."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pandas as pd
import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page_script():
    return _load("emergence_page")


@pytest.fixture(scope="module")
def generated(page_script, shared_data) -> dict[str, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BERTJAX_DATA", str(shared_data))
        return {name: make() for name, make in page_script.BLOCKS.items()}


def _block(page_script, page: str, name: str) -> str:
    return page[slice(*page_script.block_span(page, name))]


@pytest.mark.parametrize("name", ["headline", "seeds-data", "seeds-runs", "seeds-convention", "seeds-onsets", "seeds-contrasts", "seeds-cls",
                                  "seeds-corrected", "seeds-lengths", "synthetic", "family", "family-verdict",
                                  "history-heldout", "history-roles", "history-changepoints", "plateau", "gpu-size"])  # fmt: skip
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
