"""examples/quickstart.ipynb: stored without outputs, executed cell by cell in a real Jupyter kernel
(its cells assert on what they return), and its HTML export driven in headless Chromium: the
inline reports are there and a click on a head opens its card; nothing on stderr, no <NA> table."""

from __future__ import annotations

import html
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_the_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.fixture(scope="module")
def executed(shared_data, minilm_path, tmp_path_factory) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel imports this checkout (not an installed copy) and reads the staged data; 32 pairs
    # keep the run to seconds (and are not a small N, which warns).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BERTJAX_DATA": str(shared_data), "QUICKSTART_N": "32"}
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})  # fmt: skip
    client.execute(env=env)
    return notebook


def _html_outputs(cells) -> list[str]:
    return [
        output["data"]["text/html"]
        for cell in cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "text/html" in output.get("data", {})
    ]


@pytest.mark.slow  # the notebook in a real kernel: ~24 s of CPU
def test_every_cell_runs_and_the_views_are_inline(executed):
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    frames = [h for h in _html_outputs(executed.cells) if h.startswith('<iframe class="bertjax-report"')]
    assert len(frames) == 3  # the roles result, the head view, the series
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)  # the role grid figure


def test_the_outputs_are_clean(executed):
    """Nothing on stderr (no TqdmWarning, no text progress bars, no warnings), and no table of
    <NA> printed; the series' two checkpoints differ and its report shows the last one's attention."""
    code = [c for c in executed.cells if c.cell_type == "code"]
    streams = [o for c in code for o in c.outputs if o.output_type == "stream"]
    assert [o.text for o in streams if o.name == "stderr"] == []
    assert not [o.text for o in streams if "<NA>" in o.text]
    page = next(h for h in _html_outputs(code[-1:]) if h.startswith('<iframe class="bertjax-report"'))
    assert "The example attention maps are missing" not in html.unescape(page)


@pytest.fixture(scope="module")
def exported(executed, tmp_path_factory) -> Path:
    body, _ = HTMLExporter().from_notebook_node(executed)
    path = tmp_path_factory.mktemp("notebook") / "quickstart.html"
    path.write_text(body, encoding="utf-8")
    return path


@pytest.mark.slow  # the executed notebook (the fixture above), when run alone
def test_the_html_export_opens_a_head_card_on_click(browser, exported):
    from selenium.webdriver.common.by import By

    browser.get(exported.as_uri())
    frames = browser.find_elements(By.CSS_SELECTOR, "iframe.bertjax-report")
    assert len(frames) == 3
    browser.switch_to.frame(frames[0])
    try:
        cells = browser.find_elements(By.CSS_SELECTOR, "#grid .cell")
        assert len(cells) == 6 * 12
        card = browser.find_element(By.ID, "card")
        assert card.get_attribute("hidden") is None  # the first view opens a head
        cell = browser.find_element(By.CSS_SELECTOR, '#grid .cell[data-layer="2"][data-head="5"]')
        browser.execute_script("arguments[0].scrollIntoView()", cell)
        cell.click()
        assert card.get_attribute("hidden") is None
        assert browser.find_element(By.ID, "card-title").text.startswith("Layer 2, head 5")
        assert browser.find_elements(By.CSS_SELECTOR, "#card-stats tr[data-role]")
        assert browser.find_elements(By.CSS_SELECTOR, "#card-examples svg")
    finally:
        browser.switch_to.default_content()
    # The head view opens on its head and role, the sieve marked.
    browser.switch_to.frame(frames[1])
    try:
        card = browser.find_element(By.ID, "card")
        assert card.get_attribute("hidden") is None
        assert browser.find_element(By.ID, "card-role").get_attribute("value") == "local"
        assert browser.find_elements(By.CSS_SELECTOR, '#card-examples rect[fill="#E69F00"]')
    finally:
        browser.switch_to.default_content()
