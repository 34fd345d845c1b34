"""End to end: HTTP + WebSocket client → daemon → the real Claude Code CLI → the API stub."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from typing import Any

import pytest

from tests.e2e.conftest import BASE, E2E, frames_until, is_run_result
from tests.procfs import cmdline, marked_processes
from tests.stub.anthropic import Turn, error, start_subagent, text, tool
from tests.stub.claude import API_KEY

pytestmark = pytest.mark.e2e


def cards(frames: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """tool_id -> its tool_call / tool_result frames, in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for frame in frames:
        if frame["type"] in ("tool_call", "tool_result"):
            out.setdefault(frame["tool_id"], []).append(frame)
    return out


def assert_cards_closed(frames: list[dict[str, Any]]) -> None:
    """Card invariants 1-3: per tool_id a tool_call (later ones fill the open card), then one
    tool_result, before run_result."""
    for tool_id, pair in cards(frames).items():
        kinds = [f["type"] for f in pair]
        assert kinds[0] == "tool_call", tool_id
        assert kinds[-1] == "tool_result", tool_id
        assert kinds.count("tool_result") == 1, tool_id


def filled_calls(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each card's last tool_call (the one with its complete arguments), in opening order."""
    calls: dict[str, dict[str, Any]] = {}
    for frame in frames:
        if frame["type"] == "tool_call":
            calls[frame["tool_id"]] = frame
    return list(calls.values())


def final_texts(frames: list[dict[str, Any]]) -> list[str]:
    """Each assistant message's full text (a streamed one grows under its messageId)."""
    texts: dict[str, str] = {}
    for frame in frames:
        if frame["type"] == "provider_message":
            texts[frame["messageId"]] = frame["text"]
    return list(texts.values())
    assert frames[-1]["type"] == "run_result"
    assert [f["seq"] for f in frames] == list(range(frames[0]["seq"], frames[-1]["seq"] + 1))


def edit_script(e2e: E2E, final: Turn) -> list[Turn]:
    return [
        tool("Read", say="Reading hello.py.", file_path=e2e.path("hello.py")),
        tool("Edit", file_path=e2e.path("hello.py"), old_string="world", new_string="there"),
        tool("Bash", command="cat hello.py", description="Show the file"),
        final,
    ]


async def test_live_read_edit_bash_cards_then_result_and_resume(e2e: E2E) -> None:
    release = asyncio.Event()
    final = Turn(text("Changed the greeting.").blocks, hold=release)
    e2e.stub.main.turns = [*edit_script(e2e, final), text("It says hello there.")]
    status, started = await e2e.post_run("Change the greeting in hello.py to 'hello there'.")
    assert status == 202
    assert started["status"] == "running"
    run_id = started["run_id"]

    async with e2e.ws(run_id) as ws:
        # Live: every card opens and closes while the model's last answer is still held open.
        frames = await frames_until(
            ws, lambda f: f["type"] == "tool_result" and f["name"] == "Claude Code › Bash"
        )
        assert not any(is_run_result(f) for f in frames)
        release.set()
        frames = await frames_until(ws, is_run_result, frames)

    assert all(f["run_id"] == run_id and f["provider"] == "claude_code" for f in frames)
    assert frames[0]["seq"] == 1
    assert_cards_closed(frames)
    # With partial messages a card opens at its block's start, before its arguments exist.
    opened = [pair[0] for pair in cards(frames).values()]
    assert [(f["type"], f["args"], f["summary"]) for f in opened] == [
        ("tool_call", {}, "Read"),
        ("tool_call", {}, "Edit"),
        ("tool_call", {}, "Bash"),
    ]
    calls = filled_calls(frames)
    assert [f["name"] for f in calls] == [
        "Claude Code › Read",
        "Claude Code › Edit",
        "Claude Code › Bash",
    ]
    assert all(f["tool_id"].startswith("claude:toolu_") for f in calls)
    assert all(f["status"] == "in_progress" and f.get("parent_tool_id") is None for f in calls)
    assert [f["summary"] for f in calls] == ["Read hello.py", "Edit hello.py", "Run: cat hello.py"]
    results = [f for f in frames if f["type"] == "tool_result"]
    assert [f["status"] for f in results] == ["completed"] * 3
    assert '+print("hello there")' in results[1]["diff"]
    assert "hello there" in results[-1]["result"]
    assert final_texts(frames) == ["Reading hello.py.", "Changed the greeting."]
    assert [f.get("partial", False) for f in frames if f["type"] == "provider_message"][-1] is False
    assert all(f["id"] == f"{run_id}:{f['seq']}" for f in frames)
    final_result = frames[-1]["result"]
    assert {f.get("child_session_id") for f in frames} == {final_result["session_id"]}
    assert final_result["status"] == "completed"
    assert final_result["result"] == "Changed the greeting."
    assert final_result["exit_code"] == 0
    assert final_result["files_changed"] == ["hello.py"]
    session_id = final_result["session_id"]
    assert str(uuid.UUID(session_id)) == session_id
    assert (e2e.workspace / "hello.py").read_text() == 'print("hello there")\n'
    # the CLI got the stub through the allowlist, and nothing else of the daemon's environment
    first_request = e2e.stub.requests_of("main")[0]
    assert "CODELEGATE_E2E_NOT_PASSED" not in first_request.history_text()

    status, state = await e2e.get(f"/v1/runs/{run_id}")
    assert status == 200
    assert state["status"] == "completed"

    # The second run resumes that session: same session id, and the model sees the history.
    status, body = await e2e.post_run("What does it say now?", resume=session_id, wait=True)
    assert status == 200
    assert body["status"] == "completed"
    assert body["resumed"] is True
    assert body["session_id"] == session_id
    assert body["result"] == "It says hello there."
    history = e2e.stub.requests_of("main")[-1].history_text()
    assert "Change the greeting in hello.py" in history
    assert "Changed the greeting." in history
    assert "What does it say now?" in history


async def test_wait_returns_the_final_result(e2e: E2E) -> None:
    e2e.stub.main.turns = [tool("Read", file_path=e2e.path("hello.py")), text("It prints.")]
    status, body = await e2e.post_run("What does hello.py print?", wait=True)
    assert status == 200
    assert body["provider"] == "claude_code"
    assert body["status"] == "completed"
    assert body["result"] == "It prints."
    assert body["tools"] == {"started": 1, "completed": 1, "failed": 0}
    assert body["files_changed"] == []
    assert body["resumed"] is False


async def test_permission_denial_closes_the_card_failed(e2e: E2E) -> None:
    outside = tool("Bash", command="touch ../outside.txt", description="Write outside")
    e2e.stub.main.turns = [outside, text("Denied.")]
    status, body = await e2e.post_run("Create ../outside.txt.", wait=True)
    assert status == 200
    assert body["status"] == "completed"
    (denial,) = body["permission_denials"]
    assert denial["name"] == "Bash"
    assert denial["tool_id"].startswith("claude:toolu_")
    async with e2e.ws(body["run_id"]) as ws:
        frames = await frames_until(ws, is_run_result)
    (result,) = [f for f in frames if f["type"] == "tool_result"]
    assert result["status"] == "failed"
    assert result["error_type"] == "permission_denied"


async def test_api_error_fails_the_run(e2e: E2E) -> None:
    e2e.stub.main.turns = [error(400, "stub: invalid request", times=50)]
    status, body = await e2e.post_run("Say hello.", wait=True)
    assert status == 200
    assert body["status"] == "failed"
    assert body["exit_code"] == 1


async def test_cancel_mid_bash_ends_cancelled_and_leaves_no_process(e2e: E2E) -> None:
    ready = e2e.stub.signal_url("sleeper")
    sleeper = (
        f"python3 -c 'import time, urllib.request as u; u.urlopen(\"{ready}\"); time.sleep(120)'"
    )
    e2e.stub.main.turns = [tool("Bash", command=sleeper, description="Wait a long time")]
    status, started = await e2e.post_run("Wait.")
    assert status == 202
    run_id = started["run_id"]
    async with e2e.ws(run_id) as ws:
        frames = await frames_until(ws, lambda f: f["type"] == "tool_call")
        # The Bash command runs in a session of its own (setsid), out of the CLI's group:
        # wait until it runs, so that cancelling has to find it by the run marker.
        async with asyncio.timeout(20):
            await e2e.stub.wait_for_signal("sleeper")
        sleepers = [pid for pid in marked_processes(run_id) if b"time.sleep(120)" in cmdline(pid)]
        assert sleepers
        status, _ = await e2e.post(f"/v1/runs/{run_id}/cancel")
        assert status == 202
        frames = await frames_until(ws, is_run_result, frames)

    assert_cards_closed(frames)
    (bash,) = [f for f in frames if f["type"] == "tool_result"]
    assert bash["status"] == "failed"
    assert bash["error_type"] == "cancelled"
    assert frames[-1]["result"]["status"] == "cancelled"
    await e2e.settled(run_id)
    assert marked_processes(run_id) == []
    status, state = await e2e.get(f"/v1/runs/{run_id}")
    assert state["status"] == "cancelled"


async def test_cancel_while_the_model_is_thinking(e2e: E2E) -> None:
    e2e.stub.main.turns = [Turn(text("never sent").blocks, hold=asyncio.Event())]
    status, started = await e2e.post_run("Think forever.")
    assert status == 202
    run_id = started["run_id"]
    await e2e.stub.wait_for_requests(1)
    status, _ = await e2e.post(f"/v1/runs/{run_id}/cancel")
    assert status == 202
    async with e2e.ws(run_id) as ws:
        frames = await frames_until(ws, is_run_result)
    assert frames[-1]["result"]["status"] == "cancelled"
    await e2e.settled(run_id)
    assert marked_processes(run_id) == []


async def test_resume_forgery_is_refused_and_spawns_nothing(e2e: E2E) -> None:
    for forged in (str(uuid.uuid4()), str(uuid.uuid4()).upper(), "../../etc/passwd"):
        status, body = await e2e.post_run("Continue.", resume=forged)
        assert status == 403, forged
        assert set(body) == {"error"}
    status, listing = await e2e.get("/v1/runs")
    assert status == 200
    assert listing["runs"] == []
    assert e2e.stub.requests == []


async def test_env_dump_reaches_clients_redacted(e2e: E2E) -> None:
    e2e.stub.main.turns = [tool("Bash", command="env", description="Show env"), text("Shown.")]
    status, body = await e2e.post_run("Show the environment.", wait=True)
    assert status == 200
    assert body["status"] == "completed"
    async with e2e.ws(body["run_id"]) as ws:
        frames = await frames_until(ws, is_run_result)
    (result,) = [f for f in frames if f["type"] == "tool_result"]
    assert result["status"] == "completed"
    wire = json.dumps(frames)
    assert "ANTHROPIC_BASE_URL" in wire  # the dump did arrive…
    assert API_KEY not in wire  # …without the key
    assert not re.search(r"CLAUDE_CODE_MESSAGING_TOKEN=[0-9a-f]{16}", wire)
    assert "CODELEGATE_E2E_NOT_PASSED" not in wire  # the child env is an allowlist


async def test_subagent_cards_nest_under_their_task_card(e2e: E2E) -> None:
    marker = "[[e2e-subagent]]"
    e2e.stub.main.turns = [
        start_subagent("Read hello.py", f"{marker} Read hello.py.", background=None),
        text("Started a subagent."),
        text("The subagent is done."),
    ]
    e2e.stub.subagent(marker, [tool("Read", file_path=e2e.path("hello.py")), text("hello")])
    status, body = await e2e.post_run("Delegate reading hello.py.", wait=True)
    assert status == 200
    assert body["status"] == "completed"
    assert body["result"] == "The subagent is done."  # the last result line wins
    async with e2e.ws(body["run_id"]) as ws:
        frames = await frames_until(ws, is_run_result)
    assert_cards_closed(frames)
    by_card = cards(frames)
    task_id, read_id = by_card
    task_call, task_result = by_card[task_id][0], by_card[task_id][-1]
    assert task_call["name"] in ("Claude Code › Agent", "Claude Code › Task")
    read_call, read_result = by_card[read_id][0], by_card[read_id][-1]
    assert read_call["parent_tool_id"] == task_id
    assert read_result["status"] == "completed"
    # --forward-subagent-text: the subagent's own words come, under its Task card.
    said = [f for f in frames if f["type"] == "provider_message" and f.get("parent_tool_id")]
    assert [(f["parent_tool_id"], f["text"]) for f in said] == [(task_id, "hello")]
    # invariant 4: the background Task card closes after its subagent's work, not at "launched"
    assert frames.index(task_result) > frames.index(read_result)
    assert task_result["status"] == "completed"


async def test_two_subscribers_and_replay_after(e2e: E2E) -> None:
    release = asyncio.Event()
    e2e.stub.main.turns = edit_script(e2e, Turn(text("Done.").blocks, hold=release))
    status, started = await e2e.post_run("Edit hello.py.")
    assert status == 202
    run_id = started["run_id"]
    async with e2e.ws(run_id) as first:
        head = await frames_until(first, lambda f: f["type"] == "tool_result")
        async with e2e.ws(run_id, after=head[-1]["seq"]) as second:
            release.set()
            rest_first = await frames_until(first, is_run_result)
            rest_second = await frames_until(second, is_run_result)
    assert rest_first == rest_second  # replay after seq, then live: no gap, no duplicate
    frames = head + rest_first
    assert_cards_closed(frames)
    assert frames[0]["seq"] == 1


async def test_a_waiting_caller_that_hangs_up_cancels_its_run(e2e: E2E) -> None:
    e2e.stub.main.turns = [Turn(text("never sent").blocks, hold=asyncio.Event())]
    async with e2e.client.ws_connect(f"{BASE}/v1/ws?run=*") as ws:
        waiting = asyncio.ensure_future(e2e.post_run("Think forever.", wait=True))
        await e2e.stub.wait_for_requests(1)
        waiting.cancel()  # the caller goes away
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        frames = await frames_until(ws, is_run_result)
    final = frames[-1]["result"]
    assert final["status"] == "cancelled"
    await e2e.settled(final["run_id"])
    assert marked_processes(final["run_id"]) == []


@pytest.mark.parametrize("daemon_policy", [{"run_timeout_s": 1.0}])
async def test_a_run_over_its_time_limit_ends_timeout(e2e: E2E) -> None:
    e2e.stub.main.turns = [Turn(text("never sent").blocks, hold=asyncio.Event())]
    status, body = await e2e.post_run("Think forever.", wait=True)
    assert status == 200
    assert body["status"] == "timeout"
    assert marked_processes(body["run_id"]) == []


@pytest.mark.parametrize("daemon_policy", [{"max_concurrent_runs": 1}])
async def test_runs_over_the_concurrency_limit_are_refused(e2e: E2E) -> None:
    e2e.stub.main.turns = [Turn(text("never sent").blocks, hold=asyncio.Event())]
    status, started = await e2e.post_run("Think forever.")
    assert status == 202
    status, body = await e2e.post_run("Me too.")
    assert status == 429
    assert set(body) == {"error"}
    status, _ = await e2e.post(f"/v1/runs/{started['run_id']}/cancel")
    assert status == 202
    async with e2e.ws(started["run_id"]) as ws:
        frames = await frames_until(ws, is_run_result)
    assert frames[-1]["result"]["status"] == "cancelled"


async def test_ndjson_events_match_the_websocket_and_runs_are_listed(e2e: E2E) -> None:
    e2e.stub.main.turns = [tool("Read", file_path=e2e.path("hello.py")), text("One."), text("Two.")]
    _, first = await e2e.post_run("First.", wait=True)
    _, second = await e2e.post_run("Second.", wait=True)
    async with e2e.client.get(f"{BASE}/v1/runs/{first['run_id']}/events") as resp:
        assert resp.status == 200
        assert resp.content_type == "application/x-ndjson"
        ndjson = [json.loads(line) for line in (await resp.read()).splitlines()]
    async with e2e.ws(first["run_id"]) as ws:
        frames = await frames_until(ws, is_run_result)
    assert ndjson == frames
    async with e2e.client.get(f"{BASE}/v1/runs/{first['run_id']}/events?after=2") as resp:
        tail = [json.loads(line) for line in (await resp.read()).splitlines()]
    assert tail == frames[2:]
    status, listing = await e2e.get("/v1/runs?limit=10")
    assert status == 200
    assert [r["run_id"] for r in listing["runs"]] == [second["run_id"], first["run_id"]]
