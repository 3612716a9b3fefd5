"""Bounded polling for tests: wait for a condition, never assert on how long it took."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest


async def poll(check: Callable[[], Awaitable[Any]], what: str, limit: float = 5.0, interval: float = 0.02) -> Any:
    """Await ``check`` until it returns a truthy value (returned); fail naming ``what`` after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {limit}s")
        await asyncio.sleep(interval)


def poll_sync(check: Callable[[], Any], what: str, limit: float = 5.0, interval: float = 0.1) -> Any:
    """Call ``check`` until it returns a truthy value (returned); fail naming ``what`` after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {limit}s")
        time.sleep(interval)
