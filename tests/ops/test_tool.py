"""The thin ``claude_code`` tool: its ConnectOnion schema and its HTTP conversation."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from codelegate.daemon.clients import tool, tool_follow, tool_stream, tool_wait
from codelegate.daemon.clients.tool import ClaudeCode, claude_code

from .conftest import FakeDaemon

RUN_ID = "run-0001"
SESSION = "3f1c2a54-8d5e-4b7a-9c61-0a2b3c4d5e6f"

FINAL = {
    "provider": "claude_code",
    "run_id": RUN_ID,
    "status": "completed",
    "session_id": SESSION,
    "resumed": False,
    "result": "Added the test.",
    "error": None,
    "exit_code": 0,
    "usage": {"input_tokens": 10, "output_tokens": 5},
    "total_cost_usd": 0.01,
    "permission_denials": [],
    "tools": {"started": 1, "completed": 1, "failed": 0},
    "files_changed": ["tests/test_app.py"],
    "changes": "--- a/tests/test_app.py\n+++ b/tests/test_app.py\n",
    "commands": [{"command": "pytest -q", "outcome": "completed", "error": None}],
}
CARD = {
    "type": "tool_call",
    "seq": 1,
    "run_id": RUN_ID,
    "tool_id": "claude:t1",
    "name": "Claude Code › Bash",
}


def _make_agent(tmp_path: Path, tool_: Any = claude_code) -> Any:
    from connectonion import Agent
    from connectonion.core.llm import LLM

    class NoLLM(LLM):  # type: ignore[misc]
        """An LLM that must never be asked: these tests make no model call."""

        def __init__(self) -> None:
            self.model = "no-model"
            self.api_key = "unused"

        def complete(self, messages: Any, tools: Any = None) -> Any:
            raise AssertionError("no LLM call expected")

        def structured_complete(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("no LLM call expected")

    return Agent(
        "delegator",
        tools=[tool_],
        llm=NoLLM(),
        quiet=True,
        log=False,
        co_dir=tmp_path / ".co",
    )


def _answer(payload: dict[str, Any], status: int = 200, announce: bool = False) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        headers = {tool.RUN_ID_HEADER: RUN_ID} if announce else {}
        return web.json_response(payload, status=status, headers=headers)

    return handler


def _ndjson(*frames: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(frame).encode() + b"\n" for frame in frames)


def _stream(*frames: dict[str, Any], final: dict[str, Any] = FINAL, hold: Any = None) -> Any:
    """An events stream: ``frames``, then (once ``hold`` is set) the run_result."""

    async def handler(request: web.Request) -> web.StreamResponse:
        after = int(request.query.get("after", "0"))
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        await response.write(_ndjson(*[f for f in frames if f["seq"] > after]))
        if hold is not None:
            await hold.wait()
        last = max([f["seq"] for f in frames] or [0]) + 1
        await response.write(_ndjson({"type": "run_result", "seq": last, "result": final}))
        await response.write_eof()
        return response

    return handler


def test_connectonion_derives_its_own_tools_schema(tmp_path: Path) -> None:
    agent = _make_agent(tmp_path, ClaudeCode(mode="accept_edits"))
    assert agent.tools.names() == ["claude_code"]
    schema = agent.tools.get("claude_code").to_function_schema()
    params = schema["parameters"]
    assert schema["name"] == "claude_code"
    assert "Claude Code" in schema["description"]
    assert "changes" in schema["description"]
    # (ConnectOnion adds its own "summary" argument to every tool.)
    assert set(params["properties"]) - {"summary"} == {
        "prompt",
        "session_id",
        "cwd",
        "model",
        "timeout",
    }
    # ConnectOnion injects `agent`; the model never sees it, nor the mode its operator bound.
    assert "prompt" in params["required"]
    assert "agent" not in params["properties"]
    assert not {"session_id", "cwd", "model", "timeout"} & set(params["required"])


def test_a_mode_outside_the_known_ones_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        ClaudeCode(mode="bypassPermissions")  # type: ignore[arg-type]


async def test_agent_call_links_the_parent_tool_call_and_binds_the_mode(
    fake_daemon: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODELEGATE_SOCKET", fake_daemon.socket)
    fake_daemon.post_run = _answer(FINAL, announce=True)
    fake_daemon.events = _stream(CARD)
    agent = _make_agent(tmp_path, ClaudeCode(mode="accept_edits"))

    outcome = await asyncio.to_thread(agent.execute_tool, "claude_code", {"prompt": "add a test"})

    assert outcome["status"] == "success"
    assert json.loads(outcome["result"])["session_id"] == SESSION
    [(_, path, body), (_, events, _)] = fake_daemon.requests
    assert path == "/v1/runs"
    assert events == f"/v1/runs/{RUN_ID}/events?after=0"
    assert body["task"] == "add a test"
    assert body["mode"] == "accept_edits"
    assert body["wait"] is True
    assert body["cwd"] == os.getcwd()
    assert "resume" not in body
    # Agent.execute_tool names its call "manual_<tool>_<time>"; a model's call has the LLM's id.
    assert body["parent"]["tool_call_id"].startswith("manual_claude_code_")
    # The card went into the agent's trace, as ConnectOnion's own tools record theirs.
    assert any(e.get("tool_id") == "claude:t1" for e in agent.current_session["trace"])


async def test_direct_call_returns_connectonions_envelope(
    fake_daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODELEGATE_SOCKET", fake_daemon.socket)
    fake_daemon.post_run = _answer(FINAL, announce=True)
    fake_daemon.events = _stream(CARD)

    raw = await asyncio.to_thread(
        claude_code, "continue", session_id=SESSION, cwd="/srv/ws", model="claude-x"
    )

    assert isinstance(raw, str)
    result = json.loads(raw)
    assert {k: result[k] for k in FINAL} == {**FINAL, "error": ""}
    body = fake_daemon.requests[0][2]
    assert (body["resume"], body["cwd"], body["model"], body["mode"]) == (
        SESSION,
        "/srv/ws",
        "claude-x",
        "safe",
    )
    assert "parent" not in body


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (403, "workspace_outside_roots", "refused"),
        (409, "session_running", "refused"),
        (503, "shutting_down", "failed"),
    ],
)
async def test_daemon_errors_come_back_as_results(
    fake_daemon: FakeDaemon,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    code: str,
    expected: str,
) -> None:
    monkeypatch.setenv("CODELEGATE_SOCKET", fake_daemon.socket)
    error = {"error": {"code": code, "message": "not here"}}
    fake_daemon.post_run = _answer(error, status=status)

    result = json.loads(await asyncio.to_thread(claude_code, "x"))

    assert result["status"] == expected
    assert result["error_code"] == code
    assert result["error"] == f"{code}: not here"
    assert result["http_status"] == status
    assert result["session_id"] == ""
    assert result["files_changed"] == []
    assert result["usage"] == {}


async def test_a_non_json_answer_is_a_failure(
    fake_daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODELEGATE_SOCKET", fake_daemon.socket)

    async def garbage(request: web.Request) -> web.StreamResponse:
        return web.Response(text="<html>", status=502)

    fake_daemon.post_run = garbage
    result = json.loads(await asyncio.to_thread(claude_code, "x"))
    assert result["status"] == "failed"
    assert result["error_code"] == "http_error"
    assert "HTTP 502" in result["error"]


def test_unreachable_daemon_is_a_failure(short_dir: Path) -> None:
    result = tool.call_run({"task": "x"}, str(short_dir / "missing.sock"))
    assert result["status"] == "failed"
    assert result["error_code"] == "daemon_unreachable"
    assert "CODELEGATE_SOCKET" in result["error"]


def test_a_timeout_that_is_not_a_positive_number_is_refused() -> None:
    for timeout in (0, -1, True, "60"):
        result = tool.delegate("x", timeout=timeout)  # type: ignore[arg-type]
        assert result["status"] == "refused"
        assert result["error_code"] == "bad_request"


def test_socket_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CODELEGATE_SOCKET", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert tool.socket_path() == str(tmp_path / "codelegate" / "codelegate.sock")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tool.socket_path() == str(tmp_path / ".local/state/codelegate/codelegate.sock")
    monkeypatch.setenv("CODELEGATE_SOCKET", "/run/codelegate/codelegate.sock")
    assert tool.socket_path() == "/run/codelegate/codelegate.sock"
    assert tool.socket_path("/x.sock") == "/x.sock"


def _held_run(fake: FakeDaemon, *, announce: bool, headers_sent: threading.Event) -> Any:
    """A run that answers only once cancelled, like a long Claude Code run."""

    async def handler(request: web.Request) -> web.StreamResponse:
        headers = {tool.RUN_ID_HEADER: RUN_ID} if announce else {}
        response = web.StreamResponse(headers={**headers, "Content-Type": "application/json"})
        await response.prepare(request)  # sends the headers now, before the body
        headers_sent.set()
        await fake.cancel_seen.wait()
        await response.write(json.dumps({**FINAL, "status": "cancelled"}).encode())
        await response.write_eof()
        return response

    fake.events = _stream(CARD, final={**FINAL, "status": "cancelled"}, hold=fake.cancel_seen)
    return handler


async def test_agent_stop_cancels_an_announced_run(fake_daemon: FakeDaemon) -> None:
    headers_sent = threading.Event()
    fake_daemon.post_run = _held_run(fake_daemon, announce=True, headers_sent=headers_sent)

    result = await asyncio.to_thread(
        tool.call_run,
        {"task": "x"},
        fake_daemon.socket,
        # The agent presses Stop once the run is under way.
        cancelled=headers_sent.is_set,
        poll_s=0.01,
    )

    assert fake_daemon.cancelled == [RUN_ID]
    # The daemon's own cancelled result, with the session id to resume from.
    assert result["status"] == "cancelled"
    assert result["session_id"] == SESSION


async def test_a_run_past_its_timeout_is_cancelled_and_says_timeout(
    fake_daemon: FakeDaemon,
) -> None:
    fake_daemon.post_run = _held_run(fake_daemon, announce=True, headers_sent=threading.Event())

    result = await asyncio.to_thread(
        tool.call_run, {"task": "x"}, fake_daemon.socket, timeout_s=0.05, poll_s=0.01
    )

    assert fake_daemon.cancelled == [RUN_ID]
    assert result["status"] == "timeout"
    assert "timed out" in result["error"]
    assert result["session_id"] == SESSION


async def test_agent_stop_hangs_up_when_the_run_id_is_unknown(fake_daemon: FakeDaemon) -> None:
    never = asyncio.Event()
    posted = threading.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        posted.set()
        await never.wait()
        raise AssertionError("unreachable")

    fake_daemon.post_run = silent
    result = await asyncio.to_thread(
        tool.call_run, {"task": "x"}, fake_daemon.socket, cancelled=posted.is_set, poll_s=0.01
    )
    await asyncio.wait_for(fake_daemon.disconnected.wait(), 10)
    assert result["status"] == "cancelled"
    assert result["run_id"] is None
    assert fake_daemon.cancelled == []


async def test_keyboard_interrupt_cancels_and_propagates(
    fake_daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_daemon.post_run = _held_run(fake_daemon, announce=True, headers_sent=threading.Event())

    def interrupt(self: Any, wait_s: float) -> Any:
        raise KeyboardInterrupt  # Ctrl-C while the tool follows the run

    monkeypatch.setattr(tool_follow.EventStream, "frames", interrupt)
    with pytest.raises(KeyboardInterrupt):
        await asyncio.to_thread(
            tool.call_run, {"task": "x"}, fake_daemon.socket, cancelled=lambda: False
        )
    assert fake_daemon.cancelled == [RUN_ID]


async def test_a_follower_the_daemon_closes_resumes_after_the_last_frame(
    fake_daemon: FakeDaemon,
) -> None:
    second = {**CARD, "seq": 2, "tool_id": "claude:t2"}
    calls: list[str] = []

    async def lagging(request: web.Request) -> web.StreamResponse:
        calls.append(request.query["after"])
        if len(calls) == 1:  # the hub closed a lagging subscriber: the stream just ends
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(_ndjson(CARD) + b'{"type": "tool_ca')
            await response.write_eof()
            return response
        return await _stream(CARD, second)(request)

    fake_daemon.post_run = _answer(FINAL, announce=True)
    fake_daemon.events = lagging
    seen: list[dict[str, Any]] = []
    relay = tool_follow.Relay(None)
    relay.frame = seen.append  # type: ignore[method-assign]

    result = await asyncio.to_thread(tool.call_run, {"task": "x"}, fake_daemon.socket, relay=relay)

    assert calls == ["0", "1"]
    assert [f["tool_id"] for f in seen] == ["claude:t1", "claude:t2"]
    assert result["status"] == "completed"


async def test_without_its_frames_the_tool_still_returns_the_result(
    fake_daemon: FakeDaemon,
) -> None:
    async def missing(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"code": "run_not_found"}}, status=404)

    fake_daemon.post_run = _answer(FINAL, announce=True)
    fake_daemon.events = missing
    result = await asyncio.to_thread(tool.call_run, {"task": "x"}, fake_daemon.socket)
    assert result["status"] == "completed"
    assert result["session_id"] == SESSION


def _dropped(fake: FakeDaemon) -> None:
    """A daemon that goes away mid-run: the POST answers its headers and hangs up, the events
    stream gives a card naming the session and ends, again and again, with no run_result."""

    async def post_run(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={tool.RUN_ID_HEADER: RUN_ID})
        await response.prepare(request)
        assert request.transport is not None
        request.transport.close()
        return response

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        if request.query.get("after") == "0":
            await response.write(_ndjson({**CARD, "child_session_id": SESSION}))
        await response.write_eof()
        return response

    fake.post_run, fake.events = post_run, events


async def test_a_daemon_gone_mid_run_is_unreachable_not_cancelled_and_keeps_the_session(
    fake_daemon: FakeDaemon,
) -> None:
    _dropped(fake_daemon)
    result = await asyncio.to_thread(
        tool.call_run, {"task": "x"}, fake_daemon.socket, cancelled=lambda: False, poll_s=0.01
    )
    assert result["status"] == "failed"
    assert result["error_code"] == "daemon_unreachable"
    assert "went away" in result["error"]
    assert (result["run_id"], result["session_id"]) == (RUN_ID, SESSION)
    assert fake_daemon.cancelled == []  # nobody stopped it


async def test_a_daemon_back_before_the_tool_asks_has_the_last_word_on_the_run(
    fake_daemon: FakeDaemon,
) -> None:
    _dropped(fake_daemon)
    interrupted = {**FINAL, "status": "interrupted", "error": "the daemon stopped"}
    fake_daemon.states[RUN_ID] = {"status": "interrupted", "result": interrupted}
    result = await asyncio.to_thread(tool.call_run, {"task": "x"}, fake_daemon.socket)
    assert result["status"] == "interrupted"
    assert (result["run_id"], result["session_id"]) == (RUN_ID, SESSION)


async def test_a_stop_whose_cancelled_result_never_comes_keeps_the_session(
    fake_daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    headers_sent, never = threading.Event(), asyncio.Event()

    async def post_run(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={tool.RUN_ID_HEADER: RUN_ID})
        await response.prepare(request)
        headers_sent.set()
        await never.wait()
        return response

    fake_daemon.post_run = post_run
    fake_daemon.events = _stream({**CARD, "child_session_id": SESSION}, hold=never)
    # How long the tool gives the daemon's cancelled result; it never comes here.
    monkeypatch.setattr(tool_follow, "CANCEL_WAIT_S", 0.05)
    monkeypatch.setattr(tool, "CANCEL_WAIT_S", 0.05)
    result = await asyncio.to_thread(
        tool.call_run, {"task": "x"}, fake_daemon.socket, cancelled=headers_sent.is_set
    )
    never.set()
    assert fake_daemon.cancelled[:1] == [RUN_ID]
    assert result["status"] == "cancelled"
    assert (result["run_id"], result["session_id"]) == (RUN_ID, SESSION)


def test_a_stream_the_daemon_resets_mid_way_ends_as_at_eof(short_dir: Path) -> None:
    """A daemon killed with part of our request unread resets the socket: the frames it sent
    still come, then the stream is over (the follower reconnects or finds the daemon gone)."""
    path = str(short_dir / "reset.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        stream = tool_stream.EventStream(path, RUN_ID, 0, 5.0)
        try:
            peer, _ = server.accept()
            peer.recv(8)  # the rest of the request stays unread: close() resets
            peer.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + _ndjson(CARD))
            peer.close()
            assert stream.frames(5.0) == [CARD]
            assert stream.frames(5.0) is None
        finally:
            stream.close()


async def test_a_wait_for_an_answer_ends_when_the_daemon_goes_away(
    fake_daemon: FakeDaemon,
) -> None:
    """The daemon dies while a person is asked: the request died with it, so the wait ends
    (nothing posted, nothing cancelled) and the tool goes on to find the daemon gone."""

    async def gone(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        os.unlink(fake_daemon.socket)  # nothing listens there any more
        await response.write_eof()
        return response

    fake_daemon.events = gone
    closed = threading.Event()
    with _request_watch(fake_daemon.socket, closed) as watch:
        assert await asyncio.to_thread(closed.wait, 10)
    assert watch.over == "resolved"
    assert fake_daemon.cancelled == []


def test_a_wait_for_an_answer_ends_when_the_daemon_is_gone_before_its_watch_starts(
    short_dir: Path,
) -> None:
    closed = threading.Event()
    with _request_watch(str(short_dir / "gone.sock"), closed) as watch:
        assert closed.wait(10)
    assert watch.over == "resolved"


def test_a_wait_for_an_answer_ends_when_the_daemon_hangs_up_on_its_watch_unanswered(
    short_dir: Path,
) -> None:
    path, closed = str(short_dir / "dying.sock"), threading.Event()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        with _request_watch(path, closed) as watch:
            peer, _ = server.accept()
            peer.close()  # killed before it answered the watch's request
            assert closed.wait(10)
    assert watch.over == "resolved"


def _request_watch(path: str, closed: threading.Event) -> tool_wait.Watch:
    """The watch of a person's answer to request ``req-1``; its closing answer sets ``closed``."""
    frame = {"run_id": RUN_ID, "request_id": "req-1", "seq": 3}
    event = {"type": "approval_needed", "id": "req-1"}
    return tool_wait.Watch(path, frame, event, lambda _: closed.set(), None, 0.01, None)


async def test_health(fake_daemon: FakeDaemon, short_dir: Path) -> None:
    assert await asyncio.to_thread(tool.health, fake_daemon.socket)
    assert await asyncio.to_thread(tool.main, ["health", fake_daemon.socket]) == 0
    fake_daemon.healthy = False
    assert not await asyncio.to_thread(tool.health, fake_daemon.socket)
    assert tool.main(["health", str(short_dir / "missing.sock")]) == 1
    assert tool.main([]) == 2


async def test_cancel_run(fake_daemon: FakeDaemon) -> None:
    assert await asyncio.to_thread(tool.cancel_run, RUN_ID, fake_daemon.socket)
    assert fake_daemon.cancelled == [RUN_ID]


async def test_stop_aimed_at_this_invocation_cancels_it(
    fake_daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ConnectOnion's Work Room Stop names the invocation; the tool polls the agent's IO."""
    monkeypatch.setenv("CODELEGATE_SOCKET", fake_daemon.socket)
    headers_sent = threading.Event()
    fake_daemon.post_run = _held_run(fake_daemon, announce=True, headers_sent=headers_sent)
    asked: list[str] = []

    class IO:
        def is_cancelled(self) -> bool:
            return False

        def is_provider_cancelled(self, invocation: str) -> bool:
            asked.append(invocation)
            return headers_sent.is_set()

    class Agent:
        def __init__(self) -> None:
            self.current_session = {"_active_tool_call_id": "call_7", "session_id": "chat-1"}
            self.io = IO()

    result = json.loads(await asyncio.to_thread(claude_code, "x", agent=Agent()))

    assert result["status"] == "cancelled"
    assert fake_daemon.cancelled == [RUN_ID]
    assert set(asked) == {"claude_code:call_7"}
    body = fake_daemon.requests[0][2]
    assert body["parent"] == {"tool_call_id": "call_7", "session_id": "chat-1"}


def test_no_parent_without_an_active_tool_call() -> None:
    class Idle:
        def __init__(self) -> None:
            self.current_session = {"session_id": "chat-1"}
            self.io = None

    assert tool._parent_of(Idle()) is None
    assert tool._parent_of(None) is None
    assert tool._cancellation_check(Idle()) is None


def test_a_work_room_follow_up_continues_the_invocation_it_was_typed_into() -> None:
    class FollowUp:
        def __init__(self) -> None:
            self.current_session = {
                "_active_tool_call_id": "manual_claude_code_1.5",
                "_provider_continuation_of": "claude_code:call_1",
            }

    assert tool._parent_of(FollowUp()) == {"tool_call_id": "call_1"}


class _IO:
    def __init__(self, fail: bool = False) -> None:
        self.live: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        self.logged: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def send_live_trace(self, entry: dict[str, Any]) -> bool:
        if self.fail:
            raise RuntimeError("transport gone")
        self.live.append(entry)
        return True

    def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)

    def log(self, kind: str, **fields: Any) -> None:
        self.logged.append((kind, fields))


class _Agent:
    def __init__(self, io: Any, session: Any = None) -> None:
        self.io = io
        self.current_session = {"trace": []} if session is None else session
        self.printed: list[str] = []
        self.logger = self

    def _record_trace(self, entry: dict[str, Any]) -> None:
        self.current_session["trace"].append(entry)

    def print(self, message: str) -> None:
        self.printed.append(message)


def test_the_relay_records_then_streams_live_and_keeps_daemon_frames_to_itself() -> None:
    io = _IO()
    agent = _Agent(io)
    relay = tool_follow.Relay(agent)
    for frame in (CARD, {"type": "diagnostic", "seq": 2}, {"type": "run_result", "seq": 3}):
        relay.frame(dict(frame))
    assert agent.current_session["trace"] == [CARD]
    assert io.live == [CARD]
    assert io.sent == []
    assert io.logged == []
    assert agent.printed == []


def test_without_a_session_the_relay_logs_through_the_io() -> None:
    io = _IO()
    relay = tool_follow.Relay(_Agent(io, session="not a session"))
    relay.frame(dict(CARD))
    assert io.logged == [("tool_call", {k: v for k, v in CARD.items() if k != "type"})]


def test_a_local_agent_sees_each_card_on_its_console() -> None:
    agent = _Agent(None)
    relay = tool_follow.Relay(agent)
    relay.frame({**CARD, "summary": "Run: ls [x]"})
    relay.frame({**CARD, "type": "tool_result", "seq": 2, "status": "completed", "timing_ms": 1500})
    relay.frame({**CARD, "type": "tool_result", "seq": 3, "status": "failed", "error": "boom"})
    relay.frame({"type": "provider_message", "role": "assistant", "text": "All done.\nMore."})
    relay.prompt("run-1", "the prompt", {"tool_call_id": "call_1"})  # the user's: not echoed
    relay.frame({"type": "provider_activity", "seq": 5})
    assert agent.printed == [
        "  ⎿ Claude Code › Bash  Run: ls \\[x]",
        "  ✓ Claude Code › Bash (1.5s)",
        "  ✗ Claude Code › Bash: boom",
        "  Claude Code: All done.",
    ]


def test_the_prompt_opens_the_work_rooms_conversation() -> None:
    io = _IO()
    agent = _Agent(io)
    relay = tool_follow.Relay(agent)
    relay.prompt("run-1", "  Fix it.\x00 ", {"tool_call_id": "call_1"})
    relay.prompt("run-1", "x" * 20000, {"tool_call_id": "call_1"})
    relay.prompt("run-1", "   ", {"tool_call_id": "call_1"})  # nothing to show
    relay.prompt("run-1", "Fix it.", None)  # no Work Room
    first, long = io.live
    assert first == {
        "type": "provider_message",
        "provider": "claude_code",
        "invocationId": "claude_code:call_1",
        "parentToolCallId": "call_1",
        "messageId": "user:run-1",
        "role": "user",
        "text": "Fix it.",
    }
    assert len(long["text"]) == 16000


def test_a_failing_io_never_loses_the_run() -> None:
    relay = tool_follow.Relay(_Agent(_IO(fail=True)))
    relay.frame(dict(CARD))
    assert relay.failures == 1


def test_a_follow_up_acknowledges_its_turn_once() -> None:
    io = _IO()
    session = {
        "trace": [],
        "_provider_direct_message_id": "req-1",
        "_provider_continuation_of": "claude_code:call_1",
        "_provider_direct_state_revision": 4,
    }
    relay = tool_follow.Relay(_Agent(io, session))
    relay.frame(dict(CARD))
    relay.frame({**CARD, "seq": 2})
    assert io.sent == [
        {
            "type": "PROVIDER_INPUT_ACK",
            "requestId": "req-1",
            "invocationId": "claude_code:call_1",
            "accepted": True,
            "stateRevision": 4,
        }
    ]
    assert session["_provider_direct_acknowledged"] is True
