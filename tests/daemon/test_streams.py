"""The WebSocket writer on a real connection: the hub's direct path and aiohttp's own path."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from codelegate.daemon.deliveries import Delivery
from codelegate.daemon.hub import Hub
from codelegate.daemon.serving.streams import _ws_writer, _WsSink
from codelegate.daemon.subscriber import Subscriber
from tests.test_layout import MODULES, imports

RUN = "r1"


def _frame(seq: int, size: int = 10) -> Delivery:
    return Delivery(RUN, seq, b'{"seq":%d,"pad":"%s"}' % (seq, b"x" * size))


async def _serve(compress: bool, hub: Hub, sinks: list[bool]) -> TestClient[Any, Any]:
    async def handler(request: web.Request) -> web.WebSocketResponse:
        sub = Subscriber(max_queue=10_000)
        hub.join(sub, RUN, [_frame(1), _frame(2)])  # a replay, before the handshake
        ws = web.WebSocketResponse(compress=compress)
        await ws.prepare(request)
        sinks.append(_WsSink.of(ws) is not None)
        sub.control(b'{"type":"subscribed"}')
        writer = asyncio.create_task(_ws_writer(ws, sub))
        async for _ in ws:
            pass
        sub.close(1000, "")
        await writer
        return ws

    app = web.Application()
    app.router.add_get("/ws", handler)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def _receive_all(ws: aiohttp.ClientWebSocketResponse, until: int) -> list[bytes]:
    got: list[bytes] = []
    while not got or not got[-1].startswith(b'{"seq":%d,' % until):
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        got.append(msg.data.encode())
    return got


async def _exchange(compress: bool) -> tuple[list[bytes], list[bool]]:
    hub = Hub()
    sinks: list[bool] = []
    client = await _serve(compress, hub, sinks)
    try:
        async with client.ws_connect("/ws", compress=15 if compress else 0) as ws:
            first = await _receive_all(ws, 2)
            assert (await ws.receive()).data == '{"type":"subscribed"}'
            # live: small and large frames (every header length), in a few batches
            hub.publish_batch(RUN, [_frame(3), _frame(4, 200)])
            hub.publish_batch(RUN, [_frame(5, 70_000)])
            hub.publish_batch(RUN, [_frame(s) for s in range(6, 506)])
            rest = await _receive_all(ws, 505)
        return first + rest, sinks
    finally:
        await client.close()


def _expected() -> list[bytes]:
    sizes = {4: 200, 5: 70_000}
    return [_frame(s, sizes.get(s, 10)).data for s in range(1, 506)]


async def test_uncompressed_websocket_is_written_with_shared_frame_bytes() -> None:
    got, sinks = await _exchange(compress=False)
    assert sinks == [True]
    assert got == _expected()


async def test_compressed_websocket_falls_back_to_aiohttp_frames() -> None:
    got, sinks = await _exchange(compress=True)
    assert sinks == [False]
    assert got == _expected()


def test_the_streams_reach_the_hub_only_through_the_door() -> None:
    # One door (daemon/subscriptions.py, the run manager's): not the hub, nor a run's log.
    name = "codelegate.daemon.serving.streams"
    reached = {module for _, module in imports(name, MODULES[name])}
    assert "codelegate.daemon.runs" in reached  # the manager, whose door it is
    assert not reached & {"codelegate.daemon.hub", "codelegate.daemon.runlog"}
