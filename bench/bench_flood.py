"""A run floods its output; how long does another run wait for its first frame?

bench/RESULTS.md §6.

One run prints tool lines as fast as the load tests' fake CLI can write them (``--lines``,
600,000 by default: as many frames, each tool result ``--pad`` bytes). While it floods,
``--probes`` trivial runs (one tool each) are
started one after another; for each, the time from ``POST /v1/runs`` to its first frame on a
WebSocket (``?run=<id>``) is measured. Baseline, in the same daemon and the same run: the same
probes with nothing else running. Passes: the store capped as configured by default (``[limits]
max_stored_frames``), and uncapped (the store has to write the whole flood: the case where one
store queue for everything made a new run wait 14 s). Also reported: how many frames of the
flood the store kept, and the size of the database file. Target: every probe's first frame
<= 1 s during the flood. Run with ``.venv/bin/python -m bench flood``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import aiohttp

from bench.harness import BASE, ROOT, ServedDaemon, machine, percentile
from tests.reliability.conftest import stored_count, stored_status

# The load tests' talkative fake CLI: tool results of ``pad`` bytes, as fast as it can write.
CHATTY = str(ROOT / "tests" / "fakes" / "chatty_claude.py")
PROBE = "chatty n=1 pad=10"

T = TypeVar("T")
TARGET_S = 1.0
UNCAPPED = {"max_stored_frames": 100_000_000, "max_stored_bytes": 64 * 1024**3}


async def first_frame(d: ServedDaemon, task: str) -> float:
    """Seconds from POST /v1/runs to the run's first frame on a WebSocket."""
    assert d.http is not None
    start = time.monotonic()
    run_id = await d.start_run(task)
    async with d.http.ws_connect(f"{BASE}/v1/ws?run={run_id}") as ws:
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT and b'"seq"' in msg.data.encode():
                return time.monotonic() - start
    raise RuntimeError(f"no frame of {run_id}")


async def poll(read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """``read()`` every 50 ms until ``done`` of it."""
    while True:
        value = await read()
        if done(value):
            return value
        await asyncio.sleep(0.05)


async def last_seq(d: ServedDaemon, run_id: str) -> int:
    return int((await d.get(f"/v1/runs/{run_id}"))["last_seq"])


def db_bytes(db: Path) -> tuple[int, int]:
    """Sizes of the database file and of its WAL."""
    wal = Path(f"{db}-wal")
    return os.path.getsize(db), os.path.getsize(wal) if wal.exists() else 0


async def one_pass(name: str, limits: dict[str, int], args: argparse.Namespace) -> list[float]:
    async with ServedDaemon(limits=limits, claude={"path": CHATTY}) as d:
        db = d.tmp / "store.db"
        base = [await first_frame(d, PROBE) for _ in range(args.probes)]
        flood = await d.start_run(f"chatty n={args.lines // 2} pad={args.pad}")
        await poll(lambda: last_seq(d, flood), lambda seq: seq >= args.lines // 20)  # well in
        during = []
        for _ in range(args.probes):
            during.append(await first_frame(d, PROBE))
            await asyncio.sleep(0.2)
        at_end = await last_seq(d, flood)
        flooding = at_end < args.lines  # the flood was still going when the last probe ended
        await poll(lambda: d.get(f"/v1/runs/{flood}"), lambda st: st["status"] != "running")
        ended = time.monotonic()
        total = await last_seq(d, flood)

        async def on_disk() -> str:
            return stored_status(db, flood)

        await poll(on_disk, lambda status: status != "running")  # its finish lands last
        catch_up = time.monotonic() - ended
        kept = stored_count(db, flood)
        size = db_bytes(db)
    print(
        f"  {name:9} first frame, idle: median {statistics.median(base) * 1000:7.1f} ms,"
        f" max {max(base) * 1000:7.1f} ms | during the flood: median"
        f" {statistics.median(during) * 1000:7.1f} ms,"
        f" p90 {percentile(during, 0.9) * 1000:7.1f} ms,"
        f" max {max(during) * 1000:7.1f} ms (max / idle median"
        f" {max(during) / statistics.median(base):.1f}x); flood still running at the last probe:"
        f" {'yes' if flooding else 'NO'}; flood frames {total:,}, stored {kept:,} (the store done"
        f" {catch_up:.1f} s after the run);"
        f" database {size[0] / 1e6:.1f} MB + WAL {size[1] / 1e6:.1f} MB"
    )
    return during


async def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine()}")
    print(
        f"flood: {args.lines:,} tool lines of {args.pad} bytes unthrottled; {args.probes} probes;"
        f" target <= {TARGET_S:g} s"
    )
    worst = 0.0
    for name, limits in (("capped", {}), ("uncapped", UNCAPPED)):
        worst = max(worst, *await one_pass(name, limits, args))
    ok = worst <= TARGET_S
    print(
        f"target: worst first frame during the flood {worst:.3f} s <= {TARGET_S:g} s"
        f" -> {'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Print the passes and the verdict; exit 1 when the target is missed."""
    parser = argparse.ArgumentParser(prog="python -m bench flood")
    parser.add_argument("--lines", type=int, default=600_000)
    parser.add_argument("--pad", type=int, default=1000, help="bytes of each tool result")
    parser.add_argument("--probes", type=int, default=10)
    args, _ = parser.parse_known_args(argv or [])
    if "--quick" in (argv or []):
        args.lines, args.probes = 100_000, 3
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
