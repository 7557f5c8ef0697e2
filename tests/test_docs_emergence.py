"""docs/emergence.md's seeds section holds exactly what docs/emergence_seeds.py derives from the
committed runs: a number on the page without a file and a script behind it fails here."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _script():
    spec = importlib.util.spec_from_file_location("emergence_seeds", DOCS / "emergence_seeds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(page: str, marker: str) -> str:
    found = re.search(rf"<!-- {marker} -->\n(.*?)\n<!-- /{marker} -->", page, re.DOTALL)
    assert found, f"docs/emergence.md has no {marker} block"
    return found.group(1)


@pytest.fixture(scope="module")
def script():
    return _script()


def test_the_runs_table_is_the_scripts(script):
    assert _section((DOCS / "emergence.md").read_text(), "seeds-runs") == script.runs_table()


def test_the_onsets_table_is_the_scripts(script):
    assert _section((DOCS / "emergence.md").read_text(), "seeds-onsets") == script.onsets_table(script.summaries())


def test_the_committed_summaries_are_the_scripts(script, tmp_path):
    import io

    import pandas as pd

    for recipe, table in script.summaries().items():
        key = "mlm" if recipe == "MLM only" else "nsp"
        committed = pd.read_csv(script.SEEDS / f"{key}_seeds_onsets.csv")
        # as written: through CSV, where an empty relation reads back as NaN
        derived = pd.read_csv(io.StringIO(table.to_csv(index=False)))
        pd.testing.assert_frame_equal(committed, derived)


def test_a_changed_number_fails(script):
    """The planted defect: a page whose loss changepoint was edited by hand."""
    page = (DOCS / "emergence.md").read_text().replace("| mlm-s0 | 1750 [", "| mlm-s0 | 1500 [", 1)
    assert _section(page, "seeds-runs") != script.runs_table()


def test_the_lengths_table_is_the_scripts(shared_data):
    spec = importlib.util.spec_from_file_location("emergence_lengths", DOCS / "emergence_lengths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _section((DOCS / "emergence.md").read_text(), "seeds-lengths") == module.lengths(shared_data / "glue")
