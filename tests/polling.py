"""Waiting without sleeps as synchronisation: poll a condition, fail after a bounded deadline.

The deadline is only how long a broken test may hang; a passing test never reaches it, so no
assert here depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")
INTERVAL_S = 0.01


async def until(predicate: Callable[[], bool], deadline_s: float = 15.0, what: str = "") -> None:
    """Poll ``predicate`` until it holds; fail after ``deadline_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not predicate():
        if loop.time() > end:
            pytest.fail(f"not within {deadline_s}s: {what or predicate}")
        await asyncio.sleep(INTERVAL_S)


async def polled(
    probe: Callable[[], Awaitable[T | None]], deadline_s: float = 30.0, what: str = ""
) -> T:
    """Await ``probe`` until it answers something other than None, and return that; fail
    after ``deadline_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while (answer := await probe()) is None:
        if loop.time() > end:
            pytest.fail(f"not within {deadline_s}s: {what or probe}")
        await asyncio.sleep(INTERVAL_S)
    return answer
