"""The console tests' Chromium, defined once (``tests/console/browser.py``) for every module of this folder."""

from tests.console.browser import browser

__all__ = ["browser"]
