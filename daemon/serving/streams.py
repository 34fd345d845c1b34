"""Frame streams to clients: NDJSON (``/v1/runs/{id}/events``) and WebSocket (``/v1/ws``).

Each connection is one hub :class:`Subscriber` with its own writer task; the handler only reads
the client's messages. A WebSocket that keeps up is written by the hub itself, through a
:class:`_WsSink`, once per write-out with the batch's shared frame bytes; its writer task only
writes replays, control messages, and what piles up while the client is slow.

When the hub closes a subscriber (it lagged, or the daemon is going away) the handler stops
reading and closes the WebSocket itself with the hub's code, so the close handshake can wait
for the client's answer even while the writer is stuck behind a client that stopped reading.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Final, Literal

import msgspec
from aiohttp import WSMsgType, web
from aiohttp.base_protocol import BaseProtocol

from codelegate.daemon.approvals import TEXT_CHARS, Answer, QuestionAnswer
from codelegate.daemon.deliveries import Batch, Item
from codelegate.daemon.runs import RunManager
from codelegate.daemon.serving.state import CONFIG, METRICS, STATE, int_query, manager_of
from codelegate.daemon.subscriber import Subscriber
from codelegate.daemon.tasks import spawn
from codelegate.policy.codes import BAD_MESSAGE, RUN_NOT_FOUND, SHUTTING_DOWN
from codelegate.policy.errors import PolicyError

_WS_MAX_MESSAGE: Final = 64 * 1024
# How long a closed subscriber's client gets to read what is in flight and answer the close.
_WS_CLOSE_TIMEOUT: Final = 60.0


async def run_events(request: web.Request) -> web.StreamResponse:
    """``GET /v1/runs/{id}/events?after=``: NDJSON replay, then live, ending after run_result."""
    door = manager_of(request.app).subscriptions
    config = request.app[CONFIG]
    run_id = request.match_info["run_id"]
    after = int_query(request, "after", 0, 0, 2**53)
    sub = Subscriber(max_queue=config.limits.subscriber_queue, name=f"ndjson:{run_id}")
    door.attach(sub)
    try:
        kind = await door.subscribe(sub, run_id, after)
        if kind == "unknown":
            raise PolicyError(RUN_NOT_FOUND, "no run with that id")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            await _stream_ndjson(response, sub, finished=kind == "finished")
            await response.write_eof()
        return response
    finally:
        door.detach(sub)


async def _stream_ndjson(response: web.StreamResponse, sub: Subscriber, *, finished: bool) -> None:
    # One write per wake-up, of at most a page: ``write`` waits while the client is behind, so a
    # replay goes out as fast as the client reads it and no faster (see daemon/hub.py).
    while not (finished and sub.idle):  # finished: the replay is all that will come
        items = await sub.get(sub.page)
        if sub.closed:
            # Lagging or shutting down. The stream just ends; the client resumes with after=.
            return
        if items:  # a batch's bytes are built once for every NDJSON client of the run
            await response.write(b"".join([item.ndjson for item in items]))
        if any(item.last for item in items):
            return


class _Subscribe(msgspec.Struct, tag="subscribe", forbid_unknown_fields=True):
    run: str
    after: int = 0


class _Unsubscribe(msgspec.Struct, tag="unsubscribe", forbid_unknown_fields=True):
    run: str


class _ApprovalResponse(msgspec.Struct, tag="APPROVAL_RESPONSE", forbid_unknown_fields=True):
    """O Chat's answer to an approval card; ``request_id`` is the approval_needed frame's id."""

    request_id: str
    approved: bool
    run: str | None = None  # else the run the request id names
    scope: Literal["once", "session"] = "once"
    mode: Literal["reject_soft", "reject_hard", "reject_explain"] | None = None
    feedback: Annotated[str, msgspec.Meta(max_length=TEXT_CHARS)] | None = None


class _AskUserResponse(msgspec.Struct, tag="ASK_USER_RESPONSE", forbid_unknown_fields=True):
    """An answer to an ask_user frame: ``answer`` for its first question, or ``answers``."""

    request_id: str
    run: str | None = None
    answer: Annotated[str, msgspec.Meta(max_length=TEXT_CHARS)] | None = None
    answers: dict[str, str] | None = None
    notes: dict[str, str] | None = None


_Message = _Subscribe | _Unsubscribe | _ApprovalResponse | _AskUserResponse
_control_decoder: Final = msgspec.json.Decoder(_Message)


def _control_error(code: str, message: str) -> bytes:
    return msgspec.json.encode({"type": "error", "error": {"code": code, "message": message}})


async def websocket(request: web.Request) -> web.StreamResponse:
    """``GET /v1/ws?run=<id|*>&after=``: frames over WebSocket; subscribe/unsubscribe messages."""
    manager = manager_of(request.app)
    door = manager.subscriptions  # the one door to runs' frames
    state = request.app[STATE]
    config = request.app[CONFIG]
    if state.stopping:
        raise PolicyError(SHUTTING_DOWN, "the daemon is shutting down")
    after = int_query(request, "after", 0, 0, 2**53)
    sub = Subscriber(max_queue=config.limits.subscriber_queue, name="ws")
    door.attach(sub)
    try:
        # Subscribe before the handshake answers: a client that connects and then starts a run
        # cannot miss its first frames, and an unknown run is still a plain 404.
        run_id = request.query.get("run")
        if run_id == "*":
            door.follow_all(sub, after)
        elif run_id and await door.subscribe(sub, run_id, after) == "unknown":
            raise PolicyError(RUN_NOT_FOUND, "no run with that id")
        # No permessage-deflate: every client gets the very same frame bytes (see _WsSink).
        ws = web.WebSocketResponse(
            heartbeat=30.0, max_msg_size=_WS_MAX_MESSAGE, timeout=_WS_CLOSE_TIMEOUT, compress=False
        )
        await ws.prepare(request)
    except BaseException:
        door.detach(sub)
        raise
    request.app[METRICS].ws_connections += 1
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    sub.on_close = lambda: None if closed.done() else closed.set_result(None)
    writer = spawn(_ws_writer(ws, sub), name="ws-writer")
    reader = spawn(_ws_reader(ws, manager, sub), name="ws-reader")
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
        door.detach(sub)
        if not sub.closed:
            sub.close(1000, "")
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
            await writer
    return ws


async def _ws_reader(ws: web.WebSocketResponse, manager: RunManager, sub: Subscriber) -> None:
    """The client's messages: subscribe / unsubscribe."""
    async for msg in ws:
        if msg.type == WSMsgType.TEXT:
            await _ws_control(manager, sub, msg.data)
        elif msg.type == WSMsgType.BINARY:
            sub.control(_control_error(BAD_MESSAGE, "send JSON text messages"))


async def _ws_control(manager: RunManager, sub: Subscriber, data: str) -> None:
    try:
        message = _control_decoder.decode(data)
    except msgspec.DecodeError as exc:
        sub.control(_control_error(BAD_MESSAGE, str(exc)[:200]))
        return
    door = manager.subscriptions
    if isinstance(message, _Unsubscribe):
        door.unsubscribe(sub, message.run)
        return
    if isinstance(message, _ApprovalResponse | _AskUserResponse):
        sub.control(await _answer(manager, message))
        return
    if message.after < 0:
        sub.control(_control_error(BAD_MESSAGE, "after must be >= 0"))
        return
    if message.run == "*":
        door.follow_all(sub, message.after)
    elif await door.subscribe(sub, message.run, message.after) == "unknown":
        sub.control(_control_error(RUN_NOT_FOUND, "no run with that id"))
        return
    sub.control(msgspec.json.encode({"type": "subscribed", "run": message.run}))


async def _answer(manager: RunManager, message: _ApprovalResponse | _AskUserResponse) -> bytes:
    """An answer that came over the WebSocket, carried out like its HTTP twin; the ack."""
    request_id = message.request_id
    run_id = message.run or request_id.rpartition(":")[0]
    run = manager.get(run_id)
    try:
        if run is None and await manager.state(run_id) is None:
            raise PolicyError(RUN_NOT_FOUND, "no run with that id")
        if isinstance(message, _ApprovalResponse):
            answer = Answer(
                approved=message.approved,
                scope=message.scope,
                mode=message.mode,
                feedback=message.feedback,
            )
            done = await manager.approvals.answer(run_id, run, request_id, answer)
        else:
            question = QuestionAnswer(
                answer=message.answer, answers=message.answers, notes=message.notes
            )
            done = await manager.approvals.answer_question(run_id, run, request_id, question)
    except PolicyError as exc:
        return _control_error(exc.code, exc.message)
    return msgspec.json.encode({"type": "approval_ack", "run": run_id, **done})


class _WsSink:
    """The WebSocket's transport, written with ready-made frames (the hub's direct path).

    Frames are whole and each ``write`` is one ``transport.write``, so they never interleave
    with the frames aiohttp writes itself (pings, pongs, the close frame). Nothing is written
    once aiohttp has begun closing (``ws.closed`` is set before it sends its close frame).
    """

    __slots__ = ("_protocol", "_transport", "_ws")

    def __init__(
        self, ws: web.WebSocketResponse, transport: asyncio.Transport, protocol: BaseProtocol
    ) -> None:
        self._ws = ws
        self._transport = transport
        self._protocol = protocol

    @classmethod
    def of(cls, ws: web.WebSocketResponse) -> _WsSink | None:
        """A sink for a prepared, uncompressed WebSocket; ``None`` where that is not available."""
        writer = ws._writer
        if writer is None or writer.compress or ws.compress:
            return None
        transport, protocol = writer.transport, writer.protocol
        if not isinstance(protocol, BaseProtocol) or transport.is_closing():
            return None
        return cls(ws, transport, protocol)

    def ready(self) -> bool:
        return not (
            self._protocol.writing_paused or self._ws.closed or self._transport.is_closing()
        )

    def write_batch(self, batch: Batch) -> bool:
        if not self.ready():
            return False
        self._transport.write(batch.ws)  # built once, for every WebSocket client of the run
        return True

    def closing(self) -> bool:
        """The connection is going: nothing more is written."""
        return self._ws.closed or self._transport.is_closing()

    def write(self, items: list[Item]) -> None:
        # A batch's bytes are built once, for every WebSocket client of the run.
        if len(items) == 1:
            self._transport.write(items[0].ws)
        else:
            self._transport.write(b"".join([item.ws for item in items]))

    async def drain(self) -> bool:
        """Wait until the client has read enough; False when the connection is going."""
        if self._ws.closed or self._transport.is_closing():
            return False
        if self._protocol.writing_paused:
            try:
                await self._protocol._drain_helper()
            except ConnectionError:
                return False
        return not (self._ws.closed or self._transport.is_closing())


async def _ws_writer(ws: web.WebSocketResponse, sub: Subscriber) -> None:
    """This client's own writer: a slow client only ever waits here, never in the run.

    While the client keeps up, the hub writes it out directly (``sub.sink``) and this task
    sleeps; it writes replays and control messages, and whatever piles up while the client's
    transport is paused, always everything queued in one write.
    """
    sink = _WsSink.of(ws)
    if sink is None:
        await _ws_writer_fallback(ws, sub)
        return
    sub.sink = sink
    try:
        while await sub.wait():
            if not sink.ready():
                if not await sink.drain():
                    return
            elif sub.replaying:
                # A page of a stored replay; live frames queue behind it meanwhile, so the hub
                # writes nothing directly until the replay is done.
                items = await sub.get(sub.page)
                if sub.closed or sink.closing():
                    return
                if items:
                    sink.write(items)
                    sub.sent(items[-1])
            else:
                # Take and write in one step, as the hub does: the two never reorder frames.
                sub.write_to(sink, sub.page)
    finally:
        sub.sink = None


async def _ws_writer_fallback(ws: web.WebSocketResponse, sub: Subscriber) -> None:
    """One frame at a time through aiohttp, for a connection without a usable transport."""
    with contextlib.suppress(ConnectionResetError):
        while True:
            items = await sub.get(sub.page)
            if sub.closed:
                return
            for item in items:
                for payload in item.payloads:
                    await ws.send_frame(payload, WSMsgType.TEXT)
                sub.sent(item)
