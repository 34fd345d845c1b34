"""Frame streams to clients: NDJSON (``/v1/runs/{id}/events``) and WebSocket (``/v1/ws``).

Each connection is one hub :class:`Subscriber` with its own writer task; the handler only reads
the client's messages. When the hub closes a subscriber (it lagged, or the daemon is going
away) the handler stops reading and closes the WebSocket itself with the hub's code, so the
close handshake can wait for the client's answer even while the writer is stuck behind a
client that stopped reading.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

import msgspec
from aiohttp import WSMsgType, web

from daemon.hub import Delivery, Hub, Subscriber
from daemon.runs import RunManager
from daemon.state import CONFIG, HUB, METRICS, STATE, int_query, manager_of
from daemon.tasks import spawn
from policy.errors import PolicyError

_WS_MAX_MESSAGE: Final = 64 * 1024
# How long a closed subscriber's client gets to read what is in flight and answer the close.
_WS_CLOSE_TIMEOUT: Final = 60.0


async def run_events(request: web.Request) -> web.StreamResponse:
    """``GET /v1/runs/{id}/events?after=``: NDJSON replay, then live, ending after run_result."""
    manager = manager_of(request.app)
    config = request.app[CONFIG]
    run_id = request.match_info["run_id"]
    after = int_query(request, "after", 0, 0, 2**53)
    sub = Subscriber(max_queue=config.limits.subscriber_queue, name=f"ndjson:{run_id}")
    hub = request.app[HUB]
    hub.attach(sub)
    try:
        kind = await manager.subscribe(sub, run_id, after)
        if kind == "unknown":
            raise PolicyError(404, "run_not_found", "no run with that id")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            await _stream_ndjson(response, sub, finished=kind == "finished")
            await response.write_eof()
        return response
    finally:
        hub.detach(sub)


async def _stream_ndjson(response: web.StreamResponse, sub: Subscriber, *, finished: bool) -> None:
    if finished:  # the whole replay is queued already and nothing live will follow
        items = sub.take()
        await response.write(b"".join(i.data + b"\n" for i in items if isinstance(i, Delivery)))
        return
    while items := await sub.get():
        frames = [item for item in items if isinstance(item, Delivery)]
        await response.write(b"".join(d.data + b"\n" for d in frames))
        if any(d.last for d in frames):
            return
    # Closed: lagging or shutting down. The stream just ends; the client resumes with after=.


class _Subscribe(msgspec.Struct, tag="subscribe", forbid_unknown_fields=True):
    run: str
    after: int = 0


class _Unsubscribe(msgspec.Struct, tag="unsubscribe", forbid_unknown_fields=True):
    run: str


_control_decoder: Final = msgspec.json.Decoder(_Subscribe | _Unsubscribe)


def _control_error(code: str, message: str) -> bytes:
    return msgspec.json.encode({"type": "error", "error": {"code": code, "message": message}})


async def websocket(request: web.Request) -> web.StreamResponse:
    """``GET /v1/ws?run=<id|*>&after=``: frames over WebSocket; subscribe/unsubscribe messages."""
    manager = manager_of(request.app)
    hub, state = request.app[HUB], request.app[STATE]
    config = request.app[CONFIG]
    if state.stopping:
        raise PolicyError(503, "shutting_down", "the daemon is shutting down")
    after = int_query(request, "after", 0, 0, 2**53)
    sub = Subscriber(max_queue=config.limits.subscriber_queue, name="ws")
    hub.attach(sub)
    try:
        # Subscribe before the handshake answers: a client that connects and then starts a run
        # cannot miss its first frames, and an unknown run is still a plain 404.
        run_id = request.query.get("run")
        if run_id == "*":
            manager.follow_all(sub, after)
        elif run_id and await manager.subscribe(sub, run_id, after) == "unknown":
            raise PolicyError(404, "run_not_found", "no run with that id")
        ws = web.WebSocketResponse(
            heartbeat=30.0, max_msg_size=_WS_MAX_MESSAGE, timeout=_WS_CLOSE_TIMEOUT
        )
        await ws.prepare(request)
    except BaseException:
        hub.detach(sub)
        raise
    request.app[METRICS].ws_connections += 1
    state.websockets.add(ws)
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    sub.on_close = lambda: None if closed.done() else closed.set_result(None)
    writer = spawn(_ws_writer(ws, sub), name="ws-writer")
    reader = spawn(_ws_reader(ws, manager, hub, sub), name="ws-reader")
    try:
        await asyncio.wait({reader, closed}, return_when=asyncio.FIRST_COMPLETED)
        if not reader.done() and sub.close_code not in (None, 1000):
            # The hub closed us. Stop reading first: aiohttp waits for the client's close
            # answer only when no receive() is pending. The close frame queues behind the
            # frames in flight (no drain: the writer may be stuck behind this very client).
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            with contextlib.suppress(ConnectionResetError):
                await ws.close(
                    code=sub.close_code or 1000, message=sub.close_reason.encode(), drain=False
                )
    finally:
        reader.cancel()
        hub.detach(sub)
        state.websockets.discard(ws)
        if not sub.closed:
            sub.close(1000, "")
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
            await writer
    return ws


async def _ws_reader(
    ws: web.WebSocketResponse, manager: RunManager, hub: Hub, sub: Subscriber
) -> None:
    """The client's messages: subscribe / unsubscribe."""
    async for msg in ws:
        if msg.type == WSMsgType.TEXT:
            await _ws_control(manager, hub, sub, msg.data)
        elif msg.type == WSMsgType.BINARY:
            sub.control(_control_error("bad_message", "send JSON text messages"))


async def _ws_control(manager: RunManager, hub: Hub, sub: Subscriber, data: str) -> None:
    try:
        message = _control_decoder.decode(data)
    except msgspec.DecodeError as exc:
        sub.control(_control_error("bad_message", str(exc)[:200]))
        return
    if isinstance(message, _Unsubscribe):
        hub.unsubscribe(sub, message.run)
        return
    if message.after < 0:
        sub.control(_control_error("bad_message", "after must be >= 0"))
        return
    if message.run == "*":
        hub.unsubscribe(sub, "*")
        manager.follow_all(sub, message.after)
    else:
        hub.unsubscribe(sub, message.run)
        if await manager.subscribe(sub, message.run, message.after) == "unknown":
            sub.control(_control_error("run_not_found", "no run with that id"))
            return
    sub.control(msgspec.json.encode({"type": "subscribed", "run": message.run}))


async def _ws_writer(ws: web.WebSocketResponse, sub: Subscriber) -> None:
    """This client's own writer: a slow client only ever waits here, never in the run."""
    with contextlib.suppress(ConnectionResetError):
        while items := await sub.get():
            for item in items:
                if isinstance(item, bytes):
                    await ws.send_frame(item, WSMsgType.TEXT)
                else:
                    await ws.send_frame(item.data, WSMsgType.TEXT)
                    sub.sent(item)
