"""The daemon SIGKILLed before the tool has seen a single frame of the run: a real ConnectOnion
Agent (its IO ConnectOnion's WebSocketIO), driven by the scripted model, delegates to the real
daemon (a child process) with the pinned CLI. The tool's reading of the run is held back until
the kill (that is the only fault injected here), so that no frame can have named the session.

The model must get the session when the daemon said it (the tool asks as soon as the run has
an id), and a plain word when nothing said it: a new call starts a fresh session, and which run
to look up."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from codelegate.daemon.clients import tool, tool_follow, tool_result
from tests.connectonion.conftest import (
    Model,
    call,
    lead_agent,
    say,
    serve_model,
    tool_messages,
)
from tests.e2e.conftest import E2E
from tests.e2e.test_tool_e2e import killable
from tests.reliability.served import Served
from tests.stub.anthropic import Stub, Turn, text

pytestmark = pytest.mark.e2e
HOLD_S = 60.0  # how long a held connection of the tool may wait for the kill (a broken test)


@dataclass
class Killed:
    """The agent, the scripted model, the killable daemon and its stub; ``hold`` is where the
    tool's connections wait until the test has killed the daemon."""

    agent: Any
    model: Model
    daemon: Served
    stub: Stub
    hold: threading.Event

    async def ask(self, prompt: str) -> str:
        answer: str = await asyncio.to_thread(self.agent.input, prompt)
        return answer

    def envelopes(self) -> list[dict[str, Any]]:
        """The claude_code results the model was given, in order."""
        return [
            json.loads(tool_messages(request)[-1]["content"])
            for request in self.model.requests
            if tool_messages(request)
        ]


def held(hold: threading.Event, connect: Callable[..., Any]) -> Callable[..., Any]:
    def late(*args: Any, **kwargs: Any) -> Any:
        assert hold.wait(HOLD_S), "the test never killed the daemon"
        return connect(*args, **kwargs)

    return late


@asynccontextmanager
async def killed_agent(
    claude_bin: str, tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Killed]:

    hold = threading.Event()
    # The follower's first connection waits for the kill: no frame reaches the tool before.
    monkeypatch.setattr(tool_follow, "EventStream", held(hold, tool_follow.EventStream))
    async with killable(claude_bin, tmp_path, short_dir) as (daemon, stub, workspace):
        monkeypatch.chdir(workspace)
        async with serve_model(Model()) as model:
            claude_code = tool.ClaudeCode(mode="accept_edits", socket=str(short_dir / "d.sock"))
            agent = lead_agent(claude_code, model.url, tmp_path)
            try:
                yield Killed(agent, model, daemon, stub, hold)
            finally:
                hold.set()


async def kill_once_claude_asks(killed: Killed) -> dict[str, Any]:
    """The first turn: the model delegates, the CLI sends its first model request (its session
    is on disk), the daemon is SIGKILLed; the tool's envelope."""
    killed.stub.main.turns = [Turn(text("never sent").blocks, hold=asyncio.Event()), text("Back.")]
    killed.model.replies = [
        call("claude_code", prompt="Think it over.", cwd=""),
        say("The daemon went away."),
    ]
    turn = asyncio.ensure_future(killed.ask("Think it over."))
    await killed.stub.wait_for_requests(1)
    await killed.daemon.kill()
    killed.hold.set()
    assert await asyncio.wait_for(turn, HOLD_S) == "The daemon went away."
    [result] = killed.envelopes()
    assert (result["status"], result["error_code"]) == ("failed", "daemon_unreachable")
    return result


@pytest.mark.slow
async def test_a_daemon_killed_before_the_first_frame_still_leaves_the_session_to_resume(
    claude_bin: str, tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with killed_agent(claude_bin, tmp_path, short_dir, monkeypatch) as killed:
        result = await kill_once_claude_asks(killed)
        await killed.daemon.start()  # the restart closes the run as interrupted
        status, state = await killed.daemon.json("GET", f"/v1/runs/{result['run_id']}")
        killed.model.replies = [
            call("claude_code", "call_2", prompt="Go on.", session_id=result["session_id"]),
            lambda request: say(json.loads(tool_messages(request)[-1]["content"])["result"]),
        ]
        assert await asyncio.wait_for(killed.ask("Go on."), HOLD_S) == "Back."
    assert (status, state["status"]) == (200, "interrupted")
    assert result["session_id"] == state["session_id"]
    assert "this session_id resumes it" in result["error"]
    resumed = killed.envelopes()[-1]
    assert (resumed["status"], resumed["resumed"]) == ("completed", True)
    assert resumed["session_id"] == result["session_id"]


@pytest.mark.slow
async def test_a_daemon_killed_before_the_tool_learnt_the_session_says_a_retry_starts_afresh(
    claude_bin: str, tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with killed_agent(claude_bin, tmp_path, short_dir, monkeypatch) as killed:
        # The tool's question for the session waits for the kill too: nothing can tell it.
        monkeypatch.setattr(tool, "known_session", held(killed.hold, tool.known_session))
        result = await kill_once_claude_asks(killed)
        await killed.daemon.start()
        status, state = await killed.daemon.json("GET", f"/v1/runs/{result['run_id']}")
        killed.model.replies = [
            call("claude_code", "call_2", prompt="Start over."),
            lambda request: say(json.loads(tool_messages(request)[-1]["content"])["result"]),
        ]
        assert await asyncio.wait_for(killed.ask("Start over."), HOLD_S) == "Back."
    assert result["session_id"] == ""
    error = result["error"]
    assert "No session_id is known for it" in error
    assert "calling claude_code again starts a fresh Claude Code session" in error
    # The run id it names is the one to look up: the restarted daemon has it.
    assert f"GET /v1/runs/{result['run_id']}" in error
    assert (status, state["status"]) == (200, "interrupted")
    fresh = killed.envelopes()[-1]
    assert (fresh["status"], fresh["resumed"]) == ("completed", False)
    assert fresh["session_id"] not in ("", state["session_id"])


async def test_a_run_the_daemon_has_no_record_of_is_said_to_start_afresh(e2e: E2E) -> None:
    assert e2e.handle is not None
    assert e2e.handle.socket_path is not None
    run_id = str(uuid.uuid4())
    result = await asyncio.to_thread(tool_result.lost, e2e.handle.socket_path, run_id, "")
    assert (result["status"], result["error_code"], result["run_id"]) == (
        "failed",
        "daemon_unreachable",
        run_id,
    )
    assert "the daemon that serves now has no record of it" in result["error"]
    assert "calling claude_code again starts a fresh Claude Code session" in result["error"]
    assert result["session_id"] == ""
