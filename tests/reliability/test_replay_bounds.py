"""Replay is paced by the client: a client that never reads holds one page of a big finished
run, however often it repeats ``subscribe``; a non-reading NDJSON replay likewise.

What is measured is deterministic: the bytes the daemon holds for the client (its transport's
write buffer plus the frames queued for it) and the pages read from the store for it."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Callable

import msgspec

from codelegate.daemon.deliveries import REPLAY_PAGE_BYTES, Control, Delivery
from codelegate.daemon.serving.state import HUB, STATE
from codelegate.daemon.store.store import RunStore
from codelegate.daemon.subscriber import Subscriber
from tests.daemon.conftest import Daemon
from tests.polling import until
from tests.reliability.test_store_and_clients import _ndjson_start, _ws_handshake

FRAMES = 20_000
PAD = 1000  # ~1 KB a frame: a 20 MB run, ~80 pages
TRANSPORT_HIGH_WATER = 64 * 1024  # asyncio's default: writing pauses above it
PAGE_FRAMES = REPLAY_PAGE_BYTES // (PAD + 64)  # frames of ~1 KB in a page (by its bytes)


def _frame(run_id: str, seq: int) -> bytes:
    body = {"type": "tool_progress", "run_id": run_id, "seq": seq, "pad": "x" * PAD}
    return msgspec.json.encode(body)


async def _stored_run(d: Daemon) -> str:
    """A big finished run that is only in the store (not in the daemon's memory)."""
    store = d.handle.app[STATE].store
    assert isinstance(store, RunStore)
    run_id = "replay-" + os.urandom(4).hex()
    from tests.store.conftest import finished, record

    await store.create_run(record(run_id))
    for seq in range(1, FRAMES + 1):
        store.append_frame(run_id, seq, _frame(run_id, seq))
    await store.finish_run(finished(run_id, 2000.0, result=b'{"status":"completed"}'))
    return run_id


def _masked_text(payload: bytes) -> bytes:
    """One client-to-server WebSocket text frame (clients must mask, RFC 6455 5.3)."""
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x81, 0x80 | n]) if n < 126 else bytes([0x81, 0x80 | 126]) + struct.pack("!H", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def _raw_client(
    d: Daemon, start: Callable[[str, str], socket.socket], arg: str
) -> socket.socket:
    """A client on the daemon's socket, started by ``start(path, arg)``, that reads nothing yet:
    its receive buffer is 4 KiB, so what the daemon writes for it backs up at once."""
    path = d.handle.socket_path
    assert path is not None
    sock = await asyncio.get_running_loop().run_in_executor(None, start, path, arg)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


def _subscriber(d: Daemon, name: str) -> Subscriber:
    subs = [s for s in d.handle.app[HUB]._every if s.name == name]
    assert len(subs) == 1, subs
    return subs[0]


def _held(sub: Subscriber) -> int:
    """Bytes the daemon holds for this client: queued frames plus its transport's buffer."""
    queued = sum(len(i.data) for i in sub._queue if isinstance(i, Delivery))
    sink = sub.sink
    buffered = sink._transport.get_write_buffer_size() if sink is not None else 0  # type: ignore[attr-defined]
    return queued + buffered


def _counting(d: Daemon) -> list[int]:
    """Count the subscribe calls (how the test knows all messages were handled)."""
    manager = d.handle.app[STATE].manager
    assert manager is not None
    door = manager.subscriptions
    calls = [0]
    real = door.subscribe

    async def subscribe(*args: object, **kw: object) -> object:
        calls[0] += 1
        return await real(*args, **kw)  # type: ignore[arg-type]

    door.subscribe = subscribe  # type: ignore[method-assign]
    return calls


async def test_a_client_repeating_subscribe_without_reading_holds_one_page(
    rdaemon: Daemon,
) -> None:
    run_id = await _stored_run(rdaemon)
    calls = _counting(rdaemon)
    sock = await _raw_client(rdaemon, _ws_handshake, "")
    try:
        message = _masked_text(msgspec.json.encode({"type": "subscribe", "run": run_id}))
        repeats = 60
        for _ in range(repeats):
            sock.sendall(message)
        sub = _subscriber(rdaemon, "ws")
        await until(lambda: calls[0] == repeats, what="every subscribe handled")
        sink = sub.sink
        assert sink is not None
        await until(lambda: not sink.ready(), what="the client's transport is full")
        # One replay at a time: the repeats replaced it, they did not stack.
        assert sum(1 for i in sub._queue if not isinstance(i, (Control, Delivery))) <= 1
        # What is held is one page beyond the transport's high-water mark, not 60 runs.
        assert _held(sub) <= TRANSPORT_HIGH_WATER + REPLAY_PAGE_BYTES + 2 * (PAD + 64)
        # Pages were read only as the client's socket took them: a few, not 60 x 80.
        assert sub.replay_pages <= 2 * repeats
        pages_so_far = sub.replay_pages
        # The daemon does not keep reading the store for a client that does not read.
        await until(lambda: calls[0] == repeats)
        assert sub.replay_pages == pages_so_far
    finally:
        sock.close()
    await until(lambda: rdaemon.handle.app[HUB].subscriber_count == 0, what="detached")


async def test_a_non_reading_ndjson_replay_holds_one_page_and_later_gets_every_frame(
    rdaemon: Daemon,
) -> None:
    run_id = await _stored_run(rdaemon)
    loop = asyncio.get_running_loop()
    sock = await _raw_client(rdaemon, _ndjson_start, run_id)
    try:
        sub = _subscriber(rdaemon, f"ndjson:{run_id}")
        server = rdaemon.handle.runner.server
        assert server is not None
        await until(
            lambda: any(h.writing_paused for h in server.connections),
            what="the handler waits for this client",
        )
        # Stuck in a write for this client, having read only what the socket buffers took
        # (and one page in hand), not the run's ~80 pages.
        (handler,) = [h for h in server.connections if h.writing_paused]
        assert handler.transport is not None
        sndbuf = handler.transport.get_extra_info("socket").getsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF
        )
        in_flight = sndbuf + 4096 + TRANSPORT_HIGH_WATER
        assert 1 <= sub.replay_pages <= in_flight // (PAGE_FRAMES * PAD) + 3
        assert sum(len(i.data) for i in sub._queue if isinstance(i, Delivery)) == 0
        # The client reads at last: every frame, in order, once.
        sock.settimeout(30)
        received = bytearray()

        def read_all() -> None:
            while not received.endswith(b"\r\n0\r\n\r\n"):
                chunk = sock.recv(1 << 16)
                assert chunk, "closed before the end of the stream"
                received.extend(chunk)

        await loop.run_in_executor(None, read_all)
    finally:
        sock.close()
    lines = _dechunk(bytes(received).split(b"\r\n\r\n", 1)[1]).splitlines()
    assert [msgspec.json.decode(line)["seq"] for line in lines] == list(range(1, FRAMES + 1))


def _dechunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body, decoded."""
    out = bytearray()
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(out)
        out += body[:size]
        body = body[size + 2 :]
