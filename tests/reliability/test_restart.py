"""The daemon SIGKILLed mid-run and restarted: the run is closed as interrupted, its cards
closed, its processes (escaped grandchild included) gone, and replay keeps ids and seqs."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.polling import until
from tests.procfs import marked_processes
from tests.reliability.conftest import cards_closed, stored_frames
from tests.reliability.served import Served, write_config


@pytest.fixture
async def served(tmp_path: Path, short_dir: Path) -> AsyncIterator[Served]:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    s = Served(write_config(short_dir, workspace), short_dir, home)
    try:
        yield s
    finally:
        await s.stop()


def stored(db: Path, run_id: str) -> list[dict[str, Any]]:
    """The run's frames as the file holds them now (what survives a SIGKILL)."""
    with contextlib.suppress(sqlite3.Error):
        return stored_frames(db, run_id)
    return []


def kill_leftovers(*run_ids: str) -> None:
    for run_id in run_ids:
        for pid in marked_processes(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
async def test_sigkilled_daemon_restarts_with_runs_interrupted(
    served: Served, short_dir: Path
) -> None:
    db = short_dir / "store.db"
    await served.start()
    run_ids: dict[str, str] = {}
    # One run with an open card, one whose tool left an escaped (setsid) grandchild.
    for name, task in (
        ("open_card", "fake: ignore_term"),
        ("escaped", "fake: grandchild then=hang"),
    ):
        status, body = await served.json("POST", "/v1/runs", json={"task": task, "cwd": "."})
        assert status == 202, body
        run_ids[name] = body["run_id"]
    open_id, escaped_id = run_ids["open_card"], run_ids["escaped"]
    try:
        await until(
            lambda: (
                any(f["type"] == "tool_call" for f in stored(db, open_id))
                and any(f["type"] == "tool_result" for f in stored(db, escaped_id))
            ),
            what="both runs' cards on disk",
        )
        await until(
            lambda: len(marked_processes(escaped_id)) >= 2, what="the CLI and its grandchild"
        )
        before = {rid: stored(db, rid) for rid in run_ids.values()}
        await served.kill()
        assert marked_processes(escaped_id), "a SIGKILLed daemon leaves the run's processes behind"

        await served.start()
        states = {rid: await served.json("GET", f"/v1/runs/{rid}") for rid in run_ids.values()}
        after = {rid: await served.events(rid) for rid in run_ids.values()}
        # Start-up closes the interrupted runs and must kill what is left of them.
        await until(
            lambda: marked_processes(open_id) == [] and marked_processes(escaped_id) == [],
            10,
            "the interrupted runs' processes gone after the restart",
        )
    finally:
        kill_leftovers(*run_ids.values())
    for rid in run_ids.values():
        status, state = states[rid]
        assert status == 200
        assert state["status"] == "interrupted"
        assert state["result"]["status"] == "interrupted"
        cards_closed(after[rid])
        assert after[rid][: len(before[rid])] == before[rid]  # same ids, seqs and content
    closing = [f for f in after[open_id][len(before[open_id]) :] if f["type"] == "tool_result"]
    assert closing
    assert {f["error_type"] for f in closing} == {"interrupted"}
