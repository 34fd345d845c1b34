"""A loopback stand-in for the Anthropic Messages API, scripted by the test.

The real Claude Code CLI is pointed at it with ``ANTHROPIC_BASE_URL``. A test describes what "the
model" answers, turn by turn (`Turn`: text, thinking and tool_use blocks, or an HTTP error), and
the stub streams each answer as server-sent events exactly as the real API does, so the CLI runs
its real tools and prints its real stream-json.

Routing. The CLI sends more than the main conversation: subagents (the Task/Agent tool) talk to
the same endpoint with their own system prompt and history. Each `Script` may carry a *marker*: a
request whose first user message contains the marker is answered from that script (put the marker
in the Task tool's ``prompt``); every other request is answered from the main script. A script
that runs out answers with its ``fallback`` text, so an unexpected extra request never hangs.

A tool process can tell the test it is running by fetching `Stub.signal_url` (the test awaits
`Stub.wait_for_signal`), and `Stub.wait_for_requests` waits for the CLI's model calls: tests
synchronise on events, never on sleeps.

Every request is recorded (`Stub.requests`) with the script that answered it, so a test can check
what the CLI really sent, e.g. that a resumed session carries the first run's history.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from tests.stub.loopback import on_loopback

MODEL: Final = "claude-opus-5-5"
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class Text:
    """A text block of the model's answer."""

    text: str


@dataclass(frozen=True)
class Thinking:
    """An extended-thinking block (streamed with a signature, as the API does)."""

    thinking: str


@dataclass(frozen=True)
class ToolUse:
    """A tool_use block; several in one turn are parallel tool calls."""

    name: str
    input: dict[str, Any]
    id: str | None = None  # left out: the stub numbers them toolu_01…


Block = Text | Thinking | ToolUse


@dataclass
class Turn:
    """One answer of the model: blocks, or an HTTP error status.

    ``hold`` keeps the streamed answer open after ``message_start`` until the event is set (or the
    client goes away): a run that is "thinking" forever, for cancellation tests.
    ``times`` repeats an error turn (the CLI retries 5xx answers).
    """

    blocks: list[Block] = field(default_factory=list)
    status: int = 200
    error_message: str = "stub error"
    times: int = 1
    hold: asyncio.Event | None = None

    @property
    def stop_reason(self) -> str:
        return "tool_use" if any(isinstance(b, ToolUse) for b in self.blocks) else "end_turn"


def text(s: str) -> Turn:
    """A turn that only says ``s`` (ends the conversation)."""
    return Turn([Text(s)])


def tools(*uses: ToolUse, say: str | None = None) -> Turn:
    """A turn calling one or more tools (parallel when several), optionally with text first."""
    blocks: list[Block] = [Text(say)] if say else []
    blocks.extend(uses)
    return Turn(blocks)


def tool(name: str, say: str | None = None, **tool_input: Any) -> Turn:
    """A turn calling one tool."""
    return tools(ToolUse(name, dict(tool_input)), say=say)


def start_subagent(
    description: str,
    prompt: str,
    *,
    background: bool | None,
    subagent_type: str = "general-purpose",
) -> Turn:
    """A turn starting a subagent (the Agent tool); the stub routes the subagent's requests by a
    marker its ``prompt`` starts with (``Stub.subagent``). ``background`` None leaves
    ``run_in_background`` out, as a model may: the CLI then runs it in the background."""
    fields: dict[str, Any] = {
        "description": description,
        "prompt": prompt,
        "subagent_type": subagent_type,
    }
    if background is not None:
        fields["run_in_background"] = background
    return tool("Agent", **fields)


def error(status: int, message: str = "stub error", times: int = 1) -> Turn:
    """A turn answered with an HTTP error of the API's shape."""
    return Turn(status=status, error_message=message, times=times)


@dataclass
class Script:
    """The turns one conversation (the main one, or one subagent) receives, in order."""

    turns: list[Turn]
    marker: str | None = None
    fallback: str = "Done."
    served: int = 0

    def next_turn(self) -> Turn:
        while self.turns:
            turn = self.turns[0]
            if turn.times > 1:
                turn.times -= 1
                self.served += 1
                return turn
            self.served += 1
            return self.turns.pop(0)
        return text(self.fallback)


@dataclass(frozen=True)
class Request:
    """One HTTP request the CLI made, as the stub saw it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    script: str | None  # "main", the marker of a subagent script, or None (not a model call)

    @property
    def messages(self) -> list[dict[str, Any]]:
        body = self.body if isinstance(self.body, dict) else {}
        msgs = body.get("messages", [])
        return msgs if isinstance(msgs, list) else []

    @property
    def system_text(self) -> str:
        body = self.body if isinstance(self.body, dict) else {}
        return _flatten_text(body.get("system", ""))

    @property
    def tool_names(self) -> list[str]:
        body = self.body if isinstance(self.body, dict) else {}
        return [t.get("name", "") for t in body.get("tools", []) if isinstance(t, dict)]

    def history_text(self) -> str:
        """All text of the conversation so far (user and assistant, tool results included)."""
        return "\n".join(_flatten_text(m.get("content", "")) for m in self.messages)


def _flatten_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_flatten_text(v) for v in value)
    if isinstance(value, dict):
        parts = [str(value[k]) for k in ("text", "thinking") if isinstance(value.get(k), str)]
        if "input" in value:
            parts.append(json.dumps(value["input"]))
        if "content" in value:
            parts.append(_flatten_text(value["content"]))
        return "\n".join(parts)
    return ""


def _first_user_text(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "user":
            return _flatten_text(message.get("content", ""))
    return ""


class Stub:
    """The scripted API. Create it, add scripts, then serve it with `serve_stub`."""

    def __init__(self, main: Iterable[Turn] = (), *, fallback: str = "Done.") -> None:
        self.main = Script(list(main), fallback=fallback)
        self.subscripts: list[Script] = []
        self.requests: list[Request] = []
        self.url = ""
        self._ids = itertools.count(1)
        self._msg_ids = itertools.count(1)
        self._arrived = asyncio.Condition()
        self.signals: set[str] = set()
        self._held: list[asyncio.Event] = []

    def subagent(self, marker: str, turns: Iterable[Turn], fallback: str = "Done.") -> Script:
        """Answer requests whose first user message contains ``marker`` from ``turns``."""
        script = Script(list(turns), marker=marker, fallback=fallback)
        self.subscripts.append(script)
        return script

    @property
    def model_requests(self) -> list[Request]:
        return [r for r in self.requests if r.script is not None]

    def requests_of(self, script: str = "main") -> list[Request]:
        return [r for r in self.requests if r.script == script]

    async def wait_for_requests(self, count: int, script: str = "main") -> Request:
        """Wait until ``script`` has received ``count`` model requests; the last of them."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests_of(script)) >= count)
        return self.requests_of(script)[count - 1]

    def signal_url(self, name: str) -> str:
        """A URL a tool process can GET to say "I am here" (see `wait_for_signal`)."""
        return f"{self.url}/signal/{name}"

    async def wait_for_signal(self, name: str) -> None:
        """Wait until something fetched ``signal_url(name)``."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: name in self.signals)

    def route(self, body: dict[str, Any]) -> Script:
        first = _first_user_text(body.get("messages", []))
        for script in self.subscripts:
            if script.marker and script.marker in first:
                return script
        return self.main

    def tool_id(self) -> str:
        return f"toolu_01{next(self._ids):022d}"

    def message_id(self) -> str:
        return f"msg_01{next(self._msg_ids):022d}"

    # --- HTTP ---------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/signal/{name}", self._signal)
        app.router.add_route("*", "/{tail:.*}", self._other)
        return app

    async def _read_body(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _record(self, request: web.Request, body: Any, script: str | None) -> None:
        headers = {
            k.lower(): v
            for k, v in request.headers.items()
            if k.lower() in ("anthropic-beta", "anthropic-version", "user-agent", "x-app")
        }
        self.requests.append(
            Request(request.method, request.path, request.query_string, headers, body, script)
        )

    async def _other(self, request: web.Request) -> web.Response:
        self._record(request, await self._read_body(request), None)
        return web.json_response({}, status=404)

    async def _signal(self, request: web.Request) -> web.Response:
        self.signals.add(request.match_info["name"])
        async with self._arrived:
            self._arrived.notify_all()
        return web.json_response({})

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        self._record(request, body, None)
        return web.json_response({"input_tokens": max(1, len(json.dumps(body)) // 4)})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_body(request)
        if not isinstance(body, dict):
            self._record(request, body, None)
            return _error_response(400, "body must be a JSON object")
        script = self.route(body)
        self._record(request, body, script.marker or "main")
        async with self._arrived:
            self._arrived.notify_all()
        turn = script.next_turn()
        if turn.status != 200:
            return _error_response(turn.status, turn.error_message)
        message, content = self._message(body, turn)
        if not body.get("stream"):
            return web.json_response({**message, "content": content})
        return await self._stream(request, message, content, turn)

    def _message(
        self, body: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        content: list[dict[str, Any]] = []
        for block in turn.blocks:
            if isinstance(block, Text):
                content.append({"type": "text", "text": block.text})
            elif isinstance(block, Thinking):
                content.append(
                    {"type": "thinking", "thinking": block.thinking, "signature": "c3R1Yg=="}
                )
            else:
                content.append(
                    {
                        "type": "tool_use",
                        "id": block.id or self.tool_id(),
                        "name": block.name,
                        "input": block.input,
                    }
                )
        message = {
            "id": self.message_id(),
            "type": "message",
            "role": "assistant",
            "model": body.get("model", MODEL),
            "content": [],
            "stop_reason": turn.stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 10,
                "output_tokens": 5,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return message, content

    async def _stream(
        self,
        request: web.Request,
        message: dict[str, Any],
        content: list[dict[str, Any]],
        turn: Turn,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        start = {**message, "stop_reason": None, "usage": {**message["usage"], "output_tokens": 1}}
        await _send(response, "message_start", {"type": "message_start", "message": start})
        await _send(response, "ping", {"type": "ping"})
        if turn.hold is not None:
            self._held.append(turn.hold)
            await turn.hold.wait()
        for index, block in enumerate(content):
            for event in _block_events(index, block):
                await _send(response, event["type"], event)
        await _send(
            response,
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
        await _send(response, "message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    """content_block_start / _delta… / _stop for one block, split as the API splits them."""
    kind = block["type"]
    events: list[dict[str, Any]] = []
    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": c} for c in _chunks(block["text"])]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": c} for c in _chunks(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        raw = json.dumps(block["input"])
        deltas = [{"type": "input_json_delta", "partial_json": ""}]
        deltas += [{"type": "input_json_delta", "partial_json": c} for c in _chunks(raw)]
    events.append({"type": "content_block_start", "index": index, "content_block": start})
    events.extend({"type": "content_block_delta", "index": index, "delta": d} for d in deltas)
    events.append({"type": "content_block_stop", "index": index})
    return events


def _chunks(s: str, size: int = 64) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


async def _send(response: web.StreamResponse, event: str, data: dict[str, Any]) -> None:
    payload = f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
    await response.write(payload.encode())


def _error_response(status: int, message: str) -> web.Response:
    kind = _ERROR_TYPES.get(status, "api_error")
    return web.json_response(
        {"type": "error", "error": {"type": kind, "message": message}},
        status=status,
        headers={"request-id": "req_stub"},
    )


@asynccontextmanager
async def serve_stub(stub: Stub) -> AsyncIterator[Stub]:
    """Serve ``stub`` on 127.0.0.1 (a free port); ``stub.url`` is its base URL while open."""
    async with on_loopback(stub.app()) as url:
        stub.url = url
        try:
            yield stub
        finally:
            # Let held answers finish, so that shutting down does not wait for them to time out.
            for event in stub._held:
                event.set()
            for script in [stub.main, *stub.subscripts]:
                for turn in script.turns:
                    if turn.hold is not None:
                        turn.hold.set()
