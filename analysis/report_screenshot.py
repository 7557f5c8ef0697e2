"""`python -m analysis.report_screenshot REPORT OUT.png`: a picture of a report in headless Chromium.

Opens `report.html` (no network), optionally shows another task than the first, opens a head's card on a role and picks a token
(by default the first that role scores), so its sieve shows, and saves the window. Needs Debian's `chromium` and
`chromium-driver` and the `selenium` test dependency (`scripts/setup-browser`).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from bertjax import cli
from bertjax.errors import UserError


def chromium(width: int = 1400, height: int = 1000):
    """A headless Chromium session (Selenium), or None when Chromium, its driver or selenium is missing."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not browser or not driver:
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    # --no-sandbox: CI containers run as root, where Chromium's sandbox cannot start.
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def screenshot(
    page: Path,
    out: Path,
    head: tuple[int, int] | None,
    role: str | None,
    token: int | None,
    width: int,
    height: int,
    task: str | None = None,
) -> None:
    from selenium.common.exceptions import NoSuchElementException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    session = chromium(width, height)
    if session is None:
        raise UserError(
            "headless Chromium is not available: run scripts/setup-browser (chromium, chromium-driver, selenium)"
        )
    try:
        session.get(page.resolve().as_uri())
        if task is not None:
            try:
                Select(session.find_element(By.ID, "task")).select_by_value(task)
            except NoSuchElementException:
                raise UserError(f"--task {task}: not a task of {page}") from None
        if head is not None:
            try:
                session.find_element(
                    By.CSS_SELECTOR, f'#grid .cell[data-layer="{head[0]}"][data-head="{head[1]}"]'
                ).click()
            except NoSuchElementException:
                raise UserError(f"--head {head[0]},{head[1]}: no such head in {page}") from None
            if role is not None:
                try:
                    Select(session.find_element(By.ID, "card-role")).select_by_value(role)
                except NoSuchElementException:
                    raise UserError(f"--role {role}: not a role of {page}") from None
            selector = "#card-examples .tok.scored" if token is None else f'#card-examples .tok[data-token="{token}"]'
            picked = session.find_elements(By.CSS_SELECTOR, selector)
            if token is not None and not picked:
                raise UserError(f"--token {token}: the first example sequence has no such token")
            if picked:
                picked[0].click()
        session.save_screenshot(str(out))
    finally:
        session.quit()


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.report_screenshot", __doc__)
    p.add_argument("report", help="a report.html written by analysis.report")
    p.add_argument("out", help="the PNG to write")
    p.add_argument("--task", help="the task shown (default: the report's first)")
    p.add_argument("--head", help="LAYER,HEAD whose card to open")
    p.add_argument("--role", help="the role shown in the card (with --head)")
    p.add_argument("--token", type=int, help="position of the token to pick (default: the first the role scores)")
    p.add_argument("--width", type=int, default=1400, help="browser window width, pixels")
    p.add_argument("--height", type=int, default=1000, help="browser window height, pixels")
    return p


def main(argv: list[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    page = Path(a.report)
    if not page.is_file():
        raise UserError(f"{page}: no such file")
    head = None
    if a.head:
        try:
            layer, number = (int(x) for x in a.head.split(","))
        except ValueError:
            raise UserError(f"--head {a.head}: expected LAYER,HEAD (two integers)") from None
        head = (layer, number)
    screenshot(page, Path(a.out), head, a.role, a.token, a.width, a.height, a.task)


if __name__ == "__main__":
    cli.run(main)
