"""The thin ``claude_code`` tool (what a ConnectOnion agent calls) against the real CLI."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from codelegate.daemon.clients import tool as thin_tool
from tests.e2e.conftest import E2E, frames_until, is_run_result
from tests.procfs import marked_processes
from tests.stub.anthropic import Turn, text, tool

pytestmark = pytest.mark.e2e

O_CHAT_STATUSES = {"starting", "running", "awaiting_approval", "completed", "failed", "cancelled"}
O_CHAT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,512}$")
# DESIGN.md, "What O Chat accepts": the only texts its Work Room shows.
ACTIVITY_TEXTS = {
    "file_change": (
        "Update workspace files",
        {
            "Preparing workspace file changes",
            "Workspace files updated",
            "Workspace file change failed",
        },
    ),
    "inspect": (
        "Inspect the workspace",
        {
            "Inspecting workspace context",
            "Workspace inspection completed",
            "Workspace inspection failed",
        },
    ),
    "search": (
        "Search for context",
        {"Searching for relevant context", "Context search completed", "Context search failed"},
    ),
    "command": (
        "Run a workspace command",
        {
            "Running a workspace command",
            "Completed a workspace command",
            "A workspace command failed",
        },
    ),
    "tool": (
        "Use a provider tool",
        {"Using a provider tool", "Provider tool completed", "Provider tool failed"},
    ),
}
INVOCATION_TEXTS = {
    "taskTitle": {"Complete the requested task"},
    "currentSummary": {"Working in the selected workspace"},
    "resultSummary": {"The provider completed its run"},
    "errorSummary": {"The provider reported an error", "The provider stopped"},
}


def assert_o_chat_accepts(frames: list[dict[str, Any]]) -> None:
    """The rules of O Chat's fail-closed normalizer, which silently drops what breaks them."""
    for frame in frames:
        assert O_CHAT_ID.match(frame["invocationId"])
        assert O_CHAT_ID.match(frame["parentToolCallId"])
        if frame["type"] in ("tool_call", "tool_result"):
            assert O_CHAT_ID.match(frame["tool_id"])
            assert len(frame.get("summary", "")) <= 240
        if frame["type"] == "tool_result":
            assert isinstance(frame["result"], str)
        if frame["type"] == "provider_invocation":
            assert frame["provider"] == "claude_code"
            assert frame["status"] in O_CHAT_STATUSES
            assert frame["permissionMode"] in ("manual", "auto_approve")
            for key, allowed in INVOCATION_TEXTS.items():
                assert frame.get(key) is None or frame[key] in allowed, key
        if frame["type"] == "provider_activity":
            title, summaries = ACTIVITY_TEXTS[frame["kind"]]
            assert frame["title"] == title
            assert frame["summary"] in summaries


class FakeAgent:
    """What the tool reads from a ConnectOnion agent: the active tool call of its session."""

    def __init__(self, tool_call_id: str) -> None:
        self.current_session = {"_active_tool_call_id": tool_call_id, "session_id": "agent-1"}


async def call_tool(
    e2e: E2E, monkeypatch: pytest.MonkeyPatch, mode: thin_tool.Mode = "safe", **kw: Any
) -> dict[str, Any]:
    assert e2e.handle is not None
    assert e2e.handle.socket_path is not None
    monkeypatch.setenv(thin_tool.SOCKET_ENV, e2e.handle.socket_path)
    tool_ = thin_tool.ClaudeCode(mode=mode).claude_code
    raw = await asyncio.to_thread(tool_, cwd=str(e2e.workspace), **kw)
    result: dict[str, Any] = json.loads(raw)
    return result


async def test_tool_call_nests_frames_under_the_parent_and_resumes(
    e2e: E2E, monkeypatch: pytest.MonkeyPatch
) -> None:
    e2e.stub.main.turns = [
        tool("Read", file_path=e2e.path("hello.py")),
        tool("Edit", file_path=e2e.path("hello.py"), old_string="world", new_string="there"),
        tool("Bash", command="touch ../outside.txt", description="Write outside"),  # denied
        text("Edited hello.py."),
        tool("Read", file_path=e2e.path("hello.py")),  # the follow-up
        text("It now says hello there."),
    ]
    result = await call_tool(
        e2e,
        monkeypatch,
        prompt="Make hello.py say hello there.",
        mode="accept_edits",
        agent=FakeAgent("call_01"),
    )
    assert result["status"] == "completed"
    assert result["result"] == "Edited hello.py."
    assert result["files_changed"] == ["hello.py"]
    assert (e2e.workspace / "hello.py").read_text() == 'print("hello there")\n'

    async with e2e.ws(result["run_id"]) as ws:
        frames = await frames_until(ws, is_run_result)
    assert_o_chat_accepts(frames)
    assert all(f["invocationId"] == "claude_code:call_01" for f in frames)
    assert all(f["parentToolCallId"] == "call_01" for f in frames)
    invocations = [f for f in frames if f["type"] == "provider_invocation"]
    assert invocations
    revisions = [f["stateRevision"] for f in invocations]
    assert revisions == sorted(set(revisions))  # strictly increasing
    assert {f["status"] for f in invocations} <= O_CHAT_STATUSES
    assert invocations[-1]["status"] == "completed"
    assert {f["permissionMode"] for f in invocations} == {"auto_approve"}
    assert invocations[-1]["sessionId"] == result["session_id"]
    activities = [f for f in frames if f["type"] == "provider_activity"]
    assert [(a["kind"], a["status"]) for a in activities] == [
        ("inspect", "running"),
        ("inspect", "completed"),
        ("file_change", "running"),
        ("file_change", "running"),  # opened at its block's start, then it names its file
        ("file_change", "completed"),
        ("command", "running"),
        ("command", "failed"),
    ]
    calls = [f for f in frames if f["type"] == "tool_call"]
    assert list(dict.fromkeys(a["activityId"] for a in activities)) == list(
        dict.fromkeys(f["tool_id"] for f in calls)
    )
    assert [a.get("files") for a in activities if a["kind"] == "file_change"] == [
        None,
        ["hello.py"],
        ["hello.py"],
    ]
    assert [d["name"] for d in result["permission_denials"]] == ["Bash"]

    # A follow-up prompt under the same parent tool call continues the Work Room.
    again = await call_tool(
        e2e,
        monkeypatch,
        prompt="What does it say?",
        session_id=result["session_id"],
        agent=FakeAgent("call_01"),
    )
    assert again["status"] == "completed"
    assert again["resumed"] is True
    assert again["session_id"] == result["session_id"]
    assert "Make hello.py say hello there." in e2e.stub.requests_of("main")[-1].history_text()
    async with e2e.ws(again["run_id"]) as ws:
        follow_up = await frames_until(ws, is_run_result)
    assert_o_chat_accepts(follow_up)
    # O Chat ignores a revision at or below the one it shows, and sorts rows by sequence.
    later = [f["stateRevision"] for f in follow_up if f["type"] == "provider_invocation"]
    assert later == sorted(set(later))
    assert later[0] > revisions[-1]
    rows = [f["sequence"] for f in follow_up if f["type"] == "provider_activity"]
    assert rows == [4, 4]  # the fourth card of this Work Room
    texts = [f for f in follow_up if f["type"] == "provider_message"]
    # Streamed: it grows under one messageId, and the last frame has the whole text.
    assert {t["messageId"] for t in texts} == {f"{again['run_id']}:message:1"}
    assert texts[-1]["text"] == "It now says hello there."
    assert "partial" not in texts[-1]


async def test_tool_reports_a_refusal_as_a_result(
    e2e: E2E, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = await call_tool(e2e, monkeypatch, prompt="Go.", session_id="no-such-id")
    assert result["status"] == "refused"
    assert e2e.stub.requests == []


async def test_agent_stop_returns_the_daemons_cancelled_result(e2e: E2E) -> None:
    """Stop while the model thinks: the run is cancelled by name, the session id comes back."""
    e2e.stub.main.turns = [Turn(text("never sent").blocks, hold=asyncio.Event())]
    assert e2e.handle is not None
    assert e2e.handle.socket_path is not None
    body = {"task": "Think forever.", "cwd": str(e2e.workspace), "wait": True}
    result = await asyncio.to_thread(
        thin_tool.call_run,
        body,
        e2e.handle.socket_path,
        # The agent presses Stop once the CLI has asked the model.
        cancelled=lambda: bool(e2e.stub.requests),
        poll_s=0.01,
    )
    assert result["status"] == "cancelled"
    assert result["session_id"]
    await e2e.settled(result["run_id"])
    assert marked_processes(result["run_id"]) == []


async def test_a_bound_mode_the_operator_did_not_allow_is_refused(
    e2e: E2E, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The development config leaves "auto" out of [policy] allowed_modes.
    result = await call_tool(e2e, monkeypatch, mode="auto", prompt="Go.")
    assert result["status"] == "refused"
    assert result["error_code"] == "mode_not_allowed"
    assert e2e.stub.requests == []
