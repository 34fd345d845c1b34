"""The stub itself speaks the Messages API shapes the CLI relies on (no CLI needed here)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from tests.stub.anthropic import Stub, Thinking, ToolUse, Turn, error, serve_stub, text, tools


def parse_sse(raw: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.strip().split("\n\n"):
        name, data = chunk.split("\n", 1)
        assert name.startswith("event: ")
        assert data.startswith("data: ")
        events.append((name[7:], json.loads(data[6:])))
    return events


def rebuild(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Assemble a message from its events, as an SDK client does."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for name, data in events:
        assert name == data["type"]
        if name == "message_start":
            message = {**data["message"], "content": []}
        elif name == "content_block_start":
            message["content"].append(dict(data["content_block"]))
        elif name == "content_block_delta":
            block, delta = message["content"][data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif name == "content_block_stop" and data["index"] in partial:
            message["content"][data["index"]]["input"] = json.loads(partial[data["index"]])
        elif name == "message_delta":
            message["stop_reason"] = data["delta"]["stop_reason"]
    assert events[-1][0] == "message_stop"
    return message


def body(prompt: str, stream: bool = True) -> dict[str, Any]:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": prompt}]}


async def post(http: aiohttp.ClientSession, url: str, data: Any) -> tuple[int, str]:
    async with http.post(f"{url}/v1/messages?beta=true", json=data) as resp:
        return resp.status, await resp.text()


async def test_streams_text_thinking_and_parallel_tool_uses() -> None:
    big = {"content": "x" * 500, "nested": {"n": [1, 2, 3]}}
    turn = tools(ToolUse("Read", {"file_path": "a"}), ToolUse("Write", big), say="Two tools.")
    turn.blocks.insert(0, Thinking("hmm " * 40))
    stub = Stub([turn])
    async with serve_stub(stub), aiohttp.ClientSession() as http:
        status, raw = await post(http, stub.url, body("go"))
    assert status == 200
    message = rebuild(parse_sse(raw))
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert message["content"][0]["thinking"] == "hmm " * 40
    assert message["content"][0]["signature"]
    assert message["content"][3]["input"] == big
    assert message["content"][2]["id"] != message["content"][3]["id"]
    assert message["stop_reason"] == "tool_use"
    assert stub.requests[0].query == "beta=true"


async def test_non_streaming_errors_fallback_and_probes() -> None:
    stub = Stub([error(529, "busy", times=2), text("hi")], fallback="nothing left")
    async with serve_stub(stub), aiohttp.ClientSession() as http:
        for _ in range(2):
            status, raw = await post(http, stub.url, body("go"))
            assert status == 529
            assert json.loads(raw)["error"]["type"] == "overloaded_error"
        status, raw = await post(http, stub.url, body("go", stream=False))
        assert json.loads(raw)["content"] == [{"type": "text", "text": "hi"}]
        assert json.loads(raw)["stop_reason"] == "end_turn"
        status, raw = await post(http, stub.url, body("go", stream=False))
        assert json.loads(raw)["content"][0]["text"] == "nothing left"
        async with http.post(f"{stub.url}/v1/messages/count_tokens", json=body("go")) as r:
            assert (await r.json())["input_tokens"] > 0
        async with http.get(f"{stub.url}/api/hello") as r:
            assert r.status == 404
    assert [r.script for r in stub.requests] == ["main"] * 4 + [None, None]
    assert stub.requests[-1].path == "/api/hello"


async def test_subagent_routing_hold_and_waiting() -> None:
    release = asyncio.Event()
    stub = Stub([Turn(text("late").blocks, hold=release)])
    stub.subagent("[[sub]]", [text("from the subagent")])
    async with serve_stub(stub), aiohttp.ClientSession() as http:
        status, raw = await post(http, stub.url, body("[[sub]] do it", stream=False))
        assert json.loads(raw)["content"][0]["text"] == "from the subagent"
        held = asyncio.ensure_future(post(http, stub.url, body("main")))
        request = await stub.wait_for_requests(1)
        assert request.history_text() == "main"
        assert not held.done()
        release.set()
        status, raw = await held
        assert status == 200
        assert rebuild(parse_sse(raw))["content"][0]["text"] == "late"
        async with http.get(stub.signal_url("ready")) as r:
            assert r.status == 200
        await stub.wait_for_signal("ready")
    assert [r.script for r in stub.model_requests] == ["[[sub]]", "main"]
