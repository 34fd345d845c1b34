"""The daemon pipeline under load (bench/RESULTS.md §2).

A fake CLI writes N tool lines (tool_use / tool_result alternating, each tool_use stamped with
the time it was written) either as fast as it can or at a fixed rate; the daemon translates,
stores and fans them out to K WebSocket subscribers following every run. Measured at a few
"probe" subscribers, lean WebSocket clients that split and decode every message as the baseline's
reader decodes every line (the rest are byte sinks in one separate uvloop process that read and
drop everything, so that the client side takes as little of the two cores as a client can):
frames/s, and line-to-client latency p50 / p99 / max (the time a tool_use line was written by
the CLI to the time its tool_call frame reached a client).

Baseline, in the same run: a plain asyncio pipe reader of the same fake CLI's stdout that
decodes each line (no daemon at all). Overhead = daemon wall time / baseline wall time for the
same N lines, each from the first tool_use written to the last one received (by every probe);
see :func:`_overhead` for which rounds are compared.

Targets (bench/RESULTS.md, Summary): p99 <= 5 ms at 2,000 lines/s with 100 subscribers on 2
cores, and overhead <= 1.2x. Run with ``.venv/bin/python -m bench pipeline`` (``--quick`` for
a short run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import msgspec

from bench.harness import (
    FAKE_CLAUDE,
    ServedDaemon,
    cpu_seconds,
    machine,
    on_uvloop,
    percentile,
)

P99_TARGET_MS = 5.0
OVERHEAD_TARGET = 1.2
PROBES = 4

# A process holding K WebSocket connections that reads and discards bytes as fast as it can.
_SINKS = r"""
import asyncio, sys
import uvloop
UPGRADE = (b"GET /v1/ws?run=* HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\n\r\n")
class Sink(asyncio.Protocol):
    def __init__(self):
        self.head = b""
        self.upgraded = asyncio.get_running_loop().create_future()
        self.gone = asyncio.get_running_loop().create_future()
    def connection_made(self, transport):
        transport.write(UPGRADE)
    def data_received(self, data):
        if not self.upgraded.done():
            self.head += data
            if b"\r\n\r\n" in self.head:
                assert self.head.startswith(b"HTTP/1.1 101"), self.head
                self.upgraded.set_result(None)
    def connection_lost(self, exc):
        if not self.gone.done():
            self.gone.set_result(None)
async def main(path, n):
    loop = asyncio.get_running_loop()
    sinks = []
    for _ in range(n):
        _, sink = await loop.create_unix_connection(Sink, path)
        await sink.upgraded
        sinks.append(sink)
    print("ready", flush=True)
    await asyncio.gather(*(s.gone for s in sinks))
uvloop.run(main(sys.argv[1], int(sys.argv[2])))
"""


class _Args(msgspec.Struct):
    sent_at: float = 0.0


class _Frame(msgspec.Struct):
    type: str
    run_id: str = ""
    seq: int = 0
    args: _Args | None = None


_decode_frame = msgspec.json.Decoder(_Frame).decode


@dataclass
class Result:
    """One measured pass."""

    label: str
    lines: int
    wall_s: float
    frames: int
    latencies_ms: list[float]
    cpu_s: float = 0.0
    dropped: int = 0
    resumed: int = 0  # times a probe was closed as lagging and reconnected with after=

    def row(self) -> str:
        lat = self.latencies_ms
        rate = self.frames / self.wall_s if self.wall_s else 0.0
        extra = f"  daemon CPU {self.cpu_s * 1e6 / self.lines:6.1f} us/line" if self.cpu_s else ""
        drops = f"  dropped {self.dropped}" if self.dropped else ""
        drops += f" (probes resumed {self.resumed}x)" if self.resumed else ""
        return (
            f"  {self.label:34} {self.wall_s:7.3f} s {rate:9.0f} frames/s  latency ms"
            f" p50 {percentile(lat, 0.5):6.2f} p99 {percentile(lat, 0.99):7.2f}"
            f" max {max(lat, default=float('nan')):7.2f}{extra}{drops}"
        )


def _tools_spec(n: int, rate: float) -> str:
    return f"tools n={n} rate={rate:g}"


async def baseline(n: int, rate: float) -> Result:
    """The same fake CLI read by a plain asyncio pipe reader: decode every line, that is all."""
    env = {"PATH": os.environ.get("PATH", ""), "FAKE_CLAUDE_SCENARIO": _tools_spec(n, rate)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        FAKE_CLAUDE,
        "-p",
        "--output-format",
        "stream-json",
        "--session-id",
        "00000000-0000-4000-8000-000000000000",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        env=env,
        limit=1 << 24,
    )
    assert proc.stdout is not None
    latencies: list[float] = []
    first = last = 0.0
    lines = 0
    decode = msgspec.json.decode
    while line := await proc.stdout.readline():
        now = time.time()
        obj = decode(line)
        lines += 1
        if obj.get("type") == "assistant":
            for block in obj["message"]["content"]:
                if block.get("type") == "tool_use":
                    sent = block["input"]["sent_at"]
                    first = first or sent
                    latencies.append((now - sent) * 1000)
                    last = now
    await proc.wait()
    return Result(f"baseline (pipe reader) {_rate(rate)}", n, last - first, lines, latencies)


def _rate(rate: float) -> str:
    return f"@ {rate:g} lines/s" if rate else "@ max"


_CLOSE_LAGGING = 4008
_UPGRADE = (
    "GET /v1/ws?{query} HTTP/1.1\r\nHost: codelegate\r\nUpgrade: websocket\r\n"
    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Version: 13\r\n\r\n"
)


class _ProbeConnection(asyncio.Protocol):
    """A WebSocket client that does about what the baseline's reader does: it splits the
    stream into messages and decodes each one (no per-message task, queue or timeout).

    Records (receive time, sent_at) for each stamped tool_call, the run and last seq it saw,
    and ends at the run_result or at the server's close frame (its code kept).
    """

    def __init__(self, query: str, out: list[tuple[float, float]]) -> None:
        self.query = query
        self.out = out
        self.run_id = ""
        self.last_seq = 0
        self.close_code: int | None = None
        self.ended = False  # the run_result came
        loop = asyncio.get_running_loop()
        self.upgraded: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = t = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        t.write(_UPGRADE.format(query=self.query).encode())

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buf = self._buf
        buf += data
        if not self.upgraded.done():
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self.upgraded.set_exception(RuntimeError(bytes(buf[:end]).decode()))
                return
            del buf[: end + 4]
            self.upgraded.set_result(None)
        pos, size = 0, len(buf)
        while size - pos >= 2:
            opcode, n, head = buf[pos] & 0x0F, buf[pos + 1] & 0x7F, 2
            if n == 126:
                n, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif n == 127:
                n, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            if size - pos < head + n:
                break
            payload = buf[pos + head : pos + head + n]
            pos += head + n
            if opcode == 0x1:
                self._message(now, payload)
            elif opcode == 0x8:  # the server closes: keep its code, answer, done
                self.close_code = int.from_bytes(payload[:2], "big") if n >= 2 else 1005
                self._send(0x8, bytes(payload[:2]))
                self._end()
            elif opcode == 0x9:  # the server's heartbeat
                self._send(0xA, bytes(payload))
        del buf[:pos]

    def _message(self, now: float, payload: bytearray) -> None:
        frame = _decode_frame(payload)
        self.run_id, self.last_seq = frame.run_id or self.run_id, frame.seq or self.last_seq
        if frame.type == "tool_call" and frame.args is not None:
            self.out.append((now, frame.args.sent_at))
        elif frame.type == "run_result":
            self.ended = True
            self._send(0x8, (1000).to_bytes(2, "big"))
            self._end()

    def _send(self, opcode: int, payload: bytes) -> None:
        # A client's frames are masked (RFC 6455 5.3); a zero mask leaves the payload as it is.
        if self._transport is not None and not self._transport.is_closing():
            header = bytes((0x80 | opcode, 0x80 | len(payload))) + bytes(4)
            self._transport.write(header + payload)

    def _end(self) -> None:
        if self._transport is not None:
            self._transport.close()
        if not self.finished.done():
            self.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(exc or ConnectionError("closed during the handshake"))
        if not self.finished.done():
            self.finished.set_result(None)


async def _connect(d: ServedDaemon, query: str, out: list[tuple[float, float]]) -> _ProbeConnection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_unix_connection(lambda: _ProbeConnection(query, out), d.socket)
    await conn.upgraded
    return conn


async def _probe(d: ServedDaemon, conn: _ProbeConnection) -> int:
    """Wait for the run_result; returns how many times the probe had to resume.

    Closed as lagging, it does what a client should (README, WebSocket close codes): reconnect
    to that run with ``after`` = the last seq it received, and go on (the frames it missed come
    as a replay, from the store if the run has ended meanwhile, their latency included).
    """
    resumed = 0
    while True:
        await conn.finished
        if conn.ended:
            return resumed
        if conn.close_code != _CLOSE_LAGGING:
            raise RuntimeError(f"a probe was closed with {conn.close_code} before the run ended")
        resumed += 1
        query = f"run={conn.run_id or '*'}&after={conn.last_seq}"
        conn = await _connect(d, query, conn.out)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _start_sinks(socket_path: str, n: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _SINKS, socket_path, str(n)], stdout=subprocess.PIPE
    )


async def through_daemon(
    d: ServedDaemon, n: int, rate: float, subscribers: int, *, publisher: bool = False
) -> Result:
    """N lines through the daemon to ``subscribers`` clients following every run.

    ``publisher``: the daemon has ``[fanout]``, whose publisher follows every run as one more
    subscriber.
    """
    assert d.http is not None
    sinks = _start_sinks(d.socket, subscribers - PROBES) if subscribers > PROBES else None
    if sinks is not None:
        assert sinks.stdout is not None
        ready = await asyncio.get_running_loop().run_in_executor(None, sinks.stdout.readline)
        assert ready.strip() == b"ready", ready
    samples: list[list[tuple[float, float]]] = [[] for _ in range(min(PROBES, subscribers))]
    probes = [await _connect(d, "run=*", out) for out in samples]
    metrics = await d.get("/metrics")
    attached = _metric(metrics, "codelegate_subscribers") - publisher
    assert attached == subscribers, f"{attached} subscribers attached, not {subscribers}"
    dropped0 = _metric(metrics, "codelegate_subscribers_dropped_total")
    cpu0 = cpu_seconds(d.pid)
    readers = [asyncio.ensure_future(_probe(d, conn)) for conn in probes]
    run_id = await d.start_run("fake: " + _tools_spec(n, rate))
    async with asyncio.timeout(max(60.0, 20 * n / (rate or 2000))):  # a bench never hangs
        resumed = sum(await asyncio.gather(*readers))
    cpu = cpu_seconds(d.pid) - cpu0
    state = await d.get(f"/v1/runs/{run_id}")
    dropped = _metric(await d.get("/metrics"), "codelegate_subscribers_dropped_total") - dropped0
    if sinks is not None:
        sinks.terminate()
        sinks.wait()
    for probe in samples:  # every probe got every tool_call once, resumed or not
        sent = sorted(s for _, s in probe)
        assert len(sent) == (n + 1) // 2, f"a probe got {len(sent)} tool_calls of {(n + 1) // 2}"
        assert len(set(sent)) == len(sent), "a probe got a tool_call twice"
    first_sent = min(s for probe in samples for _, s in probe)
    last_received = max(now for probe in samples for now, _ in probe)
    latencies = [(now - sent) * 1000 for probe in samples for now, sent in probe]
    label = f"daemon, {subscribers} subscribers {_rate(rate)}"
    wall = last_received - first_sent
    result = Result(label, n, wall, int(state["last_seq"]), latencies, cpu)
    result.dropped = int(dropped)
    result.resumed = resumed
    return result


def _overhead(rounds: list[tuple[Result, Result]], rate: float) -> float:
    """Daemon wall time / baseline wall time for the same lines.

    Paced, both take the pacing's time and the round shown is compared with its own baseline.
    As fast as the CLI can write, both are throughput measurements on two shared cores whose
    rounds vary by a quarter from one to the next (bench/RESULTS.md): compare the best round of
    each, the one least disturbed by the machine, as the translator benchmark does.
    """
    if rate:
        rounds = sorted(rounds, key=lambda r: percentile(r[1].latencies_ms, 0.99))
        base, ours = rounds[len(rounds) // 2]
        return ours.wall_s / base.wall_s
    return min(o.wall_s for _, o in rounds) / min(b.wall_s for b, _ in rounds)


async def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    # A max pass is short and taken best-of (see _overhead): five rounds at least, like the
    # translator benchmark.
    max_rounds = args.rounds if args.quick else max(args.rounds, 5)
    print(
        f"each paced pass {args.rounds} rounds, each max pass {max_rounds};"
        " the round with the median daemon p99 is shown"
    )
    shown: dict[tuple[float, int], tuple[Result, float]] = {}
    async with ServedDaemon(limits={"subscriber_queue": args.queue}) as d:
        await through_daemon(d, 200, 0, 1)  # warm-up: imports, caches, the store's first pages
        for rate, k in (
            (0, 1),
            (0, args.subscribers),
            (args.rate, 1),
            (args.rate, 10),  # where the per-subscriber cost starts to show
            (args.rate, args.subscribers),
        ):
            n = args.lines if rate else args.lines_max
            rounds = []
            for _ in range(args.rounds if rate else max_rounds):
                base = await baseline(n, rate)
                ours = await through_daemon(d, n, rate, k)
                rounds.append((base, ours))
            by_p99 = sorted(rounds, key=lambda r: percentile(r[1].latencies_ms, 0.99))
            base, ours = by_p99[len(by_p99) // 2]
            print(base.row())
            print(ours.row())
            overhead = _overhead(rounds, rate)
            p99s = ", ".join(f"{percentile(o.latencies_ms, 0.99):.2f}" for _, o in rounds)
            walls = "; ".join(f"{b.wall_s:.3f} / {o.wall_s:.3f}" for b, o in rounds)
            how = "the median round" if rate else "best round of each"
            print(
                f"    overhead (wall time daemon / baseline, {how}): {overhead:.2f}x;"
                f" daemon p99 of every round (ms): {p99s}"
            )
            ratios = ", ".join(f"{o.wall_s / b.wall_s:.2f}" for b, o in rounds)
            print(f"    wall s of every round (baseline / daemon): {walls}; ratios {ratios}")
            shown[(rate, k)] = (ours, overhead)
    target, overhead = shown[(args.rate, args.subscribers)]
    p99 = percentile(target.latencies_ms, 0.99)
    ok = p99 <= P99_TARGET_MS and overhead <= OVERHEAD_TARGET and target.dropped == 0
    print(
        f"target @ {args.rate:g} lines/s, {args.subscribers} subscribers: p99 {p99:.2f} ms"
        f" (<= {P99_TARGET_MS}), overhead {overhead:.2f}x (<= {OVERHEAD_TARGET}),"
        f" dropped {target.dropped} -> {'met' if ok else 'MISSED'}"
    )
    # Read strictly, "overhead" is also the as-fast-as-it-can pass with one subscriber.
    _, fast_overhead = shown[(0, 1)]
    print(
        f"also: overhead as fast as the CLI can write, 1 subscriber: {fast_overhead:.2f}x"
        f" (<= {OVERHEAD_TARGET}) -> {'met' if fast_overhead <= OVERHEAD_TARGET else 'MISSED'}"
    )
    return 0 if ok and fast_overhead <= OVERHEAD_TARGET else 1


FANOUT_RATIO_TARGET = 1.1


async def run_fanout(args: argparse.Namespace) -> int:
    """``--fanout``: the target pass with ``[fanout]`` on beside the same pass with it off.

    Two served daemons, one publishing to a Redis of its own on loopback, take turns round by
    round (so that the machine's load falls on both alike); the p99 of the median round of
    each is compared. Target: on / off <= 1.1x. Redis must then hold every frame of each run.
    """
    from redis.asyncio import Redis

    from bench.bench_fanout import fanout_section, redis_server

    print(f"machine: {machine()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    folder = Path(tempfile.mkdtemp(prefix="clbench-redis-"))
    server = redis_server(folder)
    client = Redis.from_url(server.url)
    rate, k, n = args.rate, args.subscribers, args.lines
    passes: dict[bool, list[Result]] = {False: [], True: []}
    try:
        limits = {"subscriber_queue": args.queue}
        async with (
            ServedDaemon(limits=limits) as off,
            ServedDaemon(limits=limits, fanout=fanout_section(server)) as on,
        ):
            for d, fan in ((off, False), (on, True)):
                await through_daemon(d, 200, 0, 1, publisher=fan)  # warm-up
            for _ in range(args.rounds):
                for d, fan in ((off, False), (on, True)):
                    passes[fan].append(await through_daemon(d, n, rate, k, publisher=fan))
            published = _metric(await on.get("/metrics"), "codelegate_fanout_published_total")
            pending = _metric(await on.get("/metrics"), "codelegate_fanout_pending")
        streams = [key async for key in client.scan_iter("clbench:run:*")]
        entries = sum([await client.xlen(key) for key in streams])
    finally:
        await client.aclose()
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    median: dict[bool, Result] = {}
    for fan in (False, True):
        by_p99 = sorted(passes[fan], key=lambda r: percentile(r.latencies_ms, 0.99))
        median[fan] = by_p99[len(by_p99) // 2]
        p99s = ", ".join(f"{percentile(r.latencies_ms, 0.99):.2f}" for r in passes[fan])
        print(median[fan].row().replace("daemon,", "fan-out on, " if fan else "fan-out off,"))
        print(f"    p99 of every round (ms): {p99s}")
    p99_off = percentile(median[False].latencies_ms, 0.99)
    p99_on = percentile(median[True].latencies_ms, 0.99)
    ratio = p99_on / p99_off
    print(
        f"    Redis: {entries} entries in {len(streams)} run streams"
        f" ({published:.0f} published, {pending:.0f} pending at the end)"
    )
    ok = ratio <= FANOUT_RATIO_TARGET and median[True].dropped == 0
    print(
        f"target @ {rate:g} lines/s, {k} subscribers: p99 fan-out on {p99_on:.2f} ms,"
        f" off {p99_off:.2f} ms, ratio {ratio:.2f}x (<= {FANOUT_RATIO_TARGET})"
        f" -> {'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Print the table and the verdict; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(prog="python -m bench pipeline")
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--lines", type=int, default=10_000, help="lines of the paced passes")
    parser.add_argument("--lines-max", type=int, default=40_000, help="lines of the max passes")
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--queue", type=int, default=1024, help="[limits] subscriber_queue")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer lines, one round")
    parser.add_argument(
        "--fanout",
        action="store_true",
        help="only the target pass, [fanout] on (to a Redis of its own) beside it off",
    )
    args, _ = parser.parse_known_args(argv or [])
    if args.quick:
        args.lines, args.lines_max, args.rounds = 2_000, 4_000, 1
    job = run_fanout if args.fanout else run
    return on_uvloop(job(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
