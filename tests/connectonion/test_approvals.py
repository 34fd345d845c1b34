"""Approvals through ConnectOnion: ``claude_code`` puts a run's permission request to the agent's
own IO (ConnectOnion's ``approval_needed`` event and ``APPROVAL_RESPONSE`` answer), and denies it
when there is nobody to ask."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from codelegate.daemon.clients.tool_approve import NO_ONE_HERE
from tests.connectonion.conftest import Loop, call, say, tool_messages
from tests.e2e.approvals import ON
from tests.e2e.conftest import E2E
from tests.golden.test_control_channel import ASK, QUESTION
from tests.stub.anthropic import text, tool

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
    assert await asyncio.wait_for(turn, 60) == "completed"


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
        assert await asyncio.wait_for(turn, 60) == "completed"
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
        assert await asyncio.wait_for(turn, 60) == "completed"
    history = loop.e2e.stub.requests_of()[1].history_text()
    assert f'Your questions have been answered: "{QUESTION}"="Blue"' in history


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
