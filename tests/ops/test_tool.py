"""The thin ``claude_code`` tool: its ConnectOnion schema and its HTTP conversation."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from daemon import tool
from daemon.tool import claude_code

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
}


def _make_agent(tmp_path: Path) -> Any:
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
        tools=[claude_code],
        llm=NoLLM(),
        quiet=True,
        log=False,
        co_dir=tmp_path / ".co",
    )


def _answer(payload: dict[str, Any], status: int = 200) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(payload, status=status)

    return handler


def test_connectonion_derives_the_schema(tmp_path: Path) -> None:
    agent = _make_agent(tmp_path)
    schema = agent.tools.get("claude_code").to_function_schema()
    params = schema["parameters"]
    assert schema["name"] == "claude_code"
    assert "Claude Code" in schema["description"]
    assert "session_id" in schema["description"]
    assert params["properties"]["task"] == {"type": "string"}
    assert params["properties"]["mode"]["enum"] == ["safe", "accept_edits", "plan", "auto"]
    assert set(params["properties"]) >= {"task", "cwd", "mode", "session_id"}
    # ConnectOnion injects `agent`; the model never sees it.
    assert "agent" not in params["properties"]
    assert "task" in params["required"]
    assert "cwd" not in params["required"]


async def test_agent_call_links_the_parent_tool_call(
    fake_daemon: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODELEGATE_SOCKET", fake_daemon.socket)
    fake_daemon.post_run = _answer(FINAL)
    agent = _make_agent(tmp_path)

    outcome = await asyncio.to_thread(
        agent.execute_tool, "claude_code", {"task": "add a test", "mode": "accept_edits"}
    )

    assert outcome["status"] == "success"
    assert SESSION in outcome["result"]
    [(_, path, body)] = fake_daemon.requests
    assert path == "/v1/runs"
    assert body["task"] == "add a test"
    assert body["mode"] == "accept_edits"
    assert body["wait"] is True
    assert body["cwd"] == os.getcwd()
    assert "resume" not in body
    # Agent.execute_tool names its call "manual_<tool>_<time>"; a model's call has the LLM's id.
    assert body["parent"]["tool_call_id"].startswith("manual_claude_code_")


async def test_direct_call_returns_the_final_result(
    fake_daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODELEGATE_SOCKET", fake_daemon.socket)
    fake_daemon.post_run = _answer(FINAL)

    result = await asyncio.to_thread(claude_code, "continue", "/srv/ws", "safe", SESSION)

    assert result == FINAL
    body = fake_daemon.requests[0][2]
    assert body["resume"] == SESSION
    assert body["cwd"] == "/srv/ws"
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

    result = await asyncio.to_thread(claude_code, "x")

    assert result["status"] == expected
    assert result["error_code"] == code
    assert result["error"] == f"{code}: not here"
    assert result["http_status"] == status
    assert result["session_id"] is None
    assert result["files_changed"] == []


async def test_a_non_json_answer_is_a_failure(
    fake_daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODELEGATE_SOCKET", fake_daemon.socket)

    async def garbage(request: web.Request) -> web.StreamResponse:
        return web.Response(text="<html>", status=502)

    fake_daemon.post_run = garbage
    result = await asyncio.to_thread(claude_code, "x")
    assert result["status"] == "failed"
    assert result["error_code"] == "http_error"
    assert "HTTP 502" in result["error"]


def test_unreachable_daemon_is_a_failure(short_dir: Path) -> None:
    result = tool.call_run({"task": "x"}, str(short_dir / "missing.sock"))
    assert result["status"] == "failed"
    assert result["error_code"] == "daemon_unreachable"
    assert "CODELEGATE_SOCKET" in result["error"]


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
    real_wait = tool._wait_readable
    calls: list[int] = []

    def wait_then_interrupt(*args: Any) -> bool:
        # The first wait (for the headers) is real; Ctrl-C arrives during the second one.
        calls.append(1)
        if len(calls) == 1:
            return real_wait(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(tool, "_wait_readable", wait_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        await asyncio.to_thread(
            tool.call_run, {"task": "x"}, fake_daemon.socket, cancelled=lambda: False
        )
    assert fake_daemon.cancelled == [RUN_ID]


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

    result = await asyncio.to_thread(claude_code, "x", agent=Agent())

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
