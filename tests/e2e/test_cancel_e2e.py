"""Cancel by interrupt, end to end with the real CLI: the turn ends, the session resumes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.e2e.conftest import E2E, frames_until, is_run_result
from tests.polling import until
from tests.procfs import marked_processes
from tests.stub.anthropic import Turn, text, tool

pytestmark = pytest.mark.e2e

# What the CLI writes into its own transcript when it honours the interrupt; a CLI stopped by
# SIGTERM writes nothing of the kind (README "Cancel, timeout, shutdown").
INTERRUPTED = "[Request interrupted by user for tool use]"
SLEEPER = """\
import sys, time, urllib.request

urllib.request.urlopen(sys.argv[1])
time.sleep(120)
"""


async def _cancel_mid_bash(e2e: E2E) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run whose Bash command (allowed by the operator's ``Bash(python3:*)``) is held, then
    cancelled while it runs; its state and live frames, once its last process is gone."""
    (e2e.workspace / "sleeper.py").write_text(SLEEPER)
    ready = e2e.stub.signal_url("sleeper")
    e2e.stub.main.turns = [tool("Bash", command=f"python3 sleeper.py {ready}", description="Hold")]
    status, started = await e2e.post_run("Hold on.")
    assert status == 202
    run_id = started["run_id"]
    async with e2e.ws(run_id) as ws:
        frames = await frames_until(ws, lambda f: f["type"] == "tool_call")
        await e2e.stub.wait_for_signal("sleeper")
        status, _ = await e2e.post(f"/v1/runs/{run_id}/cancel")
        assert status == 202
        frames = await frames_until(ws, is_run_result, frames)
    await e2e.settled(run_id)
    assert marked_processes(run_id) == []
    status, state = await e2e.get(f"/v1/runs/{run_id}")
    assert status == 200
    return state, frames


async def _resume(e2e: E2E, session_id: str) -> tuple[dict[str, Any], str]:
    """Resume ``session_id``; the run's result and what the model was shown of the history."""
    status, body = await e2e.post_run("Go on.", resume=session_id, wait=True)
    assert status == 200
    return body, e2e.stub.requests_of()[-1].history_text()


async def test_a_cancel_mid_bash_interrupts_the_turn_and_its_session_resumes(e2e: E2E) -> None:
    state, frames = await _cancel_mid_bash(e2e)
    assert state["status"] == "cancelled"
    result = frames[-1]["result"]
    assert result["status"] == "cancelled"
    session_id = result["session_id"]
    assert session_id == state["session_id"]
    # Nothing of the process reached a client after the closing frames: a replay of the run
    # (its last process gone by now) is exactly what was sent live.
    async with e2e.ws(state["run_id"]) as ws:
        assert await frames_until(ws, is_run_result) == frames

    # The closing frames went out before the CLI exited: the result has no exit code, the
    # run's record gets the CLI's own once it is gone (it exited by itself, no signal).
    assert result["exit_code"] is None
    run = e2e.run_of(state["run_id"])
    await until(lambda: run.record.exit_code is not None, what="the record's exit code")
    assert run.exit_status is not None
    status, state = await e2e.get(f"/v1/runs/{state['run_id']}")
    assert (status, state["exit_code"]) == (200, run.exit_status.exit_code)

    resumed, history = await _resume(e2e, session_id)
    assert resumed["status"] == "completed"
    assert resumed["session_id"] == session_id
    # The CLI itself ended the turn and closed its transcript: the model sees the interrupt.
    assert INTERRUPTED in history


@pytest.mark.parametrize("daemon_policy", [{"interrupt_grace_s": 0}])
async def test_without_an_interrupt_grace_a_cancel_is_a_sigterm_that_leaves_no_trace(
    e2e: E2E,
) -> None:
    """The contrast that shows the test above can fail: SIGTERM at once, as before cancel sent
    an interrupt."""
    state, frames = await _cancel_mid_bash(e2e)
    assert state["status"] == frames[-1]["result"]["status"] == "cancelled"
    _, history = await _resume(e2e, state["session_id"])
    assert INTERRUPTED not in history


async def test_a_run_with_a_background_bash_keeps_stdin_open_until_its_last_result(
    e2e: E2E,
) -> None:
    """The first result comes while the background command runs; stdin stays open through the
    CLI's own turn about the finished task (so a cancel can still interrupt it), and closes at
    that turn's result."""
    ticker = "python3 -c 'import time\nfor i in range(2):\n    print(\"tick\", i); time.sleep(0.5)'"
    held = asyncio.Event()
    e2e.stub.main.turns = [
        tool("Bash", command=ticker, description="Tick", run_in_background=True),
        text("The ticker runs in the background."),
        Turn(text("The ticker finished.").blocks, hold=held),
    ]
    run = await e2e.started("Run the ticker in the background.")
    await e2e.stub.wait_for_requests(3)  # the turn after the task's notification
    assert run.child is not None
    assert run.translator.last_result is not None  # the first result came before it
    assert run.child.stdin_open
    held.set()
    await e2e.settled(run.run_id)
    assert not run.child.stdin_open
    assert run.result is not None
    assert run.result.status == "completed"
    assert run.result.result == "The ticker finished."


@pytest.mark.parametrize("daemon_policy", [{"interrupt_grace_s": 60}])
async def test_a_cancel_with_only_a_background_task_left_stops_it_and_ends_without_the_grace(
    e2e: E2E,
) -> None:
    """The turn's result is out and only a background Bash runs: no turn is left for an
    interrupt to end, so the cancel stops the task and ends the run at once rather than after
    ``interrupt_grace_s`` (a minute here, longer than this test waits)."""
    (e2e.workspace / "sleeper.py").write_text(SLEEPER)
    ready = e2e.stub.signal_url("sleeper")
    command = f"python3 sleeper.py {ready}"
    e2e.stub.main.turns = [
        tool("Bash", command=command, description="Hold", run_in_background=True),
        text("It runs in the background."),
    ]
    run = await e2e.started("Run it in the background.")
    run_id = run.run_id
    async with e2e.ws(run_id) as ws:
        await e2e.stub.wait_for_signal("sleeper")
        await until(lambda: run.translator.channel.idle, what="the turn's result")
        assert run.translator.channel.background  # the command still runs
        status, _ = await e2e.post(f"/v1/runs/{run_id}/cancel")
        assert status == 202
        async with asyncio.timeout(30):
            frames = await frames_until(ws, is_run_result)
    assert frames[-1]["result"]["status"] == "cancelled"
    await e2e.settled(run_id)
    assert marked_processes(run_id) == []
    resumed, _ = await _resume(e2e, frames[-1]["result"]["session_id"])
    assert resumed["status"] == "completed"
