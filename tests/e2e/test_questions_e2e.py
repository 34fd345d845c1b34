"""AskUserQuestion end to end with the real CLI: an ask_user frame, answered over HTTP."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest

from tests.e2e.approvals import ON, Asking, asking, card_result, of_type
from tests.e2e.conftest import E2E, is_run_result, next_frame
from tests.golden.test_control_channel import ASK, QUESTION
from tests.stub.anthropic import text, tool

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_question_becomes_an_ask_user_frame_and_its_answer_reaches_the_model(
    e2e: E2E,
) -> None:
    a = await asking(e2e, [tool("AskUserQuestion", **ASK), text("Blue it is.")])
    ask = a.request
    assert ask["type"] == "ask_user"
    assert (ask["question"], ask["options"], ask["multi_select"]) == (
        QUESTION,
        ["Red", "Blue"],
        False,
    )
    assert ask["questions"] == ASK["questions"]
    # A question is not a permission: the approvals answer route does not know it.
    status, wrong = await e2e.post(a.path(), {"approved": True})
    assert (status, wrong["error"]["code"]) == (404, "approval_not_found")

    status, answer = await e2e.post(a.path("questions"), {"answer": "Blue"})
    assert (status, answer["decision"]) == (200, "allow")
    frames = await a.until(is_run_result)
    await a.ws.close()
    result = card_result(frames, ask["tool_id"])
    assert result["status"] == "completed"
    assert [r["by"] for r in of_type(frames, "approval_resolved")] == ["client"]
    history = e2e.stub.requests_of()[1].history_text()
    assert f'Your questions have been answered: "{QUESTION}"="Blue"' in history
    _, listed = await e2e.get(f"/v1/runs/{a.run_id}/approvals")
    assert [(r["kind"], r["decision"]) for r in listed["approvals"]] == [("question", "allow")]


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_declined_question_tells_the_model_why_as_an_error(e2e: E2E) -> None:
    why = f"Decide yourself, {secrets.token_hex(6)}."
    a = await asking(e2e, [tool("AskUserQuestion", **ASK), text("I chose Red.")])
    status, answer = await e2e.post(a.path("questions"), {"decline": True, "message": why})
    assert (status, answer["decision"]) == (200, "deny")
    frames = await a.until(is_run_result)
    await a.ws.close()
    assert card_result(frames, a.request["tool_id"])["status"] == "failed"
    assert why in e2e.stub.requests_of()[1].history_text()
    assert frames[-1]["result"]["status"] == "completed"


async def control_reply(a: Asking) -> dict[str, Any]:
    """The next WebSocket message that is not a frame (an ack or an error); frames go to a."""
    reply = await next_frame(a.ws)
    while "seq" in reply:
        a.frames.append(reply)
        reply = await next_frame(a.ws)
    return reply


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_an_answer_that_answers_no_question_asked_is_refused_and_the_question_stays_open(
    e2e: E2E,
) -> None:
    a = await asking(e2e, [tool("AskUserQuestion", **ASK), text("Blue it is.")])
    typo = f"Which colour should the button be ({secrets.token_hex(4)})?"
    for body in ({}, {"answers": {}}, {"answer": ""}, {"answers": {typo: "Blue"}}):
        status, refused = await e2e.post(a.path("questions"), body)
        assert (status, refused["error"]["code"]) == (400, "bad_request"), body
        assert typo not in json.dumps(refused)
    for message in ({}, {"answer": " "}, {"answers": {typo: "Blue"}}):
        await a.ws.send_json(
            {"type": "ASK_USER_RESPONSE", "request_id": a.request["request_id"], **message}
        )
        assert (await control_reply(a))["error"]["code"] == "bad_request", message
    # Nothing was used up: the question still waits, and the right answer still wins.
    status, state = await e2e.get(f"/v1/runs/{a.run_id}")
    assert (status, state["pending_approvals"]) == (200, [a.request["request_id"]])
    status, answer = await e2e.post(a.path("questions"), {"answers": {QUESTION: "Blue"}})
    assert (status, answer["decision"]) == (200, "allow")
    frames = await a.until(is_run_result)
    await a.ws.close()
    assert card_result(frames, a.request["tool_id"])["status"] == "completed"
    assert len(of_type(frames, "approval_resolved")) == 1
    history = e2e.stub.requests_of()[1].history_text()
    assert f'Your questions have been answered: "{QUESTION}"="Blue"' in history
    _, listed = await e2e.get(f"/v1/runs/{a.run_id}/approvals")
    assert [(r["kind"], r["decision"]) for r in listed["approvals"]] == [("question", "allow")]
