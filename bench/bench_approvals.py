"""From a permission prompt to a person and back through the daemon (bench/RESULTS.md §7).

A stand-in CLI (``bench/approval_cli.py``) asks ``can_use_tool`` N times, one request at a
time, as the real CLI does. Two latencies per request:

- **ask**: from the CLI writing its ``can_use_tool`` line (``sent_at`` in the tool input) to
  the ``approval_needed`` frame at a WebSocket client;
- **answer**: from the client sending ``POST /v1/runs/{id}/approvals/{request_id}`` to the CLI
  reading the daemon's ``control_response`` on its stdin.

Baseline, in the same run: the same stand-in driven by a plain asyncio pipe reader and writer
(decode each line, write the answer line back): the pipes' own cost on this machine. Target:
daemon p99 <= 5 ms for each, printed beside the baseline. ``python -m bench approvals``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

from bench.harness import BASE, ROOT, ServedDaemon, machine, on_uvloop, percentile

APPROVAL_CLI = str(ROOT / "bench" / "approval_cli.py")
TARGET_MS = 5.0
WARMUP = 5  # the first requests also pay for the run's start


def _read_times(path: Path) -> list[float] | None:
    """The stand-in's read times, once it wrote them all (it does when stdin closes)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return [float(t) for t in text.split()] if text.endswith("\n") or not text else None


def _ms(values: list[float]) -> list[float]:
    return [v * 1000 for v in values[WARMUP:]]


async def baseline(n: int, timings: Path) -> tuple[list[float], list[float]]:
    """The stand-in over plain pipes: (ask, answer) seconds per request."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        APPROVAL_CLI,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    prompt = {"type": "user", "message": {"role": "user", "content": f"{timings} {n}"}}
    proc.stdin.write(b'{"type":"control_request","request_id":"i","request":{}}\n')
    proc.stdin.write(json.dumps(prompt).encode() + b"\n")
    asks: list[float] = []
    writes: list[float] = []
    async for raw in proc.stdout:
        now = time.time()
        line = json.loads(raw)
        if line.get("type") == "control_request":
            asks.append(now - line["request"]["input"]["sent_at"])
            answer = {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": line["request_id"]},
            }
            writes.append(time.time())
            proc.stdin.write(json.dumps(answer).encode() + b"\n")
        elif line.get("type") == "result":
            proc.stdin.close()
    await proc.wait()
    reads = _read_times(timings)
    assert reads is not None
    return asks, [r - w for r, w in zip(reads, writes, strict=True)]


async def through_daemon(d: ServedDaemon, n: int) -> tuple[list[float], list[float]]:
    """The stand-in as the daemon's CLI, a WebSocket client answering: (ask, answer) seconds."""
    assert d.http is not None
    timings = d.tmp / f"timings-{uuid.uuid4().hex}"
    run_id = await d.start_run(f"{timings} {n}", cwd=str(d.workspace))
    asks: list[float] = []
    posts: list[float] = []
    async with d.http.ws_connect(f"{BASE}/v1/ws?run={run_id}") as ws:
        async for message in ws:
            now = time.time()
            frame = json.loads(message.data)
            if frame.get("type") == "approval_needed":
                asks.append(now - frame["arguments"]["sent_at"])
                url = f"{BASE}/v1/runs/{run_id}/approvals/{frame['request_id']}"
                posts.append(time.time())
                async with d.http.post(url, json={"approved": True}) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"answer refused: {await resp.text()}")
            elif frame.get("type") == "run_result":
                break
    reads = None
    for _ in range(10_000):  # the stand-in writes its timings once stdin closed
        reads = _read_times(timings)
        if reads is not None and len(reads) == n:
            break
        await asyncio.sleep(0.01)
    assert reads is not None
    return asks, [r - p for r, p in zip(reads, posts, strict=True)]


def _row(name: str, values: list[float]) -> str:
    return (
        f"  {name:32} p50 {statistics.median(values):6.2f} ms  p99 {percentile(values, 0.99):6.2f}"
        f" ms  max {max(values):6.2f} ms"
    )


async def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine()}")
    print(f"{args.n} requests a run, {args.rounds} rounds; target p99 <= {TARGET_MS:g} ms")
    base_ask: list[float] = []
    base_answer: list[float] = []
    ask: list[float] = []
    answer: list[float] = []
    approvals = {"enabled": True, "ask": ["Bash"], "allow_session": []}
    async with ServedDaemon(claude={"path": APPROVAL_CLI}, approvals=approvals) as d:
        for _ in range(args.rounds):  # interleaved: both see the same machine
            a, b = await baseline(args.n, d.tmp / f"base-{uuid.uuid4().hex}")
            base_ask += _ms(a)
            base_answer += _ms(b)
            a, b = await through_daemon(d, args.n)
            ask += _ms(a)
            answer += _ms(b)
    print(_row("baseline: pipe line read", base_ask))
    print(_row("can_use_tool -> approval_needed", ask))
    print(_row("baseline: pipe line written", base_answer))
    print(_row("answer POST -> line read by CLI", answer))
    verdicts = [
        _verdict("ask", ask, base_ask),
        _verdict("answer", answer, base_answer),
    ]
    return 0 if all(verdicts) else 1


def _verdict(name: str, values: list[float], floor: list[float]) -> bool:
    p99 = percentile(values, 0.99)
    met = p99 <= TARGET_MS
    verdict = "met" if met else "MISSED"
    baseline_p99 = percentile(floor, 0.99)
    print(f"target {name}: p99 {p99:.2f} ms <= {TARGET_MS:g} ms -> {verdict}", end="")
    print(f" (baseline p99 {baseline_p99:.2f} ms)")
    return met


def main(argv: list[str] | None = None) -> int:
    """Print the table and the verdicts; exit 1 when a target is missed."""
    options = argv or []
    quick = "--quick" in options  # 40 requests, one round
    parser = argparse.ArgumentParser(prog="python -m bench approvals")
    parser.add_argument("--n", type=int, default=40 if quick else 200, help="requests a run")
    parser.add_argument("--rounds", type=int, default=1 if quick else 3)
    return on_uvloop(run(parser.parse_known_args(options)[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
