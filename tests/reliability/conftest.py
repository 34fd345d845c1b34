"""Fixtures for the reliability suite: a daemon in-process with a fake CLI, process scans.

Everything here waits with bounded polling loops (``until``), never with blind sleeps.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from codelegate.policy.config import Config
from tests.daemon.conftest import Daemon, make_config, running_daemon
from tests.polling import polled
from tests.reliability.served import Served


def cards_closed(frames: list[dict[str, Any]]) -> None:
    """Card invariants over one run's frames: every tool_call has exactly one tool_result,
    the run_result is last, seqs are gapless from 1 and ids are unique."""
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1)), "seq gap"
    assert len({f["id"] for f in frames}) == len(frames), "duplicate frame id"
    assert frames[-1]["type"] == "run_result"
    opened = [f["tool_id"] for f in frames if f["type"] == "tool_call"]
    closed = [f["tool_id"] for f in frames if f["type"] == "tool_result"]
    assert sorted(set(opened)) == sorted(closed), "a card is left open or closed twice"
    assert len(closed) == len(set(closed))


def stored_rows(db_path: str | Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """What a query answers of the SQLite file, opened read-only (the tests' view of the disk,
    not the store's code)."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def stored_frames(db_path: str | Path, run_id: str) -> list[dict[str, Any]]:
    """The run's frames straight from the SQLite file (read-only)."""
    rows = stored_rows(db_path, "SELECT data FROM frames WHERE run_id = ? ORDER BY seq", run_id)
    return [msgspec.json.decode(bytes(r[0])) for r in rows]


def stored_count(db_path: str | Path, run_id: str) -> int:
    """How many frames of the run the SQLite file holds (read-only)."""
    rows = stored_rows(db_path, "SELECT COUNT(*) FROM frames WHERE run_id = ?", run_id)
    return int(rows[0][0])


def stored_status(db_path: str | Path, run_id: str) -> str:
    """The run's status as the SQLite file holds it (read-only)."""
    return str(stored_rows(db_path, "SELECT status FROM runs WHERE run_id = ?", run_id)[0][0])


@pytest.fixture
def rel_config(short_dir: Path, workspace: Path) -> Config:
    """Fake CLI, a 1 s cancel grace, room for 8 concurrent runs."""
    return make_config(short_dir, workspace, policy={"max_concurrent_runs": 16})


@pytest.fixture
async def rdaemon(rel_config: Config, tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(rel_config, tmp_path) as d:
        yield d


async def run_frames(d: Daemon, run_id: str) -> list[dict[str, Any]]:
    """Every frame of a finished (or finishing) run, via NDJSON."""
    return await d.events(run_id)


async def post(d: Daemon, task: str, **fields: Any) -> str:
    resp = await d.post_run(task, **fields)
    body = await resp.json()
    assert resp.status == 202, body
    return str(body["run_id"])


async def wait_done(d: Daemon | Served, run_id: str, deadline_s: float = 30.0) -> dict[str, Any]:
    """The run's state once it is no longer running (bounded)."""

    async def done() -> dict[str, Any] | None:
        status, state = await d.json("GET", f"/v1/runs/{run_id}")
        assert status == 200
        ended = state["status"] != "running" and state["result"] is not None
        return dict(state) if ended else None

    return await polled(done, deadline_s, f"run {run_id} to end")


def python() -> str:
    return sys.executable


WS = aiohttp.ClientWebSocketResponse
