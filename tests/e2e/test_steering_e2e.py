"""Steering end to end with the real CLI: a message written mid-run reaches the model, and the
run is not over before the CLI has read it."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from codelegate.daemon.record import Run
from codelegate.daemon.serving.state import CONFIG
from tests.e2e.conftest import E2E, frames_until, is_run_result
from tests.polling import until
from tests.stub.anthropic import Turn, text, tool

pytestmark = pytest.mark.e2e

# Says it runs, then waits for the test to create the file it names (no sleep in the test).
WAITER = """\
import os, sys, time, urllib.request

urllib.request.urlopen(sys.argv[1])
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
"""
MID_TURN = "The user sent a new message while you were working"


async def test_a_message_written_while_a_tool_runs_joins_that_tools_result(e2e: E2E) -> None:
    (e2e.workspace / "waiter.py").write_text(WAITER)
    ready = e2e.stub.signal_url("waiter")
    words = f"Also mention {secrets.token_hex(6)}."
    e2e.stub.main.turns = [
        tool("Bash", command=f"python3 waiter.py {ready} go", description="Wait"),
        text("Done, and noted."),
    ]
    status, started = await e2e.post_run("Wait for it.")
    assert status == 202
    run_id = started["run_id"]
    async with e2e.ws(run_id) as ws:
        await e2e.stub.wait_for_signal("waiter")
        status, accepted = await e2e.post(f"/v1/runs/{run_id}/input", {"text": words})
        assert (status, accepted) == (202, {"run_id": run_id, "accepted": True})
        (e2e.workspace / "go").touch()
        frames = await frames_until(ws, is_run_result)
    assert [f["type"] for f in frames].count("run_result") == 1
    assert frames[-1]["result"]["status"] == "completed"
    requests = e2e.stub.requests_of()
    assert len(requests) == 2  # the message joined the turn: no model call of its own
    history = requests[1].history_text()
    assert MID_TURN in history
    assert words in history
    await e2e.settled(run_id)
    status, late = await e2e.post(f"/v1/runs/{run_id}/input", {"text": "more"})
    assert (status, late["error"]["code"]) == (409, "run_finished")


async def test_a_message_written_while_the_model_answers_keeps_stdin_open_for_its_own_turn(
    e2e: E2E,
) -> None:
    first, second = asyncio.Event(), asyncio.Event()
    words = f"Then say {secrets.token_hex(6)}."
    e2e.stub.main.turns = [
        Turn(text("First answer.").blocks, hold=first),
        Turn(text("Second answer.").blocks, hold=second),
    ]
    run = await e2e.started("Answer.")
    run_id = run.run_id
    await e2e.stub.wait_for_requests(1)
    status, _ = await e2e.post(f"/v1/runs/{run_id}/input", {"text": words})
    assert status == 202
    first.set()
    request = await e2e.stub.wait_for_requests(2)  # the message's own turn, after a result
    assert words in request.history_text()
    assert run.translator.last_result is not None  # the first turn's result came
    assert run.child is not None
    assert run.child.stdin_open  # ... and did not end the run: the message was unread then
    second.set()
    async with asyncio.timeout(60):
        await run.done.wait()
    assert run.result is not None
    assert (run.result.status, run.result.result) == ("completed", "Second answer.")
    assert not run.child.stdin_open


async def test_two_messages_written_while_the_model_answers_are_one_turn_and_the_run_ends(
    e2e: E2E,
) -> None:
    first = asyncio.Event()
    words = [f"Then say {secrets.token_hex(6)}." for _ in range(2)]
    e2e.stub.main.turns = [Turn(text("First answer.").blocks, hold=first), text("Both noted.")]
    run = await e2e.started("Answer.")
    await e2e.stub.wait_for_requests(1)
    for message in words:
        status, _ = await e2e.post(f"/v1/runs/{run.run_id}/input", {"text": message})
        assert status == 202
    first.set()
    # The CLI takes both in as one message with one echo: the run must not wait for a second.
    async with asyncio.timeout(60):
        await run.done.wait()
    assert run.result is not None
    assert (run.result.status, run.result.result) == ("completed", "Both noted.")
    requests = e2e.stub.requests_of()
    assert len(requests) == 2
    assert "\n".join(words) in requests[1].history_text()


async def _held_in_its_first_answer(e2e: E2E) -> tuple[Run, asyncio.Event, asyncio.Event]:
    """A run whose model holds its first answer (the CLI takes nothing in meanwhile), then a
    second, each until its event is set."""
    first, second = asyncio.Event(), asyncio.Event()
    e2e.stub.main.turns = [
        Turn(text("First answer.").blocks, hold=first),
        Turn(text("Taken in.").blocks, hold=second),
    ]
    run = await e2e.started("Answer.")
    await e2e.stub.wait_for_requests(1)
    return run, first, second


async def _completes_with_every_accepted_message(
    e2e: E2E, run: Run, accepted: list[str], refused: str
) -> None:
    async with asyncio.timeout(120):
        await run.done.wait()
    assert run.result is not None
    assert run.result.status == "completed"
    history = e2e.stub.requests_of()[-1].history_text()
    assert [words in history for words in accepted] == [True] * len(accepted)
    assert all(refused not in r.history_text() for r in e2e.stub.requests_of())


async def test_input_past_the_pending_cap_is_refused_and_every_message_below_it_reaches_the_model(
    e2e: E2E,
) -> None:
    assert e2e.handle is not None
    cap = e2e.handle.app[CONFIG].limits.pending_inputs
    run, first, second = await _held_in_its_first_answer(e2e)
    run_id = run.run_id
    accepted = [f"Mention {secrets.token_hex(8)}." for _ in range(cap)]
    for words in accepted:
        status, answer = await e2e.post(f"/v1/runs/{run_id}/input", {"text": words})
        assert (status, answer) == (202, {"run_id": run_id, "accepted": True})
    refused = f"Mention {secrets.token_hex(8)}."
    status, answer = await e2e.post(f"/v1/runs/{run_id}/input", {"text": refused})
    assert status == 429, answer
    assert answer["error"]["code"] == "too_many_inputs"
    first.set()
    await e2e.stub.wait_for_requests(2)  # the queued messages' turn
    # What the CLI has taken in no longer counts: the cap bounds what waits, not a run's total.
    await until(lambda: run.translator.channel.unread < cap, what="the CLI took input in")
    later = f"Mention {secrets.token_hex(8)}."
    status, answer = await e2e.post(f"/v1/runs/{run_id}/input", {"text": later})
    assert status == 202, answer
    second.set()
    await _completes_with_every_accepted_message(e2e, run, [*accepted, later], refused)


def _message(size: int) -> str:
    """A fresh steering text of ``size`` UTF-8 bytes, half as many characters: two bytes each."""
    words = f"Mention {secrets.token_hex(8)} "
    return words + "é" * ((size - len(words)) // 2)


STEERING_BYTES = 2048


@pytest.mark.parametrize(
    "daemon_limits", [{"task_bytes": 1024, "pending_input_bytes": STEERING_BYTES}]
)
async def test_input_past_the_pending_bytes_is_refused_whatever_the_number_of_messages(
    e2e: E2E,
) -> None:
    assert e2e.handle is not None
    assert e2e.handle.app[CONFIG].limits.pending_inputs > 3  # the count cap is not what refuses
    run, first, second = await _held_in_its_first_answer(e2e)
    run_id = run.run_id
    # 900 bytes of 450 characters each: a count of characters would take a third in.
    accepted = [_message(900), _message(900)]
    for words in accepted:
        status, answer = await e2e.post(f"/v1/runs/{run_id}/input", {"text": words})
        assert (status, answer) == (202, {"run_id": run_id, "accepted": True})
    refused = _message(900)
    status, answer = await e2e.post(f"/v1/runs/{run_id}/input", {"text": refused})
    assert status == 429, answer
    assert answer["error"]["code"] == "too_many_input_bytes"
    assert f"at most {STEERING_BYTES} bytes" in answer["error"]["message"]
    small = _message(200)  # what still fits beside the waiting 1800 bytes is taken
    status, answer = await e2e.post(f"/v1/runs/{run_id}/input", {"text": small})
    assert status == 202, answer
    accepted.append(small)
    first.set()
    await e2e.stub.wait_for_requests(2)  # the queued messages' turn
    # What the CLI has taken in no longer counts: the bound is on what waits, in bytes.
    await until(lambda: run.translator.channel.unread_bytes == 0, what="the CLI took input in")
    later = _message(1000)
    status, answer = await e2e.post(f"/v1/runs/{run_id}/input", {"text": later})
    assert status == 202, answer
    second.set()
    await _completes_with_every_accepted_message(e2e, run, [*accepted, later], refused)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"text": "  "}, 400, "empty_task"),
        ({"words": "x"}, 400, "bad_request"),
        ({"text": 3}, 400, "bad_request"),
    ],
)
async def test_an_input_body_that_is_no_message_is_refused_and_an_unknown_run_is_404(
    e2e: E2E, body: object, status: int, code: str
) -> None:
    got, answer = await e2e.post("/v1/runs/nope/input", body)
    assert (got, answer["error"]["code"]) == (status, code)
    got, answer = await e2e.post("/v1/runs/nope/input", {"text": "hi"})
    assert (got, answer["error"]["code"]) == (404, "run_not_found")
