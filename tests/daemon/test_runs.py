"""Run lifecycles through the daemon: cancel, late frames, disconnects, WebSocket, restarts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import msgspec

from codelegate.daemon.driving import Driver
from codelegate.daemon.hub import Hub
from codelegate.daemon.metrics import Metrics
from codelegate.daemon.record import run_context, translator_limits
from codelegate.daemon.runlog import RunLog
from codelegate.daemon.runs import RunManager
from codelegate.daemon.store.queries import RunRecord
from codelegate.daemon.store.store import RunStore
from codelegate.policy.config import Config
from codelegate.translator import Redactor, RunContext, Translator
from codelegate.translator.frames import ApprovalResolved, Diagnostic, decode_frame, encode_frame
from tests.daemon.conftest import (
    BASE,
    Daemon,
    frames_until_result,
    make_config,
    next_frame,
    running_daemon,
    start_daemon,
    stop_daemon,
)

CLOSE_FRAMES = {"tool_result", "provider_invocation", "provider_activity", "run_result"}


async def test_cancel_ends_cancelled_and_no_late_frame(daemon: Daemon) -> None:
    async with daemon.ws("?run=*") as ws:
        resp = await daemon.post_run("fake: tools n=200000 rate=3000")
        run_id = (await resp.json())["run_id"]
        seen = 0
        while seen < 20:  # the run is producing cards
            frame = await next_frame(ws)
            seen += frame["type"] == "tool_call"
        status, body = await daemon.json("POST", f"/v1/runs/{run_id}/cancel")
        assert status == 202
        cut = body["last_seq"]
        frames = await frames_until_result(ws)
    late = [f for f in frames if f["seq"] > cut]
    assert late[-1]["type"] == "run_result"
    assert late[-1]["result"]["status"] == "cancelled"
    assert {f["type"] for f in late} <= CLOSE_FRAMES
    for f in late:
        if f["type"] == "tool_result":
            assert f["status"] == "failed"
            assert f["error_type"] == "cancelled"
    _, state = await daemon.json("GET", f"/v1/runs/{run_id}")
    assert state["status"] == "cancelled"


async def test_cancel_kills_a_child_that_ignores_sigterm(daemon: Daemon) -> None:
    async with daemon.ws("?run=*") as ws:
        resp = await daemon.post_run("fake: ignore_term")
        run_id = (await resp.json())["run_id"]
        while (await next_frame(ws))["type"] != "tool_call":
            pass
        status, _ = await daemon.json("POST", f"/v1/runs/{run_id}/cancel")
        assert status == 202
        frames = await frames_until_result(ws)
    assert frames[-1]["result"]["status"] == "cancelled"
    closing = [f for f in frames if f["type"] == "tool_result"]
    assert [f["error_type"] for f in closing] == ["cancelled"]


async def test_waiting_caller_that_disconnects_cancels_its_run(daemon: Daemon) -> None:
    async with daemon.ws("?run=*") as ws:

        async def wait_for_the_answer() -> None:
            async with daemon.http.post(
                f"{BASE}/v1/runs", json={"task": "fake: ignore_term", "wait": True}
            ) as resp:
                await resp.read()

        post = asyncio.create_task(wait_for_the_answer())
        first = await next_frame(ws)
        while first["type"] != "tool_call":
            first = await next_frame(ws)
        run_id = first["run_id"]
        post.cancel()  # the caller hangs up
        frames = await frames_until_result(ws)
    assert frames[-1]["result"]["status"] == "cancelled"
    _, state = await daemon.json("GET", f"/v1/runs/{run_id}")
    assert state["status"] == "cancelled"


async def test_timeout_ends_the_run_as_timeout(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    from tests.daemon.conftest import make_config

    config = make_config(short_dir, workspace, policy={"run_timeout_s": 1.0})
    async with running_daemon(config, tmp_path) as d:
        resp = await d.post_run("fake: hang after=init", wait=True)
        result = await resp.json()
        assert result["status"] == "timeout"


async def test_ws_replay_then_live_without_gap_for_many_subscribers(daemon: Daemon) -> None:
    results: list[list[dict[str, Any]]] = []

    async def late_joiner(run_id: str, after: int) -> None:
        async with daemon.ws(f"?run={run_id}&after={after}") as ws:
            frames = await frames_until_result(ws)
            assert [f["seq"] for f in frames] == list(range(after + 1, frames[-1]["seq"] + 1))
            results.append(frames)

    joiners = []
    async with daemon.ws("?run=*") as leader:
        resp = await daemon.post_run("fake: tools n=600 rate=2000")
        run_id = (await resp.json())["run_id"]
        # Join while the run is producing: at chosen points of the leader's stream, with
        # `after` before, at and beyond what the run has produced so far.
        plan = {1: [0], 40: [0, 10, 40], 200: [150, 199, 250], 400: [0, 500]}
        while plan:
            seq = (await next_frame(leader))["seq"]
            for after in plan.pop(seq, []):
                joiners.append(asyncio.create_task(late_joiner(run_id, after)))
        await asyncio.gather(*joiners)
    full = await daemon.events(run_id)
    assert len(results) == 9
    for frames in results:
        assert frames == full[frames[0]["seq"] - 1 :]


async def test_ws_subscribe_messages(daemon: Daemon) -> None:
    first = await (await daemon.post_run("hello", wait=True)).json()
    full = await daemon.events(first["run_id"])
    async with daemon.ws() as ws:
        await ws.send_str("{not json")
        error = await next_frame(ws)
        assert error["type"] == "error"
        assert error["error"]["code"] == "bad_message"
        await ws.send_json({"type": "subscribe", "run": "nope"})
        assert (await next_frame(ws))["error"]["code"] == "run_not_found"
        await ws.send_json({"type": "subscribe", "run": first["run_id"], "after": 1})
        frames = await frames_until_result(ws)
        assert frames == full[1:]
        ack = await next_frame(ws)
        assert ack == {"type": "subscribed", "run": first["run_id"]}
        await ws.send_json({"type": "subscribe", "run": "*"})
        assert (await next_frame(ws))["type"] == "subscribed"
        await daemon.post_run("again")
        frames = await frames_until_result(ws)
        assert frames[0]["seq"] == 1
        assert frames[0]["run_id"] != first["run_id"]


async def test_restart_replays_the_same_frames(config: Config, tmp_path: Path) -> None:
    async with running_daemon(config, tmp_path) as d:
        result = await (await d.post_run("hello", wait=True)).json()
        before = await d.events(result["run_id"])
        _, state_before = await d.json("GET", f"/v1/runs/{result['run_id']}")
    async with running_daemon(config, tmp_path) as d:
        after = await d.events(result["run_id"])
        _, state_after = await d.json("GET", f"/v1/runs/{result['run_id']}")
        async with d.ws(f"?run={result['run_id']}&after=1") as ws:
            over_ws = await frames_until_result(ws)
    assert after == before
    assert over_ws == before[1:]
    assert state_after["result"] == state_before["result"]
    assert state_after["status"] == "completed"


async def test_a_follow_up_under_the_same_parent_continues_the_work_room_across_a_restart(
    config: Config, tmp_path: Path
) -> None:
    # O Chat ignores a stateRevision at or below the one it shows, and sorts Work Room rows by
    # sequence: every run under one parent tool call continues both, whatever restarts between.
    parent = {"tool_call_id": "call_follow_up"}

    async def frames_of(d: Daemon, **fields: object) -> list[dict[str, object]]:
        result = await (await d.post_run("hello", wait=True, parent=parent, **fields)).json()
        assert result["status"] == "completed"
        return await d.events(result["run_id"])

    async with running_daemon(config, tmp_path) as d:
        runs = [await frames_of(d), await frames_of(d)]
    async with running_daemon(config, tmp_path) as d:
        runs.append(await frames_of(d))
        other = await (await d.post_run("hello", wait=True, parent={"tool_call_id": "c2"})).json()
        fresh = await d.events(other["run_id"])
    revisions = [f["stateRevision"] for run in runs for f in run if "stateRevision" in f]
    assert revisions == list(range(1, len(revisions) + 1))
    rows = [f["sequence"] for run in runs for f in run if f["type"] == "provider_activity"]
    assert rows == sorted(rows)
    assert len(set(rows)) == 3  # one card per run, each its own place
    assert next(f["stateRevision"] for f in fresh if "stateRevision" in f) == 1


async def test_runs_left_running_are_closed_as_interrupted(config: Config, tmp_path: Path) -> None:
    run_id = "0a7d1f8e-2222-4b4b-8c8c-000000000001"
    session = "0a7d1f8e-3333-4b4b-8c8c-000000000002"
    ctx = RunContext(
        run_id=run_id, cwd=config.policy.workspaces[0], session_id=session, started_at=1.0
    )
    translator = Translator(ctx)
    frames = translator.start(1.0)
    frames += translator.receive_data(_open_card_transcript(session), 2.0)
    assert frames, "the transcript opens a card"
    store = await RunStore.open(config.store.path)
    await store.create_run(
        RunRecord(
            run_id=run_id,
            status="running",
            created_at=1.0,
            finished_at=None,
            cwd=config.policy.workspaces[0],
            mode="safe",
            session_id=session,
            resumed=False,
            parent_tool_call_id=None,
            last_seq=0,
            result=None,
            exit_code=None,
        )
    )
    for frame in frames:
        store.append_frame(run_id, frame.seq, encode_frame(frame))
    await store.flush()
    await store.close()

    async with running_daemon(config, tmp_path) as d:
        _, state = await d.json("GET", f"/v1/runs/{run_id}")
        replay = await d.events(run_id)
    assert state["status"] == "interrupted"
    assert [f["seq"] for f in replay] == list(range(1, len(replay) + 1))
    assert [msgspec.json.encode(f) for f in replay[: len(frames)]] == [
        msgspec.json.encode(msgspec.json.decode(encode_frame(f))) for f in frames
    ]
    closing = [f for f in replay[len(frames) :] if f["type"] == "tool_result"]
    assert closing
    assert {f["error_type"] for f in closing} == {"interrupted"}
    assert replay[-1]["type"] == "run_result"
    assert replay[-1]["result"]["status"] == "interrupted"


def _open_card_transcript(session: str) -> bytes:
    lines = [
        {
            "type": "system",
            "subtype": "init",
            "session_id": session,
            "cwd": "/w",
            "tools": [],
            "permissionMode": "default",
            "parent_tool_use_id": None,
        },
        {
            "type": "assistant",
            "session_id": session,
            "parent_tool_use_id": None,
            "message": {
                "id": "msg_1",
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"command": "sleep 5"},
                    }
                ],
            },
        },
    ]
    return b"".join(msgspec.json.encode(line) + b"\n" for line in lines)


async def test_shutdown_closes_websockets_going_away(config: Config, tmp_path: Path) -> None:
    d = await start_daemon(config, tmp_path)
    try:
        async with d.ws("?run=*") as ws:
            closing = asyncio.create_task(d.handle.close())
            msg = await asyncio.wait_for(ws.receive(), 10)
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert msg.data == 1001
            await closing
    finally:
        await d.http.close()


async def test_stopping_daemon_refuses_new_runs(daemon: Daemon) -> None:
    from codelegate.daemon.serving.state import STATE

    daemon.handle.app[STATE].stopping = True
    status, body = await daemon.json("POST", "/v1/runs", json={"task": "x"})
    assert (status, body["error"]["code"]) == (503, "shutting_down")
    async with daemon.http.get(f"{BASE}/healthz") as resp:
        assert (await resp.json())["status"] == "stopping"


async def test_lagging_websocket_is_closed_and_resumes_with_after(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    from tests.daemon.conftest import make_config

    config = make_config(short_dir, workspace, limits={"subscriber_queue": 256})
    d = await start_daemon(config, tmp_path)
    # The run is paced by the fast client, not by the clock: the fake CLI writes each batch of
    # 50 lines (about 50 frames) only after the fast client has read the one before, so the fast
    # queue never holds more than a batch, on any machine. The slow client reads nothing until
    # the run is over, so its queue overflows by the frames' count, not by anyone's speed.
    gate_path = short_dir / "gate"
    os.mkfifo(gate_path)
    gate = os.open(gate_path, os.O_RDWR | os.O_NONBLOCK)  # RDWR: open without waiting
    lines, batch = 6000, 50
    try:
        async with d.ws("?run=*") as slow, d.ws("?run=*") as fast:
            resp = await d.post_run(f"fake: tools n={lines} gate={gate_path} batch={batch}")
            run_id = (await resp.json())["run_id"]
            everything: list[dict[str, Any]] = []
            results = 0  # one tool_result frame per odd line
            for sent in range(batch, lines + batch, batch):
                os.write(gate, b"+")
                while results < min(sent, lines) // 2:
                    frame = await next_frame(fast)
                    if "seq" in frame:
                        everything.append(frame)
                        results += frame["type"] == "tool_result"
            everything += await frames_until_result(fast)
            assert [f["seq"] for f in everything] == list(range(1, len(everything) + 1))
            got: list[dict[str, Any]] = []
            while True:
                msg = await asyncio.wait_for(slow.receive(), 30)
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                got.append(msgspec.json.decode(msg.data))
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert msg.data == 4008
            # The hint is a safe lower bound: a frame may be in flight when the hub gives up.
            prefix, _, hint = msg.extra.rpartition("=")
            assert prefix == "lagging, reconnect with after"
            assert got[-1]["seq"] - 2 <= int(hint) <= got[-1]["seq"]
        assert got == everything[: len(got)]
        async with d.ws(f"?run={run_id}&after={got[-1]['seq']}") as again:
            rest = await frames_until_result(again)
        assert got + rest == everything
        async with d.http.get(f"{BASE}/metrics") as metrics:
            assert "codelegate_subscribers_dropped_total 1" in await metrics.text()
    finally:
        os.close(gate)
        await stop_daemon(d)


async def test_long_runs_keep_a_bounded_log_and_replay_the_rest_from_the_store(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    from codelegate.daemon.serving.state import STATE
    from tests.daemon.conftest import make_config

    config = make_config(short_dir, workspace, limits={"replay_frames": 100})
    async with running_daemon(config, tmp_path) as d:
        async with d.ws("?run=*") as first:
            resp = await d.post_run("fake: tools n=1200 rate=1500")
            run_id = (await resp.json())["run_id"]
            while (await next_frame(first))["seq"] < 400:
                pass
            manager = d.handle.app[STATE].manager
            assert manager is not None
            run = manager.get(run_id)
            assert run is not None
            assert run.log.first_seq > 1  # trimmed while live
            async with d.ws(f"?run={run_id}&after=0") as late:
                joined = await frames_until_result(late)
        assert [f["seq"] for f in joined] == list(range(1, joined[-1]["seq"] + 1))
        assert await d.events(run_id) == joined
        assert len(run.log) <= 125


class _Flood:
    """A child whose output is always buffered already: every read returns at once, full."""

    def __init__(self, reads: int) -> None:
        self.left = reads
        self.done = 0

    async def read(self, n: int) -> bytes:
        if not self.left:
            return b""
        self.left -= 1
        self.done += 1
        return b"x" * n


async def test_a_flooding_run_lets_the_loop_run_between_full_reads() -> None:
    flood = _Flood(reads=50)
    seen_at: list[int] = []  # how many reads the pump had done each time the other task ran

    async def other() -> None:
        while flood.left:
            seen_at.append(flood.done)
            await asyncio.sleep(0)

    task = asyncio.ensure_future(other())
    driver = Driver.__new__(Driver)  # _pump needs none of its state for a stopped run
    # output after a stop is read and dropped (no interrupt is waiting for its result)
    run = SimpleNamespace(stopping="cancelled", interrupt=None)
    await driver._pump(run, flood)  # type: ignore[arg-type]
    await task
    assert flood.done == 50
    assert len(set(seen_at)) > 25, seen_at  # it ran between the reads, not only before or after


def _tool_lines(n: int, first: int = 0) -> bytes:
    """``n`` Bash tool uses and their results, as the CLI prints them (stream-json)."""
    lines = []
    for i in range(first, first + n):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": "true"}}
        lines.append({"type": "assistant", "message": {"id": f"m{i}", "content": [use]}})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "ok"}
        lines.append({"type": "user", "message": {"role": "user", "content": [result]}})
    return b"".join(msgspec.json.encode(line) + b"\n" for line in lines)


async def test_a_chunk_crossing_the_store_cap_keeps_its_approval_frames_and_says_what_it_dropped(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    config = make_config(short_dir, workspace)
    store = await RunStore.open(str(tmp_path / "runs.db"), max_frames=3)
    manager = RunManager(config, store, Hub(), Metrics(), environ={})
    rec = RunRecord(run_id="r1", created_at=1.0, cwd=str(workspace), mode="safe")
    await store.create_run(rec)
    translator = Translator(run_context(rec), translator_limits(config), Redactor(()))
    run: Any = SimpleNamespace(record=rec, run_id="r1", translator=translator)
    run.log = RunLog("r1", Hub(), 100)
    frames = translator.receive_data(_tool_lines(3), 1.0)
    assert len(frames) == 6
    f = frames[4]  # past the cap: an approval's end in its place, which is stored regardless
    frames[4] = ApprovalResolved(
        f.id, f.run_id, f.seq, f.ts, f.provider, request_id="q", decision="deny",
        scope="once", by="policy", tool="Bash", tool_id="toolu_2",
    )  # fmt: skip
    try:
        manager._emit(run, frames)
        manager._emit(run, translator.receive_data(_tool_lines(1, 3), 2.0))  # said once only
        await store.flush()
        stored = [decode_frame(data) for data in await store.frames_after("r1", 0)]
    finally:
        await store.close()
    told = stored[-1]
    kinds = ["ToolCall", "ToolResult", "ToolCall", "ApprovalResolved"]
    assert [type(f).__name__ for f in stored[:4]] == kinds
    assert [f.seq for f in stored[:4]] == [1, 2, 3, 5]
    assert isinstance(told, Diagnostic)
    assert told.code == "frames_not_stored"
    assert (told.seq, told.count) == (7, 2)  # seqs 4 and 6 of the first chunk
    assert store.not_stored("r1") == 4
    assert [d.seq for d in run.log.after(0)] == list(range(1, 10))
