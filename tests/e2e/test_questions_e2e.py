"""AskUserQuestion end to end with the real CLI: an ask_user frame, answered over HTTP."""

from __future__ import annotations

import secrets

import pytest

from tests.e2e.approvals import ON, asking, card_result, of_type
from tests.e2e.conftest import E2E, is_run_result
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
