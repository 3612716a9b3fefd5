"""Real Chromium (Debian's ``chromium``) driven by Playwright for Python, and where screenshots go.

Playwright's own browser download is never used: ``executable_path`` points at the system Chromium. Tests that
need it skip when it is missing, with the reason. Screenshots go to ``$TETHER_SCREENSHOTS`` or
``build/console-screenshots``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("TETHER_SCREENSHOTS", ROOT / "build" / "console-screenshots"))


def chromium_path() -> str | None:
    """The system Chromium, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def new_page(browser: Browser, width: int = 1280, height: int = 900) -> Page:
    """A page in a fresh context (its own cookies)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(30_000)
    return context.new_page()


def shot(page: Page, name: str, full_page: bool = True) -> None:
    """Save a screenshot ``<name>.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)


def sign_in(page: Page, base_url: str, login: str, token: str) -> None:
    """Fill in the console's sign-in form; ends on the projects page."""
    page.goto(base_url + "/")
    page.get_by_label("Username").fill(login)
    page.get_by_label("Personal access token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/projects")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium per test module, closed after it: while Playwright's sync API runs, no asyncio
    loop may run in the thread, and the session's async tests need theirs."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed (scripts/bootstrap.sh installs it)")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield instance
        finally:
            instance.close()
