"""Fixtures for the ops tests: a tiny stand-in daemon on a Unix socket.

The stand-in speaks just enough of the HTTP API (DESIGN.md, "HTTP API") for the clients in
daemon/clients/tool.py and daemon/clients/terminal.py; its answers are scripted per test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSCloseCode, web

from codelegate.translator.frames import encode_frame

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class FakeDaemon:
    """Records what clients sent; tests install handlers for the routes they exercise."""

    socket: str
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    cancel_seen: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    post_run: Handler | None = None
    events: Handler | None = None
    healthy: bool = True
    ws_frames: list[Any] = field(default_factory=list)
    ws_query: dict[str, str] = field(default_factory=dict)
    # GET /v1/runs/{id}: the runs this stand-in knows (others are run_not_found).
    states: dict[str, dict[str, Any]] = field(default_factory=dict)


@pytest.fixture
async def fake_daemon(short_dir: Path) -> AsyncIterator[FakeDaemon]:
    daemon = FakeDaemon(socket=str(short_dir / "d.sock"))

    async def post_run(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        daemon.requests.append(("POST", request.path, body))
        assert daemon.post_run is not None, "test did not script POST /v1/runs"
        try:
            return await daemon.post_run(request)
        except asyncio.CancelledError:
            # handler_cancellation=True: the client hung up while we were still answering.
            daemon.disconnected.set()
            raise

    async def cancel(request: web.Request) -> web.StreamResponse:
        daemon.requests.append(("POST", request.path, None))
        daemon.cancelled.append(request.match_info["run_id"])
        daemon.cancel_seen.set()
        return web.json_response({"run_id": request.match_info["run_id"]}, status=202)

    async def events(request: web.Request) -> web.StreamResponse:
        daemon.requests.append(("GET", request.path_qs, None))
        assert daemon.events is not None, "test did not script the events stream"
        return await daemon.events(request)

    async def websocket(request: web.Request) -> web.StreamResponse:
        # Sends the scripted frames, then closes as a stopping daemon would (GOING_AWAY).
        daemon.ws_query = dict(request.query)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        for frame in daemon.ws_frames:
            await ws.send_str(encode_frame(frame).decode())
        await ws.close(code=WSCloseCode.GOING_AWAY)
        return ws

    async def state(request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        if run_id not in daemon.states:
            error = {"code": "run_not_found", "message": f"no run {run_id}"}
            return web.json_response({"error": error}, status=404)
        return web.json_response({"run_id": run_id, **daemon.states[run_id]})

    async def healthz(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": daemon.healthy}, status=200 if daemon.healthy else 503)

    app = web.Application()
    app.router.add_post("/v1/runs", post_run)
    app.router.add_post("/v1/runs/{run_id}/cancel", cancel)
    app.router.add_get("/v1/runs/{run_id}/events", events)
    app.router.add_get("/v1/runs/{run_id}", state)
    app.router.add_get("/v1/ws", websocket)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.UnixSite(runner, daemon.socket).start()
    try:
        yield daemon
    finally:
        await runner.cleanup()
