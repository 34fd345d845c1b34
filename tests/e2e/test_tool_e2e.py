"""The thin ``claude_code`` tool (what a ConnectOnion agent calls) against the real CLI."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from codelegate.daemon.clients import tool as thin_tool
from tests.contract.ochat import Show
from tests.e2e.conftest import E2E, frames_until, is_run_result, workspace_tree
from tests.polling import until
from tests.procfs import marked_processes
from tests.reliability.served import Served, write_config
from tests.stub.anthropic import Stub, Turn, serve_stub, text, tool
from tests.stub.claude import API_KEY

pytestmark = pytest.mark.e2e

O_CHAT_STATUSES = {"starting", "running", "awaiting_approval", "completed", "failed", "cancelled"}
O_CHAT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,512}$")
# The texts of the Work Room (taskTitle…, an activity's title and summary) are O Chat's
# allowlists: what its normalizer keeps of a frame is the oracle, not a copy of the lists.
INVOCATION_TEXTS = ("taskTitle", "currentSummary", "resultSummary", "errorSummary")


def assert_o_chat_accepts(show: Show, frames: list[dict[str, Any]]) -> None:
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
    # After each frame, the Work Room shows that frame's texts: none was dropped.
    (steps,) = show(frames)
    for n, (frame, items) in enumerate(zip(frames, steps, strict=True), 1):
        [room] = [i for i in items if i.get("id") == frame["invocationId"]]
        if frame["type"] == "provider_invocation":
            for key in INVOCATION_TEXTS:
                assert room.get(key) == frame.get(key), (n, key)
        if frame["type"] == "provider_activity":
            [row] = [r for r in room["activities"] if r["id"] == frame["activityId"]]
            assert (row["title"], row["summary"]) == (frame["title"], frame["summary"]), n
    # One title for each kind of row, and a different one for each kind.
    titles = {(f["kind"], f["title"]) for f in frames if f["type"] == "provider_activity"}
    assert len(titles) == len(dict(titles)) == len(set(dict(titles).values()))


class FakeAgent:
    """What the tool reads from a ConnectOnion agent: the active tool call of its session."""

    def __init__(self, tool_call_id: str) -> None:
        self.current_session = {"_active_tool_call_id": tool_call_id, "session_id": "agent-1"}


class LoggingAgent:
    """An agent whose IO only logs: the kinds of frame the tool relayed to it so far."""

    def __init__(self) -> None:
        self.io = self
        self.relayed: list[str] = []

    def log(self, kind: str, **fields: Any) -> None:
        self.relayed.append(kind)


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
    e2e: E2E, monkeypatch: pytest.MonkeyPatch, show: Show
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
    assert_o_chat_accepts(show, frames)
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
    assert_o_chat_accepts(show, follow_up)
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


async def test_a_prompt_the_cli_would_take_as_its_own_command_is_refused_with_the_reason(
    e2e: E2E, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = await call_tool(e2e, monkeypatch, prompt="/model haiku")
    assert (result["status"], result["error_code"]) == ("refused", "slash_command")
    assert 'must not start with "/"' in result["error"]
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


@asynccontextmanager
async def killable(
    claude_bin: str, tmp_path: Path, short_dir: Path, extra: str = ""
) -> AsyncIterator[tuple[Served, Stub, Path]]:
    """``codelegate serve`` as a child process one can SIGKILL (``extra``: config sections), the
    pinned CLI against a fresh stub, and the workspace."""
    root, workspace, home = workspace_tree(tmp_path)
    stub = Stub()
    async with serve_stub(stub):
        env = {
            "LANG": "C.UTF-8",
            "TMPDIR": str(home / "tmp"),
            "ANTHROPIC_BASE_URL": stub.url,
            "ANTHROPIC_API_KEY": API_KEY,
        }
        daemon = Served(write_config(short_dir, root, claude_bin, extra), short_dir, home, env)
        await daemon.start()
        try:
            yield daemon, stub, workspace
        finally:
            await daemon.stop()


@pytest.mark.slow
async def test_a_daemon_killed_while_the_tool_waits_is_reported_gone_with_the_session_to_resume(
    claude_bin: str, tmp_path: Path, short_dir: Path
) -> None:
    """SIGKILL of ``codelegate serve`` mid-run: the user did not stop anything, so the model must
    not hear ``cancelled``; it hears that the daemon went away, with the run and the session it
    can resume once the daemon is back."""
    claude_code = thin_tool.ClaudeCode(socket=str(short_dir / "d.sock")).claude_code
    async with killable(claude_bin, tmp_path, short_dir) as (daemon, stub, workspace):
        stub.main.turns = [
            tool("Read", file_path=str(workspace / "hello.py")),  # frames naming the session
            Turn(text("never sent").blocks, hold=asyncio.Event()),
            text("Back."),
        ]
        agent = LoggingAgent()
        waiting = asyncio.create_task(
            asyncio.to_thread(claude_code, "Think.", cwd=str(workspace), agent=agent)
        )
        await stub.wait_for_requests(2)  # the Read is done, the model thinks
        await until(lambda: "tool_result" in agent.relayed, what="the Read's frames relayed")
        await daemon.kill()
        result = json.loads(await asyncio.wait_for(waiting, 60))

        await daemon.start()  # the restart closes the run as interrupted
        status, state = await daemon.json("GET", f"/v1/runs/{result['run_id']}")
        resumed = json.loads(
            await asyncio.to_thread(
                claude_code, "Go on.", session_id=result["session_id"], cwd=str(workspace)
            )
        )
    assert result["status"] == "failed"
    assert result["error_code"] == "daemon_unreachable"
    assert "cancel" not in result["error"]
    assert status == 200
    assert state["status"] == "interrupted"
    assert result["session_id"]
    assert result["session_id"] == state["session_id"]
    assert resumed["status"] == "completed"
    assert resumed["resumed"] is True
    assert resumed["result"] == "Back."


@pytest.mark.slow
async def test_a_daemon_killed_while_a_person_is_asked_ends_the_wait_and_keeps_the_session(
    claude_bin: str, tmp_path: Path, short_dir: Path
) -> None:
    """The request died with the daemon: the tool stops waiting for its answer and reports the
    daemon gone, with the session, instead of blocking until someone answers nothing."""
    from connectonion.network.io import WebSocketIO

    agent = LoggingAgent()
    agent.io = io = WebSocketIO()
    claude_code = thin_tool.ClaudeCode(socket=str(short_dir / "d.sock")).claude_code
    extra = "[approvals]\nenabled = true\n"
    async with killable(claude_bin, tmp_path, short_dir, extra) as (daemon, stub, workspace):
        stub.main.turns = [
            tool("Read", file_path=str(workspace / "hello.py")),  # frames naming the session
            tool("Bash", command="touch ../outside.txt", description="Touch"),  # asked
        ]
        waiting = asyncio.create_task(
            asyncio.to_thread(claude_code, "Touch it.", cwd=str(workspace), agent=agent)
        )
        try:
            await until(
                lambda: any(m.get("type") == "approval_needed" for m in io._msgs_from_agent),
                30,
                "the request put to the agent's IO",
            )
            await daemon.kill()
            result = json.loads(await asyncio.wait_for(asyncio.shield(waiting), 60))
        finally:
            if not waiting.done():  # let the tool's thread go, the test has failed already
                io.answer_request({"type": "APPROVAL_RESPONSE", "approved": False})
                await asyncio.wait_for(waiting, 60)
        await daemon.start()
        _, state = await daemon.json("GET", f"/v1/runs/{result['run_id']}")
    assert (result["status"], result["error_code"]) == ("failed", "daemon_unreachable")
    assert result["session_id"] == state["session_id"]
    assert result["session_id"]
    assert not (workspace.parent / "outside.txt").exists()
