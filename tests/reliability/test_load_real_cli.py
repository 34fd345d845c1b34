"""Load with the real pinned CLI: 8 concurrent Claude Code runs against the loopback API stub,
fanned out to 200 WebSocket subscribers. Every subscriber gets every frame of its run, gapless,
and every run completes with no process left.

(The slow-subscriber half of the load story needs runs that produce megabytes of frames, which
the real CLI cannot do in seconds; ``test_load.py`` plays it with a fast fake CLI.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import structlog

from tests.e2e.conftest import E2E, e2e_config, workspace_tree
from tests.polling import polled
from tests.procfs import marked_processes
from tests.reliability.conftest import cards_closed
from tests.reliability.test_faults import Follower
from tests.stub.anthropic import Stub, Turn, serve_stub, text, tool

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUNS = 8
SUBSCRIBERS = 200
BASE = "http://codelegate"


@pytest.fixture
async def real(claude_bin: str, tmp_path: Path, short_dir: Path) -> AsyncIterator[E2E]:
    root, workspace, home = workspace_tree(tmp_path)
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    stub = Stub()
    async with serve_stub(stub):
        env = E2E(stub, workspace, home)
        await env.start(e2e_config(claude_bin, root, short_dir, max_concurrent_runs=RUNS))
        assert env.http is not None
        assert env.handle is not None
        await env.http.close()
        env.http = aiohttp.ClientSession(  # no cap of 100 connections
            connector=aiohttp.UnixConnector(path=str(env.handle.socket_path), limit=0),
            timeout=aiohttp.ClientTimeout(total=120),
        )
        try:
            yield env
        finally:
            await env.stop()


async def test_eight_real_cli_runs_to_two_hundred_subscribers(real: E2E) -> None:
    with structlog.testing.capture_logs() as events:
        await _eight_runs(real)
    # Overlapping runs are the normal case: nothing about them is an error for an operator.
    assert len([e for e in events if e["event"] == "run_finished"]) == RUNS
    errors = [e for e in events if e.get("log_level") in ("error", "critical")]
    assert errors == [], errors[:3]


async def _eight_runs(real: E2E) -> None:
    release = asyncio.Event()
    for i in range(RUNS):
        real.stub.subagent(
            f"LOAD-RUN-{i}",
            [
                Turn(tool("Read", file_path=real.path("notes.txt")).blocks, hold=release),
                tool("Bash", command=f"echo run {i}", description="Say which run"),
                tool("Write", file_path=real.path(f"out-{i}.txt"), content=f"run {i}\n"),
                text(f"Run {i} done."),
            ],
        )
    run_ids = []
    for i in range(RUNS):
        status, body = await real.post_run(f"LOAD-RUN-{i}: read the notes and say which run.")
        assert status == 202, body
        run_ids.append(body["run_id"])
    followers = [
        Follower(await real.client.ws_connect(f"{BASE}/v1/ws?run={run_ids[i % RUNS]}"))
        for i in range(SUBSCRIBERS)
    ]
    await real.stub.wait_for_requests(1, "LOAD-RUN-7")
    release.set()  # all eight answer at once, every subscriber attached
    states = [await finished(real, rid) for rid in run_ids]
    for f in followers:
        await f.close()
    assert [s["status"] for s in states] == ["completed"] * RUNS, states
    for rid, state in zip(run_ids, states, strict=True):
        assert state["result"]["tools"] == {"started": 3, "completed": 3, "failed": 0}, [
            (f["name"], f["status"], f.get("error"), f.get("result", "")[:300])
            for f in await real_events(real, rid)
            if f["type"] == "tool_result"
        ]
        assert state["result"]["files_changed"] == [f"out-{run_ids.index(rid)}.txt"]
        assert marked_processes(rid) == []
    reference = {rid: await real_events(real, rid) for rid in run_ids}
    for i, f in enumerate(followers):
        rid = run_ids[i % RUNS]
        assert f.frames[rid] == reference[rid]
        cards_closed(f.frames[rid])


async def finished(real: E2E, run_id: str, deadline_s: float = 90.0) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        status, state = await real.get(f"/v1/runs/{run_id}")
        assert status == 200
        ended = state["status"] != "running" and state["result"] is not None
        return dict(state) if ended else None

    return await polled(done, deadline_s, f"run {run_id} to end")


async def real_events(real: E2E, run_id: str) -> list[dict[str, Any]]:
    async with real.client.get(f"{BASE}/v1/runs/{run_id}/events") as resp:
        body = await resp.read()
    return [msgspec.json.decode(line) for line in body.splitlines()]
