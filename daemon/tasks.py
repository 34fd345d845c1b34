"""Background tasks with strong references.

The event loop keeps only weak references to tasks, so a bare ``create_task`` whose result is
dropped can be garbage-collected mid-flight. Every background task of the daemon goes through
:func:`spawn`, which keeps it alive until it ends and logs an exception nobody awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

T = TypeVar("T")

_log = structlog.get_logger("codelegate.tasks")
_live: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start ``coro`` as a named task and keep a strong reference to it until it ends."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _live.add(task)
    task.add_done_callback(_done)
    return task


def _done(task: asyncio.Task[Any]) -> None:
    _live.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        _log.error("background_task_failed", task=task.get_name(), error=repr(exc), exc_info=exc)
