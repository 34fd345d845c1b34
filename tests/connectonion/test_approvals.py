"""Approvals through ConnectOnion: ``claude_code`` puts a run's permission request to the agent's
own IO (ConnectOnion's ``approval_needed`` event and ``APPROVAL_RESPONSE`` answer), and denies it
when there is nobody to ask."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from codelegate.daemon.clients.tool_approve import NO_ANSWER, NO_ONE_HERE
from codelegate.daemon.clients.tool_follow import DAEMON_ONLY
from tests.connectonion.conftest import Loop, call, say, tool_messages
from tests.connectonion.test_agent_loop import result_of
from tests.e2e.approvals import ON
from tests.e2e.conftest import E2E, frames_until, is_run_result
from tests.golden.test_control_channel import ASK, QUESTION
from tests.stub.anthropic import Turn, text, tool

pytestmark = pytest.mark.e2e

OUTSIDE = "touch ../outside.txt"  # a path outside the workspace: asked in every mode


def is_approval(event: dict[str, Any]) -> bool:
    return event.get("type") == "approval_needed"


def envelope_of(request: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(tool_messages(request)[-1]["content"])
    return result


@contextlib.asynccontextmanager
async def asking(loop: Loop) -> AsyncIterator[asyncio.Future[str]]:
    """The agent's turn on its thread; a test that fails while the tool waits for an answer
    still lets the thread go (an answer naming no request), so that the loop can shut down."""
    turn = asyncio.ensure_future(loop.ask("Touch it."))
    try:
        yield turn
    finally:
        if not turn.done():
            loop.io.answer_request({"type": "APPROVAL_RESPONSE", "approved": False})
            loop.io.answer_request({"type": "ASK_USER_RESPONSE", "answer": ""})
            await asyncio.wait_for(asyncio.shield(turn), 60)


async def ended(turn: asyncio.Future[str]) -> str:
    """The turn's answer; shielded, so that a turn that does not end fails the test and
    ``asking`` still lets its thread go (a cancelled wait would leave the thread blocked)."""
    return await asyncio.wait_for(asyncio.shield(turn), 60)


def script(loop: Loop) -> None:
    loop.e2e.stub.main.turns = [tool("Bash", command=OUTSIDE, description="Touch"), text("Ok.")]
    loop.model.replies = [
        call("claude_code", prompt="Touch ../outside.txt.", cwd=""),
        lambda request: say(envelope_of(request)["status"]),
    ]


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_request_reaches_the_agents_io_and_its_answer_the_cli(loop: Loop) -> None:
    script(loop)
    async with asking(loop) as turn:
        event = await loop.until(is_approval)
        await _approve_once(loop, event, turn)
    assert (loop.e2e.workspace.parent / "outside.txt").exists()
    run_id = event["id"].rpartition(":")[0]
    _, listed = await loop.e2e.get(f"/v1/runs/{run_id}/approvals")
    assert [(r["decision"], r["by"]) for r in listed["approvals"]] == [("allow", "client")]
    # approval_resolved is the daemon's: not an Agent IO event.
    assert not any(e.get("type") == "approval_resolved" for e in loop.events())


async def _approve_once(loop: Loop, event: dict[str, Any], turn: asyncio.Future[str]) -> None:
    # A Work Room card, as ConnectOnion's own claude_code asks: allowlisted texts, the ids that
    # tie it to the invocation, and not the raw command.
    assert event["tool"] == "claude_code"
    assert event["arguments"] == {
        "action": "Run a workspace command",
        "scope": "Outside this Work Room",
        "reason": "Claude Code requested approval to continue",
    }
    assert (event["invocationId"], event["parentToolCallId"]) == ("claude_code:call_1", "call_1")
    assert event["providerApproval"]["scopeClassification"] == "elevated"
    assert OUTSIDE not in json.dumps(event)
    waiting = [
        e
        for e in loop.events()
        if e.get("type") == "provider_invocation" and e.get("status") == "awaiting_approval"
    ]
    assert [e["currentSummary"] for e in waiting] == ["Waiting for your decision"]
    # As the Host hands O Chat's answer to the agent: it must name the request it answers.
    assert loop.io.answer_request({"type": "APPROVAL_RESPONSE", "request_id": "stale"}) == "stale"
    delivered = loop.io.answer_request(
        {"type": "APPROVAL_RESPONSE", "request_id": event["id"], "approved": True, "scope": "once"}
    )
    assert delivered is None
    assert await ended(turn) == "completed"


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_deny_from_the_io_carries_its_feedback_to_claude(loop: Loop) -> None:
    feedback = f"Leave the parent alone, {secrets.token_hex(6)}."
    script(loop)
    async with asking(loop) as turn:
        event = await loop.until(is_approval)
        answer = {
            "type": "APPROVAL_RESPONSE",
            "request_id": event["id"],
            "approved": False,
            "mode": "reject_explain",
            "feedback": feedback,
        }
        assert loop.io.answer_request(answer) is None
        assert await ended(turn) == "completed"
    assert not (loop.e2e.workspace.parent / "outside.txt").exists()
    assert feedback in loop.e2e.stub.requests_of()[1].history_text()


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_without_an_io_the_tool_denies_and_claude_is_told_why(loop: Loop) -> None:
    loop.agent.io = None
    script(loop)
    assert await asyncio.wait_for(loop.ask("Touch it."), 60) == "completed"
    assert not (loop.e2e.workspace.parent / "outside.txt").exists()
    assert NO_ONE_HERE in loop.e2e.stub.requests_of()[1].history_text()


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_question_goes_to_the_io_as_ask_user_and_its_answer_to_claude(loop: Loop) -> None:
    loop.e2e.stub.main.turns = [tool("AskUserQuestion", **ASK), text("Blue it is.")]
    loop.model.replies = [
        call("claude_code", prompt="Ask which colour.", cwd=""),
        lambda request: say(envelope_of(request)["status"]),
    ]
    async with asking(loop) as turn:
        event = await loop.until(lambda e: e.get("type") == "ask_user")
        assert (event["question"], event["options"], event["multi_select"]) == (
            QUESTION,
            ["Red", "Blue"],
            False,
        )
        answer = {"type": "ASK_USER_RESPONSE", "request_id": event["id"], "answer": "Blue"}
        assert loop.io.answer_request(answer) is None
        assert await ended(turn) == "completed"
    history = loop.e2e.stub.requests_of()[1].history_text()
    assert f'Your questions have been answered: "{QUESTION}"="Blue"' in history


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_question_the_person_answers_with_nothing_is_declined_at_once(loop: Loop) -> None:
    # An answer that answers no question is refused by the daemon: the tool declines instead,
    # so the run goes on now rather than at the request's timeout.
    loop.e2e.stub.main.turns = [tool("AskUserQuestion", **ASK), text("I chose Red.")]
    loop.model.replies = [
        call("claude_code", prompt="Ask which colour.", cwd=""),
        lambda request: say(envelope_of(request)["status"]),
    ]
    async with asking(loop) as turn:
        event = await loop.until(lambda e: e.get("type") == "ask_user")
        answer = {"type": "ASK_USER_RESPONSE", "request_id": event["id"], "answer": ""}
        assert loop.io.answer_request(answer) is None
        assert await ended(turn) == "completed"
    assert NO_ANSWER in loop.e2e.stub.requests_of()[1].history_text()


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_with_nobody_to_ask_the_operators_approve_rule_decides(e2e: E2E) -> None:
    from codelegate.daemon.clients.tool import delegate

    assert e2e.handle is not None
    e2e.stub.main.turns = [tool("Bash", command=OUTSIDE, description="Touch"), text("Ok.")]
    asked: list[dict[str, Any]] = []

    def approve(frame: dict[str, Any]) -> bool:
        asked.append(frame)
        return frame["tool"] == "Bash"

    result = await asyncio.to_thread(
        delegate,
        "Touch ../outside.txt.",
        cwd=str(e2e.workspace),
        path=e2e.handle.socket_path or "",
        approve=approve,
    )
    assert result["status"] == "completed"
    assert [f["arguments"]["command"] for f in asked] == [OUTSIDE]
    assert (e2e.workspace.parent / "outside.txt").exists()


TWICE = "touch ../twice.txt"  # the second request of a run that asks two


def live_relays(loop: Loop) -> list[int]:
    """The seqs of the daemon frames the tool relayed on the live lane, in the order sent (a
    frame has a seq; the lease's commit sends the same entries again, as persisted trace)."""
    io = loop.io
    return [
        e["seq"] for e in io._msgs_from_agent if "seq" in e and not io.is_persisted_trace_event(e)
    ]


async def run_frames(loop: Loop, run_id: str) -> list[dict[str, Any]]:
    """Every frame of the run, from the daemon, to its run_result."""
    async with loop.e2e.ws(run_id) as ws:
        return await frames_until(ws, is_run_result)


def relayable(frames: list[dict[str, Any]]) -> list[int]:
    """The seqs of the frames the tool relays as they are (not its requests, not the daemon's)."""
    kept = DAEMON_ONLY | {"approval_needed", "ask_user"}
    return [f["seq"] for f in frames if f["type"] not in kept]


def late_answer(loop: Loop, event: dict[str, Any], *, approved: bool) -> str | None:
    """The card of ``event`` answered now, as the Host hands it on: None if the IO took it."""
    answer = {"type": "APPROVAL_RESPONSE", "request_id": event["id"], "approved": approved}
    refused: str | None = loop.io.answer_request(answer)
    return refused


async def decisions(loop: Loop, run_id: str) -> list[tuple[str, str]]:
    _, listed = await loop.e2e.get(f"/v1/runs/{run_id}/approvals")
    return [(r["decision"], r["by"]) for r in listed["approvals"]]


@pytest.mark.parametrize("daemon_approvals", [{**ON, "timeout_s": 1}])
async def test_the_daemons_approval_timeout_ends_the_wait_and_the_agent_gets_the_runs_result(
    loop: Loop,
) -> None:
    script(loop)
    async with asking(loop) as turn:
        event = await loop.until(is_approval)
        # Nobody answers: the daemon's timeout denies it, and the run goes on to its end.
        assert await ended(turn) == "completed"
    run_id = event["id"].rpartition(":")[0]
    assert await decisions(loop, run_id) == [("deny", "timeout")]
    assert not (loop.e2e.workspace.parent / "outside.txt").exists()
    assert envelope_of(loop.model.requests[-1])["result"] == "Ok."
    # The frames after the request were still relayed, each once, in order.
    assert live_relays(loop) == relayable(await run_frames(loop, run_id))
    # The tool closed the request on the IO: an answer the card sends now is refused as stale.
    assert late_answer(loop, event, approved=True) == "stale"


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_an_answer_another_client_posts_ends_the_wait_and_the_run_goes_on(
    loop: Loop,
) -> None:
    script(loop)
    async with asking(loop) as turn:
        event = await loop.until(is_approval)
        run_id = event["id"].rpartition(":")[0]
        # Another client (a terminal, the API) answers before the person at the card does.
        status, answered = await loop.e2e.post(
            f"/v1/runs/{run_id}/approvals/{event['id']}", {"approved": True, "scope": "once"}
        )
        assert status == 200, answered
        assert await ended(turn) == "completed"
    assert (loop.e2e.workspace.parent / "outside.txt").exists()
    assert await decisions(loop, run_id) == [("allow", "client")]
    assert live_relays(loop) == relayable(await run_frames(loop, run_id))
    assert late_answer(loop, event, approved=False) == "stale"


@pytest.mark.parametrize("daemon_approvals", [{**ON, "timeout_s": 1}])
async def test_a_late_answer_to_a_request_is_not_taken_for_the_answer_to_the_next(
    loop: Loop,
) -> None:
    hold = asyncio.Event()
    loop.e2e.stub.main.turns = [
        tool("Bash", command=OUTSIDE, description="Touch"),
        Turn(tool("Bash", command=TWICE, description="Touch again").blocks, hold=hold),
        text("Ok."),
    ]
    loop.model.replies = [
        call("claude_code", prompt="Touch two files outside.", cwd=""),
        lambda request: say(envelope_of(request)["status"]),
    ]
    async with asking(loop) as turn:
        first = await loop.until(is_approval)
        # The daemon's timeout denies the first; the tool goes on relaying (the denied card's
        # result) while Claude's next turn is held, so nothing asks the second yet.
        denied = await loop.until(result_of("Bash"))
        assert denied["status"] != "completed"
        # The card of the first request is answered now, late: it must not approve the second.
        assert late_answer(loop, first, approved=True) == "stale"
        hold.set()
        second = await loop.until(lambda e: is_approval(e) and e["id"] != first["id"])
        # Nobody answers the second either: the daemon's timeout denies it too.
        assert await ended(turn) == "completed"
    run_id = first["id"].rpartition(":")[0]
    assert second["id"].startswith(f"{run_id}:")
    assert await decisions(loop, run_id) == [("deny", "timeout"), ("deny", "timeout")]
    assert not (loop.e2e.workspace.parent / "twice.txt").exists()


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_stop_while_the_tool_waits_for_an_answer_still_cancels_the_run(
    loop: Loop,
) -> None:
    script(loop)
    async with asking(loop) as turn:
        event = await loop.until(is_approval)
        accepted = loop.io.request_provider_interrupt("claude_code:call_1")
        assert accepted.accepted, accepted.reason
        assert await ended(turn) == "cancelled"
    run_id = event["id"].rpartition(":")[0]
    assert await decisions(loop, run_id) == [("deny", "cancel")]
    assert not (loop.e2e.workspace.parent / "outside.txt").exists()


class Clock:
    """The tool's clock (its ``time``), moved on when the test says: the call's timeout passes
    exactly then, however fast the machine is."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skipped


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_the_calls_timeout_passing_while_the_tool_waits_stops_the_run(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    from codelegate.daemon.clients import tool as tool_module

    clock = Clock()
    monkeypatch.setattr(tool_module, "time", clock)
    script(loop)
    async with asking(loop) as turn:
        event = await loop.until(is_approval)
        clock.skipped = 601.0  # past the call's 600 s, with the request still open
        assert await ended(turn) == "timeout"
    run_id = event["id"].rpartition(":")[0]
    assert await decisions(loop, run_id) == [("deny", "cancel")]
    assert envelope_of(loop.model.requests[-1])["session_id"]
