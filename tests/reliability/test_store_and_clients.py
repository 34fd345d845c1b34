"""The store's disk fills up mid-run; a WebSocket client vanishes mid-frame. The runs go on,
clients get every frame, and what the store holds in the end is everything that was published."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import struct
from pathlib import Path

from codelegate.daemon.serving.state import HUB, STATE
from codelegate.daemon.store.store import RunStore
from codelegate.policy.config import Config
from tests.daemon.conftest import Daemon, make_config, running_daemon
from tests.polling import until
from tests.procfs import marked_processes
from tests.reliability.conftest import cards_closed, post, stored_frames, stored_status, wait_done
from tests.reliability.test_faults import Follower


def the_store(d: Daemon) -> RunStore:
    store = d.handle.app[STATE].store
    assert store is not None
    return store


async def disk_full(store: RunStore, full: bool) -> None:
    """Make every write that grows the file fail with SQLITE_FULL (a real "disk full")."""

    def limit(conn: sqlite3.Connection) -> None:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages if full else 1 << 30}")

    await store._call(limit)  # the store thread owns the connection


async def test_disk_full_mid_run_loses_nothing_once_space_returns(
    rel_config: Config, tmp_path: Path
) -> None:
    async with running_daemon(rel_config, tmp_path) as d:
        store = the_store(d)
        follower = Follower(await d.ws("?run=*"))
        run_id = await post(d, "fake: tools n=600 rate=1200")
        await until(lambda: len(follower.frames[run_id]) > 20, what="the run is producing")
        await disk_full(store, True)
        await until(lambda: store.write_errors > 0, what="a failed batch")
        state = await wait_done(d, run_id)
        assert state["status"] == "completed"  # the run never noticed
        await until(lambda: follower.finished(run_id))
        live = follower.frames[run_id]
        # While the disk is full, replay still has every frame (merged from the buffer).
        assert await d.events(run_id) == live
        await disk_full(store, False)
        await until(lambda: store.unwritten == 0, what="the retried batches written")
        await follower.close()
    cards_closed(live)
    assert stored_frames(rel_config.store.path, run_id) == live
    assert marked_processes(run_id) == []
    # The final status, recorded while the disk was full, must not be lost either.
    assert stored_status(rel_config.store.path, run_id) == "completed"


def _ws_handshake(path: str, query: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    sock.sendall(
        (
            f"GET /v1/ws{query} HTTP/1.1\r\nHost: codelegate\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "closed during the handshake"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    return sock


def _ndjson_start(path: str, run_id: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    sock.sendall(f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: codelegate\r\n\r\n".encode())
    assert sock.recv(12).startswith(b"HTTP/1.1 200")
    return sock


def _vanish(sock: socket.socket) -> None:
    """Close with RST (no FIN, no WebSocket close): the client is just gone."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def test_clients_vanishing_mid_frame_hurt_nobody(rdaemon: Daemon) -> None:
    path = rdaemon.handle.socket_path
    assert path is not None
    hub = rdaemon.handle.app[HUB]
    follower = Follower(await rdaemon.ws("?run=*"))
    run_id = await post(rdaemon, "fake: tools n=1000 rate=2000")
    await until(lambda: len(follower.frames[run_id]) > 10, what="the run is producing")
    baseline = hub.subscriber_count
    loop = asyncio.get_running_loop()
    for i in range(20):
        sock = await loop.run_in_executor(None, _ws_handshake, path, f"?run={run_id}")
        if i % 2 == 0:
            # Half a masked client frame: header says 1000 bytes, 10 arrive, then nothing.
            sock.sendall(bytes([0x81, 0x80 | 126]) + struct.pack("!H", 1000) + b"mask" + b"x" * 10)
        else:
            # Read part of a server frame, then disappear while the server is writing.
            sock.recv(7)
        _vanish(sock)
    for _ in range(5):  # NDJSON readers too: read a little of the stream, then reset
        sock = await loop.run_in_executor(None, _ndjson_start, path, run_id)
        _vanish(sock)
    state = await wait_done(rdaemon, run_id)
    await until(lambda: follower.finished(run_id))
    await until(lambda: hub.subscriber_count == baseline, what="vanished clients detached")
    live = follower.frames[run_id]
    await follower.close()
    assert state["status"] == "completed"
    cards_closed(live)
    assert await rdaemon.events(run_id) == live
    status, health = await rdaemon.json("GET", "/healthz")
    assert status == 200
    assert health["status"] == "ok"
    metrics = await (await rdaemon.http.get("http://codelegate/metrics")).text()
    assert 'codelegate_http_errors_total{status="500"}' not in metrics


async def test_frames_past_the_store_cap_go_out_live_and_the_store_says_what_it_dropped(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    config = make_config(short_dir, workspace, limits={"max_stored_frames": 1000})
    async with running_daemon(config, tmp_path) as d:
        follower = Follower(await d.ws("?run=*"))
        run_id = await post(d, "fake: tools n=3000")
        state = await wait_done(d, run_id)
        await until(lambda: follower.finished(run_id))
        live = follower.frames[run_id]
        await follower.close()
    assert state["status"] == "completed"
    cards_closed(live)  # every frame went out live, gapless
    told = [f for f in live if f["type"] == "diagnostic" and f["code"] == "frames_not_stored"]
    stored = stored_frames(config.store.path, run_id)
    not_stored = len(live) - len(stored)
    assert not_stored > 1000
    # Said right after the first frames not stored (those of one stdout chunk, counted), and
    # the total just before run_result.
    assert [f["count"] for f in told][1:] == [not_stored]
    assert told[0]["seq"] == 1000 + told[0]["count"] + 1
    assert live[-2] == told[-1]
    # The store keeps the first 1000 frames, then what closes the run: how it ended.
    assert [f["seq"] for f in stored[:1000]] == list(range(1, 1001))
    assert stored[:1000] == live[:1000]
    assert stored[1000:] == [f for f in live[1000:] if f in stored[1000:]]
    assert told[0] in stored
    assert stored[-2:] == live[-2:]
    assert stored[-1]["type"] == "run_result"
    assert stored[-1]["result"]["frames_not_stored"] == not_stored  # and in the final result
    assert state["result"]["frames_not_stored"] == not_stored
