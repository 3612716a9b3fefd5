"""The console tests' Chromium, defined once for every module of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.console.browser import chromium_path


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
