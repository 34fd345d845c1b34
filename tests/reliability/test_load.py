"""Load: 8 concurrent runs fanned out to 200 WebSocket subscribers, some of them deliberately
slow; and 10,000 subscribe/unsubscribe cycles against a live run.

The runs are played by ``chatty_claude.py`` (a fast fake CLI whose tool results are big enough to
fill a slow client's socket buffers); they wait at a gate after their first line so that every
subscriber is attached before the burst. The real CLI is exercised by ``test_load_real_cli.py``.
No timing is asserted: a slowed run would show up as a fast subscriber closed or missing frames.
"""

from __future__ import annotations

import asyncio
import gc
import os
import tracemalloc
from collections import defaultdict
from pathlib import Path

import aiohttp
import msgspec
import pytest
import structlog

from codelegate.daemon.serving.state import HUB
from codelegate.daemon.subscriber import CLOSE_LAGGING
from codelegate.policy.config import Config
from tests.daemon.conftest import BASE, Daemon, make_config, start_daemon, stop_daemon
from tests.fakes import CHATTY_CLAUDE
from tests.polling import until
from tests.procfs import marked_processes
from tests.reliability.conftest import post, wait_done

RUNS = 8
FAST_SINGLE = 19 * RUNS  # 19 per run, subscribed in the URL
FAST_PAIRS = 16  # two runs each, subscribed with messages
SLOW = 200 - FAST_SINGLE - FAST_PAIRS  # follow every run and never read
PAIRS_PER_RUN = 100  # tool_use/tool_result pairs: ~205 frames a run
QUEUE = 256


class Seen(msgspec.Struct):
    """The fields a subscriber checks (the rest of each frame is skipped by the decoder)."""

    type: str
    run_id: str | None = None
    seq: int | None = None


_decode = msgspec.json.Decoder(Seen).decode


class Client:
    """One WebSocket subscriber: every frame it got, per run, and how it was closed."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.seqs: dict[str, list[int]] = defaultdict(list)
        self.done: set[str] = set()
        self.close_code: int | None = None

    def record(self, frame: Seen) -> None:
        if frame.seq is None or frame.run_id is None:
            return
        self.seqs[frame.run_id].append(frame.seq)
        if frame.type == "run_result":
            self.done.add(frame.run_id)

    async def read_until(self, runs: set[str]) -> None:
        """Read until each of ``runs`` delivered its run_result, or the server closed."""
        while not runs <= self.done:
            msg = await self.ws.receive()
            if msg.type == aiohttp.WSMsgType.TEXT:
                self.record(_decode(msg.data))
                continue
            # Slow clients connect with autoclose=False: the code is the server's own, even when
            # the server drops the connection right after its close frame.
            self.close_code = msg.data if msg.type == aiohttp.WSMsgType.CLOSE else -1
            return


def unlimited_session(d: Daemon) -> aiohttp.ClientSession:
    """A client session without aiohttp's default cap of 100 connections."""
    assert d.handle.socket_path is not None
    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=d.handle.socket_path, limit=0),
        timeout=aiohttp.ClientTimeout(total=120),
    )


@pytest.fixture
def load_config(short_dir: Path, workspace: Path) -> Config:
    return make_config(
        short_dir,
        workspace,
        claude={"path": CHATTY_CLAUDE},
        policy={"max_concurrent_runs": RUNS},
        limits={"subscriber_queue": QUEUE},
    )


async def _subscribe(ws: aiohttp.ClientWebSocketResponse, run_id: str, after: int) -> None:
    await ws.send_str(
        msgspec.json.encode({"type": "subscribe", "run": run_id, "after": after}).decode()
    )


async def _acks(ws: aiohttp.ClientWebSocketResponse, n: int, into: Client) -> None:
    """Read until ``n`` subscription acks arrived, keeping any frame that comes first."""
    while n:
        msg = await asyncio.wait_for(ws.receive(), 30)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        frame = _decode(msg.data)
        if frame.type == "subscribed":
            n -= 1
        elif frame.seq is not None:
            into.record(frame)
        else:
            pytest.fail(f"unexpected control message {msg.data}")


@pytest.mark.slow
async def test_eight_runs_two_hundred_subscribers_gapless(
    load_config: Config, tmp_path: Path
) -> None:
    with structlog.testing.capture_logs() as events:
        await _eight_runs(load_config, tmp_path)
    # Overlapping runs are the normal case: nothing about them is an error for an operator.
    assert len([e for e in events if e["event"] == "run_finished"]) == RUNS
    errors = [e for e in events if e.get("log_level") in ("error", "critical")]
    assert errors == [], errors[:3]


async def _eight_runs(load_config: Config, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    d = await start_daemon(load_config, tmp_path)
    await d.http.close()
    d.http = unlimited_session(d)
    clients: list[Client] = []
    try:
        task = f"chatty n={PAIRS_PER_RUN} pad=1500 gate={gate}"
        run_ids = [await post(d, task) for _ in range(RUNS)]
        fast: list[tuple[Client, set[str]]] = []
        for i in range(FAST_SINGLE):
            rid = run_ids[i % RUNS]
            c = Client(await d.ws(f"?run={rid}"))
            fast.append((c, {rid}))
        for i in range(FAST_PAIRS):
            c = Client(await d.ws())
            pair = {run_ids[i % RUNS], run_ids[(i + 3) % RUNS]}
            for rid in pair:
                await _subscribe(c.ws, rid, 0)
            await _acks(c.ws, len(pair), c)
            fast.append((c, pair))
        slow = [
            Client(await d.http.ws_connect(f"{BASE}/v1/ws?run=*", autoclose=False))
            for _ in range(SLOW)
        ]
        clients = [c for c, _ in fast] + slow
        hub = d.handle.app[HUB]
        assert hub.subscriber_count == 200

        readers = [asyncio.ensure_future(c.read_until(runs)) for c, runs in fast]
        gate.touch()  # every run bursts now, with every subscriber attached
        states = [await wait_done(d, rid, 120) for rid in run_ids]
        await asyncio.wait_for(asyncio.gather(*readers), 120)
        last = {s["run_id"]: s["last_seq"] for s in states}

        # The slow ones were closed for lagging; they drain what they got, then catch up.
        for c in slow:
            await asyncio.wait_for(c.read_until(set(run_ids)), 60)
        for c in slow:
            await c.ws.close()
            again = Client(await d.ws())
            again.seqs, again.done = c.seqs, c.done
            for rid in run_ids:
                got = c.seqs.get(rid, [])
                await _subscribe(again.ws, rid, got[-1] if got else 0)
            await _acks(again.ws, RUNS, again)
            await asyncio.wait_for(again.read_until(set(run_ids)), 60)
            await again.ws.close()
    finally:
        for c in clients:
            await c.ws.close()
        await stop_daemon(d)

    assert all(s["status"] == "completed" for s in states), states
    for rid in run_ids:
        assert marked_processes(rid) == []
    for c, runs in fast:
        assert c.close_code is None, "a fast subscriber was closed"
        for rid in runs:
            assert c.seqs[rid] == list(range(1, last[rid] + 1)), "a fast subscriber lost frames"
    closed = [c.close_code for c in slow]
    assert closed == [CLOSE_LAGGING] * SLOW, closed
    for c in slow:
        for rid in run_ids:
            assert c.seqs[rid] == list(range(1, last[rid] + 1)), "catch-up with after= has a gap"


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
async def test_ten_thousand_subscribe_cycles_leave_memory_and_fds_flat(
    load_config: Config, tmp_path: Path
) -> None:
    gate = tmp_path / "never"  # the run stays live (held at its gate) for the whole test
    d = await start_daemon(load_config, tmp_path)
    try:
        rid = await post(d, f"chatty n=1 pad=10 gate={gate}")
        await until(lambda: bool(marked_processes(rid)), what="the run is live")
        hub = d.handle.app[HUB]
        await until(lambda: d.handle.app[HUB].subscriber_count == 0)
        ws = await d.ws()
        sink = Client(ws)
        sub = msgspec.json.encode({"type": "subscribe", "run": rid, "after": 10**6}).decode()
        unsub = msgspec.json.encode({"type": "unsubscribe", "run": rid}).decode()
        batch = 100

        async def cycles(n: int) -> None:
            for _ in range(n // batch):
                for _ in range(batch):
                    await ws.send_str(sub)
                    await ws.send_str(unsub)
                await _acks(ws, batch, sink)

        async def connections(n: int) -> None:
            for _ in range(n):
                async with d.ws(f"?run={rid}&after=1000000"):
                    pass

        await cycles(2_000)  # warm-up: caches, free lists, arenas
        await connections(100)
        gc.collect()
        tracemalloc.start()
        fds_before = _fds()
        mem_before = tracemalloc.get_traced_memory()[0]
        await cycles(8_000)
        await connections(400)
        await until(lambda: hub.subscriber_count == 1, what="closed connections detached")
        gc.collect()
        mem_after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        fds_after = _fds()
        await ws.close()
        await until(lambda: hub.subscriber_count == 0, what="the last client detached")
        (gate).touch()
        await wait_done(d, rid)
    finally:
        tracemalloc.stop()
        await stop_daemon(d)
    assert sink.seqs == {}  # after= beyond the log: no frame was ever replayed
    assert fds_after - fds_before <= 3, (fds_before, fds_after)
    # 8,000 cycles + 400 connections: even 64 bytes kept per cycle would be 0.5 MB.
    assert mem_after - mem_before < 256 * 1024, (mem_before, mem_after)
