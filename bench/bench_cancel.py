"""Time from a cancel request to the last process of the run gone (bench/RESULTS.md §4).

For three kinds of run — a CLI that stops on SIGTERM, one that ignores SIGTERM, and one whose
tool left a double-forked setsid grandchild that ignores SIGTERM — the run is started on a
served daemon, ``POST /v1/runs/{id}/cancel`` is sent, and /proc is polled (every 2 ms) until no
process carries the run's marker. Also timed: until the run's state says it ended.

Baseline, in the same run: the same fake CLI started directly in its own session and killed
with SIGKILL to its group — the floor of "gone" on this machine (kernel teardown + polling).
The fakes never answer the interrupt a cancel sends first, so they are served with
``interrupt_grace_s = 0`` (straight to SIGTERM). Target: <= cancel grace + 1 s.

The interrupt path (README "Cancel, timeout, shutdown"): the real pinned CLI against the
loopback API stub, cancelled while a held Bash command runs; timed from the cancel to the run's
state ended (its closing frames sent, the session resumable) and to its last process gone.
Baseline in the same run: the same cancel with ``interrupt_grace_s = 0`` (SIGTERM at once).
Target: <= 0.5 s to the result. Run with ``.venv/bin/python -m bench cancel``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
import uuid

from bench.harness import FAKE_CLAUDE, ServedDaemon, machine
from tests.conftest import pinned_claude
from tests.procfs import marked_processes
from tests.stub.anthropic import Stub, serve_stub, tool
from tests.stub.claude import API_KEY

SCENARIOS = {
    "stops on SIGTERM": "fake: hang after=init",
    "ignores SIGTERM": "fake: ignore_term",
    "setsid grandchild": "fake: grandchild then=hang",
}
POLL_S = 0.002
INTERRUPT_TARGET_S = 0.5
SLEEPER = "import sys, time, urllib.request\nurllib.request.urlopen(sys.argv[1])\ntime.sleep(120)\n"


async def _gone(run_id: str, limit_s: float = 60.0) -> float:
    """Seconds until no process carries the run's marker (polled)."""
    start = time.monotonic()
    while marked_processes(run_id):
        if time.monotonic() - start > limit_s:
            raise RuntimeError(f"processes of {run_id} still alive after {limit_s} s")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - start


async def _until_live(run_id: str, want: int) -> None:
    for _ in range(5000):
        if len(marked_processes(run_id)) >= want:
            return
        await asyncio.sleep(0.005)
    raise RuntimeError("the run never started its processes")


async def baseline(scenario: str) -> float:
    """SIGKILL to the group of a directly started fake CLI; seconds until its marked processes
    (the group; an escaped grandchild is not in it and is killed by marker too) are gone."""
    run_id = "bench-" + uuid.uuid4().hex
    env = {
        "PATH": os.environ.get("PATH", ""),
        "CODELEGATE_RUN_ID": run_id,
        "FAKE_CLAUDE_SCENARIO": scenario.removeprefix("fake: "),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        FAKE_CLAUDE,
        "-p",
        "--session-id",
        str(uuid.uuid4()),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    await _until_live(run_id, 2 if "grandchild" in scenario else 1)
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in marked_processes(run_id):
        os.kill(pid, signal.SIGKILL)
    await proc.wait()
    await _gone(run_id)
    return time.monotonic() - start


async def cancel_once(d: ServedDaemon, task: str) -> tuple[float, float]:
    """(seconds to the last process gone, seconds to the run's state ended)."""
    run_id = await d.start_run(task)
    await _until_live(run_id, 2 if "grandchild" in task else 1)
    for _ in range(1000):  # the card is open: the CLI is really into its run
        if (await d.get(f"/v1/runs/{run_id}"))["last_seq"] >= 1:
            break
        await asyncio.sleep(0.005)
    start = time.monotonic()
    await d.post(f"/v1/runs/{run_id}/cancel")
    gone = await _gone(run_id)
    for _ in range(30_000):
        if (await d.get(f"/v1/runs/{run_id}"))["status"] != "running":
            break
        await asyncio.sleep(POLL_S)
    ended = time.monotonic() - start
    return gone, ended


async def _ended(d: ServedDaemon, run_id: str, start: float) -> tuple[float, dict[str, object]]:
    """Seconds from ``start`` until the run's state says it ended, and that state."""
    for _ in range(30_000):
        state = await d.get(f"/v1/runs/{run_id}")
        if state["status"] != "running":
            return time.monotonic() - start, state
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"{run_id} did not end")


async def interrupt_once(d: ServedDaemon, stub: Stub) -> tuple[float, float]:
    """A real CLI's run cancelled mid-Bash: (seconds to its state ended, to its last process
    gone); checks the run ended cancelled with its session id."""
    ready = stub.signal_url("sleeper")
    stub.main.turns = [tool("Bash", command=f"python3 sleeper.py {ready}", description="Hold")]
    run_id = await d.start_run("Hold on.", cwd=str(d.workspace), mode="accept_edits")
    await asyncio.wait_for(stub.wait_for_signal("sleeper"), 60)
    stub.signals.discard("sleeper")
    start = time.monotonic()
    await d.post(f"/v1/runs/{run_id}/cancel")
    ended, state = await _ended(d, run_id, start)
    result = state["result"]
    assert isinstance(result, dict)
    if state["status"] != "cancelled" or not result.get("session_id"):
        raise RuntimeError(f"not a resumable cancelled run: {state}")
    await _gone(run_id)
    return ended, time.monotonic() - start


async def interrupt_path(args: argparse.Namespace) -> bool:
    """The interrupt path against the baseline; True when the target is met."""
    claude = pinned_claude()
    if claude is None:
        print("  interrupt path: skipped, the pinned CLI is not installed (make test)")
        return True
    stub = Stub()
    ok = True
    async with serve_stub(stub):
        env = {"ANTHROPIC_BASE_URL": stub.url, "ANTHROPIC_API_KEY": API_KEY}
        for grace in (args.interrupt_grace, 0.0):
            policy = {
                "cancel_grace_s": args.grace,
                "interrupt_grace_s": grace,
                "allowed_tools": ["Bash(python3:*)"],
            }
            async with ServedDaemon(env=env, claude={"path": claude}, policy=policy) as d:
                (d.workspace / "sleeper.py").write_text(SLEEPER)
                results = [await interrupt_once(d, stub) for _ in range(args.rounds)]
            ended = [e for e, _ in results]
            gone = [g for _, g in results]
            name = f"interrupt grace {grace:g} s" if grace else "baseline: SIGTERM at once"
            print(
                f"  real CLI, {name:26} result: median {statistics.median(ended):6.3f} s,"
                f" max {max(ended):6.3f} s; last process gone: median"
                f" {statistics.median(gone):6.3f} s"
            )
            if grace:
                ok = max(ended) <= INTERRUPT_TARGET_S
                print(
                    f"  target: cancel -> resumable result, worst {max(ended):.3f} s"
                    f" <= {INTERRUPT_TARGET_S:g} s -> {'met' if ok else 'MISSED'}"
                )
    return ok


async def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine()}")
    target = args.grace + 1.0
    print(f"cancel grace {args.grace:g} s; target <= {target:g} s; {args.rounds} rounds each")
    worst = 0.0
    policy = {"cancel_grace_s": args.grace, "interrupt_grace_s": 0.0}
    async with ServedDaemon(policy=policy) as d:
        for name, task in SCENARIOS.items():
            floor = statistics.median([await baseline(task) for _ in range(args.rounds)])
            results = [await cancel_once(d, task) for _ in range(args.rounds)]
            gone = [g for g, _ in results]
            ended = [e for _, e in results]
            worst = max(worst, *gone)
            print(
                f"  {name:18} last process gone: median {statistics.median(gone):6.3f} s,"
                f" max {max(gone):6.3f} s; state ended: median {statistics.median(ended):6.3f} s;"
                f" baseline SIGKILL floor {floor * 1000:6.1f} ms;"
                f" max / target = {max(gone) / target:.2f}"
            )
    ok = worst <= target
    print(f"target: worst {worst:.3f} s <= {target:g} s -> {'met' if ok else 'MISSED'}")
    ok = await interrupt_path(args) and ok
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Print the table and the verdict; exit 1 when the target is missed."""
    parser = argparse.ArgumentParser(prog="python -m bench cancel")
    parser.add_argument("--grace", type=float, default=2.0, help="[policy] cancel_grace_s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--interrupt-grace", type=float, default=2.0, help="[policy] interrupt_grace_s"
    )
    args, _ = parser.parse_known_args(argv or [])
    if "--quick" in (argv or []):
        args.rounds, args.grace = 1, 1.0
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
