"""The daemon's memory (bench/RESULTS.md §3): idle RSS, and the cost of a live run and of a
subscriber, measured as RSS deltas of the served daemon process.

Baseline, in the same run: a bare Python process that imports the daemon's libraries (aiohttp,
msgspec, structlog, uvloop, sqlite3) and idles — what any daemon built on them costs before
doing anything. Target: idle daemon RSS <= 60 MB. Run with ``.venv/bin/python -m bench memory``.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys

from bench.bench_pipeline import _start_sinks
from bench.harness import ServedDaemon, machine, rss_bytes

IDLE_TARGET_MB = 60.0
MB = 1024 * 1024

_BARE = (
    "import aiohttp, msgspec, structlog, uvloop, sqlite3, sys;"
    " print('ready', flush=True); sys.stdin.read()"
)


async def _settle(d: ServedDaemon) -> int:
    """RSS once the daemon has answered a request and had a moment with nothing to do."""
    await d.get("/healthz")
    await asyncio.sleep(0.5)  # a benchmark, not a test: let freed memory settle before reading
    return rss_bytes(d.pid)


async def _wait_live(d: ServedDaemon, run_ids: list[str]) -> None:
    for run_id in run_ids:
        for _ in range(1000):
            state = await d.get(f"/v1/runs/{run_id}")
            if state["last_seq"] >= 1:
                break
            await asyncio.sleep(0.01)


async def _wait_finished(d: ServedDaemon, run_ids: list[str]) -> None:
    for run_id in run_ids:
        for _ in range(2000):
            if (await d.get(f"/v1/runs/{run_id}"))["status"] != "running":
                break
            await asyncio.sleep(0.01)


def _bare_rss() -> int:
    proc = subprocess.Popen(
        [sys.executable, "-c", _BARE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    proc.stdout.readline()
    rss = rss_bytes(proc.pid)
    proc.stdin.close()
    proc.wait()
    return rss


async def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine()}")
    bare = _bare_rss()
    async with ServedDaemon(policy={"cancel_grace_s": 0.2}) as d:
        cold = await _settle(d)
        # One ordinary run first: what an idle daemon weighs once it has done some work.
        warm_id = await d.start_run("fake: normal")
        await _wait_live(d, [warm_id])
        await _wait_finished(d, [warm_id])
        idle = await _settle(d)

        run_ids = [await d.start_run("fake: ignore_term") for _ in range(args.runs)]
        await _wait_live(d, run_ids)
        with_runs = await _settle(d)
        for run_id in run_ids:
            await d.post(f"/v1/runs/{run_id}/cancel")
        await _wait_finished(d, run_ids)
        after_runs = await _settle(d)

        sinks = _start_sinks(d.socket, args.subscribers)
        assert sinks.stdout is not None
        await asyncio.get_running_loop().run_in_executor(None, sinks.stdout.readline)
        subscribers = (await d.get("/healthz"))["subscribers"]
        with_subs = await _settle(d)
        sinks.terminate()
        sinks.wait()

    per_run = (with_runs - idle) / args.runs
    per_sub = (with_subs - after_runs) / args.subscribers
    print(f"  bare Python + the daemon's libraries (baseline): {bare / MB:6.1f} MB")
    print(f"  daemon idle, just started:                       {cold / MB:6.1f} MB")
    print(f"  daemon idle, after one run:                      {idle / MB:6.1f} MB")
    print(f"    idle / baseline = {idle / bare:.2f}x (target: idle <= {IDLE_TARGET_MB:g} MB)")
    print(
        f"  {args.runs} live runs (one open card each): +{(with_runs - idle) / MB:.1f} MB"
        f" = {per_run / 1024:.1f} KiB per live run (the CLI processes not counted)"
    )
    print(
        f"  {subscribers} idle WebSocket subscribers: +{(with_subs - after_runs) / MB:.1f} MB"
        f" = {per_sub / 1024:.1f} KiB per subscriber"
    )
    ok = idle / MB <= IDLE_TARGET_MB
    verdict = "met" if ok else "MISSED"
    print(f"target: idle RSS {idle / MB:.1f} MB <= {IDLE_TARGET_MB:g} MB -> {verdict}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Print the table and the verdict; exit 1 when the idle target is missed."""
    parser = argparse.ArgumentParser(prog="python -m bench memory")
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--subscribers", type=int, default=500)
    args, _ = parser.parse_known_args(argv or [])
    if "--quick" in (argv or []):
        args.runs, args.subscribers = 4, 100
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
