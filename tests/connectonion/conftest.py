"""A real ConnectOnion model loop around the daemon: a scripted OpenAI-compatible model on
loopback drives a ConnectOnion ``Agent`` whose IO is ConnectOnion's own ``WebSocketIO`` (the IO
its Host gives a hosted agent), and the agent's ``claude_code`` tool is ours, talking to the
daemon of ``tests/e2e`` (real pinned CLI, Anthropic API stub)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.e2e.conftest import E2E
from tests.stub.loopback import on_loopback

Reply = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
IO_TIMEOUT = 60.0


def call(name: str, call_id: str = "call_1", **arguments: Any) -> dict[str, Any]:
    """A model reply that calls one tool."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def say(text: str) -> dict[str, Any]:
    """A model reply that answers (ends the turn)."""
    return {"role": "assistant", "content": text}


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results a chat-completions request carries, in order."""
    return [m for m in request["messages"] if m.get("role") == "tool"]


@dataclass
class Model:
    """The scripted model: each ``/v1/chat/completions`` request gets the next reply."""

    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if not self.replies:
            return web.json_response({"error": {"message": "script exhausted"}}, status=500)
        reply = self.replies.pop(0)
        message = reply(body) if callable(reply) else reply
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def lead_agent(claude_code: object, model_url: str, tmp_path: Path) -> Any:
    """A real ConnectOnion Agent with the tool ``claude_code``, its model the scripted one at
    ``model_url``, its IO ConnectOnion's own WebSocketIO (as hosted)."""
    from connectonion import Agent
    from connectonion.network.io import WebSocketIO

    agent = Agent(
        "lead",
        tools=[claude_code],
        model="scripted-model",
        base_url=model_url,
        api_key="dummy",
        quiet=True,
        log=False,
        co_dir=tmp_path / ".co",
    )
    agent.io = WebSocketIO()
    return agent


@asynccontextmanager
async def serve_model(model: Model) -> AsyncIterator[Model]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", model._complete)
    async with on_loopback(app) as url:
        model.url = f"{url}/v1"
        yield model


@dataclass
class Loop:
    """The agent, its IO, the scripted model and the daemon (with its Claude stub)."""

    agent: Any
    io: Any
    model: Model
    e2e: E2E

    async def ask(self, prompt: str) -> str:
        """``agent.input(prompt)`` on a thread, as a Host runs it."""
        answer: str = await asyncio.to_thread(self.agent.input, prompt)
        return answer

    async def until(self, seen: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first event the agent sent to its IO for which ``seen`` holds (waits for it)."""

        async def scan() -> dict[str, Any]:
            # An independent reader of the IO's append-only log, as each Host device is.
            async for event in self.io.read_msgs_from_agent(start=0):
                if seen(event):
                    return dict(event)
            raise AssertionError("the IO finished without the event")

        return await asyncio.wait_for(scan(), IO_TIMEOUT)

    def events(self) -> list[dict[str, Any]]:
        """Everything the agent sent to its IO so far, in order."""
        return [dict(event) for event in self.io._msgs_from_agent]


@pytest.fixture
async def loop(e2e: E2E, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Loop]:
    """An agent with ``ClaudeCode(mode="accept_edits")`` working in the daemon's workspace."""
    from codelegate.daemon.clients.tool import SOCKET_ENV, ClaudeCode

    assert e2e.handle is not None
    assert e2e.handle.socket_path is not None
    monkeypatch.setenv(SOCKET_ENV, e2e.handle.socket_path)
    # cwd="" is the agent's working directory, as in ConnectOnion: the agent works there.
    monkeypatch.chdir(e2e.workspace)
    model = Model()
    async with serve_model(model):
        agent = lead_agent(ClaudeCode(mode="accept_edits"), model.url, tmp_path)
        yield Loop(agent, agent.io, model, e2e)
