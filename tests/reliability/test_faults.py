"""Faults of the CLI, the store and the clients: each run ends with the right status, its cards
closed, no process of it left, the runs beside it unaffected, and nothing recorded lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from codelegate.policy.config import Config
from tests.daemon.conftest import make_config, running_daemon
from tests.polling import until
from tests.procfs import marked_processes
from tests.reliability.conftest import cards_closed, post, stored_frames, wait_done

WITNESS = "fake: tools n=300 rate=1000"  # ~0.3 s of steady tool cards beside the faulty run


class Follower:
    """A WebSocket client following every run, collecting frames per run."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.frames: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            frame = msgspec.json.decode(msg.data)
            if "seq" in frame:
                self.frames[frame["run_id"]].append(frame)

    def finished(self, run_id: str) -> bool:
        got = self.frames.get(run_id, [])
        return bool(got) and got[-1]["type"] == "run_result"

    def has(self, run_id: str, kind: str) -> bool:
        return any(f["type"] == kind for f in self.frames.get(run_id, ()))

    async def close(self) -> None:
        await self.ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 5)


# (scenario task line, expected final status, cancel it once it opened a card?)
SCENARIOS = [
    pytest.param("fake: crash how=abort", "failed", False, id="crash-sigabrt"),
    pytest.param("fake: crash how=segv", "failed", False, id="crash-sigsegv"),
    pytest.param("fake: crash how=exit139", "failed", False, id="crash-exit139"),
    pytest.param("fake: hang", "timeout", False, id="hang-silent"),
    pytest.param("fake: hang after=init", "timeout", False, id="hang-after-init"),
    pytest.param("fake: garbage", "completed", False, id="garbage"),
    pytest.param("fake: big_line", "completed", False, id="line-50mb"),
    pytest.param("fake: exit_before_init", "failed", False, id="exit-before-init"),
    pytest.param("fake: ignore_term", "cancelled", True, id="ignores-sigterm"),
    pytest.param("fake: grandchild then=exit", "completed", False, id="setsid-grandchild"),
    pytest.param(
        "fake: grandchild then=exit hold_stdio=1", "completed", False, id="grandchild-holds-stdout"
    ),
    pytest.param("fake: grandchild then=hang", "cancelled", True, id="grandchild-cancelled"),
]


@pytest.fixture
def fault_config(short_dir: Path, workspace: Path) -> Config:
    return make_config(
        short_dir,
        workspace,
        policy={"max_concurrent_runs": 8, "run_timeout_s": 2.5, "cancel_grace_s": 0.5},
    )


@pytest.mark.parametrize(("task", "expected", "cancel"), SCENARIOS)
async def test_cli_fault_ends_cleanly_and_spares_the_other_run(
    fault_config: Config, tmp_path: Path, task: str, expected: str, cancel: bool
) -> None:
    async with running_daemon(fault_config, tmp_path) as d:
        follower = Follower(await d.ws("?run=*"))
        witness = await post(d, WITNESS)
        faulty = await post(d, task)
        if cancel:
            await until(lambda: follower.has(faulty, "tool_call"), what="a card opened")
            status, _ = await d.json("POST", f"/v1/runs/{faulty}/cancel")
            assert status == 202
        state = await wait_done(d, faulty)
        # The run is over: whatever it started is gone by now, not eventually.
        assert marked_processes(faulty) == []
        witness_state = await wait_done(d, witness)
        assert marked_processes(witness) == []
        await until(lambda: follower.finished(faulty) and follower.finished(witness))
        live = dict(follower.frames)
        await follower.close()
        replay = {rid: await d.events(rid) for rid in (faulty, witness)}

    assert state["status"] == expected, state
    assert state["result"]["status"] == expected
    assert witness_state["status"] == "completed"
    assert witness_state["result"]["tools"]["started"] == 150
    for rid in (faulty, witness):
        cards_closed(live[rid])
        assert replay[rid] == live[rid]
        assert stored_frames(fault_config.store.path, rid) == live[rid]
    failed_cards = [
        f for f in live[faulty] if f["type"] == "tool_result" and f["status"] == "failed"
    ]
    if expected in ("cancelled", "timeout"):
        assert {f["error_type"] for f in failed_cards} <= {expected}
    diagnostics = {f["code"] for f in live[faulty] if f["type"] == "diagnostic"}
    if "garbage" in task:
        assert "malformed_line" in diagnostics
    if "big_line" in task:
        assert "oversized_line" in diagnostics
        assert max(len(msgspec.json.encode(f)) for f in live[faulty]) < 70_000
    if "exit_before_init" in task:
        assert state["exit_code"] == 1
        assert state["result"]["error"]
        # Why it failed, from the CLI's own stderr.
        assert "could not start" in state["result"]["stderr"]
    if "crash" in task:
        assert state["result"]["tools"]["failed"] == 1  # the open card closed as failed
