"""Approvals end to end with the real CLI: a permission prompt becomes an approval card, and a
person's answer (HTTP or WebSocket), the timeout, a cancel, policy or a restart ends it."""

from __future__ import annotations

import secrets

import pytest

from codelegate.daemon.serving.state import CONFIG
from codelegate.policy.approvals import NOT_ASKABLE_MESSAGE
from tests.e2e.approvals import ON, asking, card_result, of_type
from tests.e2e.conftest import E2E, frames_until, is_run_result, next_frame
from tests.stub.anthropic import Turn, text, tool
from tests.translator.test_approvals import SENSITIVE_CARD

pytestmark = pytest.mark.e2e

APPROVAL_FRAMES = ("approval_needed", "approval_resolved", "ask_user")


def write(e2e: E2E, name: str = "n.txt", content: str = "x\n") -> Turn:
    return tool("Write", file_path=e2e.path(name), content=content)


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_an_approved_write_runs_after_the_card_and_its_answer_is_listed(e2e: E2E) -> None:
    a = await asking(e2e, [write(e2e), text("Done.")])
    need = a.request
    assert need["type"] == "approval_needed"
    assert need["request_id"] == need["id"] == f"{a.run_id}:{need['seq']}"
    assert need["tool"] == "Write"
    assert need["expires_at"] == pytest.approx(need["ts"] + 120.0)
    card = [f for f in a.frames if f["type"] == "tool_call"][-1]
    assert need["tool_id"] == card["tool_id"]
    assert need["providerApproval"] == {
        "action": "Make workspace file changes",
        "scope": "This Work Room only",
        "reason": "Apply the requested workspace file changes",
        "scopeClassification": "workroom",
        "allowOnce": True,
        "allowSession": True,
        "files": ["n.txt"],
    }
    _, state = await e2e.get(f"/v1/runs/{a.run_id}")
    assert state["status"] == "running"
    assert state["pending_approvals"] == [need["request_id"]]
    assert not (e2e.workspace / "n.txt").exists()  # nothing ran before the answer

    status, answer = await e2e.post(a.path(), {"approved": True, "scope": "once"})
    assert status == 200, answer
    assert (answer["decision"], answer["scope"]) == ("allow", "once")
    frames = await a.until(is_run_result)
    await a.ws.close()

    (resolved,) = of_type(frames, "approval_resolved")
    assert (resolved["request_id"], resolved["decision"], resolved["scope"], resolved["by"]) == (
        need["request_id"],
        "allow",
        "once",
        "client",
    )
    assert card_result(frames, need["tool_id"])["status"] == "completed"
    assert frames[-1]["result"]["status"] == "completed"
    assert (e2e.workspace / "n.txt").read_text() == "x\n"
    status, listed = await e2e.get(f"/v1/runs/{a.run_id}/approvals")
    assert status == 200
    (row,) = listed["approvals"]
    assert row["request_id"] == need["request_id"]
    assert (row["kind"], row["tool"], row["decision"], row["by"]) == (
        "permission",
        "Write",
        "allow",
        "client",
    )
    assert row["answered_at"] >= row["asked_at"]


@pytest.mark.parametrize("mode", ["safe", "accept_edits"])
@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_write_to_the_workspaces_git_config_is_asked_as_elevated_and_named(
    e2e: E2E, mode: str
) -> None:
    # The CLI's "sensitive file" prompt (a .git/config runs commands on the next read-only
    # `git status`): not a routine Work Room change that O Chat offers to allow for the session.
    hook = f"core.fsmonitor = {secrets.token_hex(6)}"
    a = await asking(e2e, [write(e2e, ".git/config", hook), text("Done.")], mode=mode)
    need = a.request
    assert need["providerApproval"] == SENSITIVE_CARD
    assert need["description"] == ".git/config"
    status, refused = await e2e.post(a.path(), {"approved": True, "scope": "session"})
    assert (status, refused["error"]["code"]) == (403, "approval_scope_not_allowed")
    status, answer = await e2e.post(a.path(), {"approved": False})
    assert (status, answer["decision"]) == (200, "deny")
    frames = await a.until(is_run_result)
    await a.ws.close()
    assert card_result(frames, need["tool_id"])["status"] == "failed"
    assert not (e2e.workspace / ".git").exists()


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_denied_write_does_not_run_and_the_feedback_reaches_the_model(e2e: E2E) -> None:
    feedback = f"Not that file, use {secrets.token_hex(8)}.txt"
    a = await asking(e2e, [write(e2e), text("Understood.")])
    status, answer = await e2e.post(a.path(), {"approved": False, "feedback": feedback})
    assert status == 200, answer
    assert answer["decision"] == "deny"
    frames = await a.until(is_run_result)
    await a.ws.close()
    result = card_result(frames, a.request["tool_id"])
    assert (result["status"], result["error_type"]) == ("failed", "permission_denied")
    assert of_type(frames, "approval_resolved")[0]["by"] == "client"
    assert frames[-1]["result"]["status"] == "completed"  # the turn went on
    assert not (e2e.workspace / "n.txt").exists()
    assert feedback in e2e.stub.requests_of()[1].history_text()


@pytest.mark.parametrize("daemon_approvals", [{**ON, "timeout_s": 1}])
async def test_an_unanswered_request_is_denied_at_its_timeout_with_words_the_model_can_use(
    e2e: E2E,
) -> None:
    a = await asking(e2e, [write(e2e), text("I will wait for approval.")])
    assert a.request["expires_at"] == pytest.approx(a.request["ts"] + 1.0)
    frames = await a.until(is_run_result)
    await a.ws.close()
    (resolved,) = of_type(frames, "approval_resolved")
    assert (resolved["decision"], resolved["by"]) == ("deny", "timeout")
    assert "No one answered within 1 s" in e2e.stub.requests_of()[1].history_text()
    assert not (e2e.workspace / "n.txt").exists()
    status, late = await e2e.post(a.path(), {"approved": True})
    assert (status, late["error"]["code"]) == (409, "approval_resolved")


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_cancel_while_a_request_waits_resolves_it_first_and_the_session_resumes(
    e2e: E2E,
) -> None:
    a = await asking(e2e, [write(e2e)])
    status, _ = await e2e.post(f"/v1/runs/{a.run_id}/cancel")
    assert status == 202
    frames = await a.until(is_run_result)
    await a.ws.close()
    kinds = [f["type"] for f in frames]
    resolved = of_type(frames, "approval_resolved")
    assert [r["by"] for r in resolved] == ["cancel"]
    assert kinds.index("approval_resolved") < kinds.index("run_result")
    result = frames[-1]["result"]
    assert result["status"] == "cancelled"
    await e2e.settled(a.run_id)
    status, late = await e2e.post(a.path(), {"approved": True})
    assert (status, late["error"]["code"]) == (409, "approval_resolved")
    assert not (e2e.workspace / "n.txt").exists()
    e2e.stub.main.turns = [text("Resumed.")]
    status, body = await e2e.post_run("Go on.", resume=result["session_id"], wait=True)
    assert (status, body["status"]) == (200, "completed")


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_session_scope_is_refused_for_bash_which_stays_pending_until_allowed_once(
    e2e: E2E,
) -> None:
    a = await asking(e2e, [tool("Bash", command="touch made.txt", description="Make")])
    assert a.request["tool"] == "Bash"
    assert a.request["providerApproval"]["allowSession"] is False
    status, refused = await e2e.post(a.path(), {"approved": True, "scope": "session"})
    assert (status, refused["error"]["code"]) == (403, "approval_scope_not_allowed")
    _, state = await e2e.get(f"/v1/runs/{a.run_id}")
    assert state["pending_approvals"] == [a.request["request_id"]]
    status, answer = await e2e.post(a.path(), {"approved": True})
    assert (status, answer["scope"]) == (200, "once")
    frames = await a.until(is_run_result)
    await a.ws.close()
    assert [r["scope"] for r in of_type(frames, "approval_resolved")] == ["once"]
    assert (e2e.workspace / "made.txt").exists()


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_session_approval_for_write_spares_the_second_write_its_question(
    e2e: E2E,
) -> None:
    a = await asking(e2e, [write(e2e, content="one\n"), write(e2e, content="two\n"), text("Ok")])
    status, answer = await e2e.post(a.path(), {"approved": True, "scope": "session"})
    assert (status, answer["scope"]) == (200, "session")
    frames = await a.until(is_run_result)
    await a.ws.close()
    assert len(of_type(frames, "approval_needed")) == 1
    assert [r["scope"] for r in of_type(frames, "approval_resolved")] == ["session"]
    results = of_type(frames, "tool_result")
    assert [r["status"] for r in results] == ["completed", "completed"]
    assert (e2e.workspace / "n.txt").read_text() == "two\n"


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_an_answer_over_the_websocket_is_acknowledged_and_carried_out(e2e: E2E) -> None:
    a = await asking(e2e, [write(e2e), text("Done.")])
    request_id = a.request["request_id"]
    await a.ws.send_json({"type": "APPROVAL_RESPONSE", "request_id": request_id, "approved": True})
    ack = await next_frame(a.ws)
    while "seq" in ack:  # frames may come before the ack
        a.frames.append(ack)
        ack = await next_frame(a.ws)
    assert ack == {
        "type": "approval_ack",
        "run": a.run_id,
        "run_id": a.run_id,
        "request_id": request_id,
        "decision": "allow",
        "scope": "once",
    }
    frames = await a.until(is_run_result)
    # The same answer again: the request is over (frames_until skips messages like this one).
    await a.ws.send_json({"type": "APPROVAL_RESPONSE", "request_id": request_id, "approved": True})
    again = await next_frame(a.ws)
    await a.ws.close()
    assert again["error"]["code"] == "approval_resolved"
    assert of_type(frames, "approval_resolved")[0]["by"] == "client"
    assert (e2e.workspace / "n.txt").exists()


@pytest.mark.parametrize("daemon_approvals", [{**ON, "ask": ["Write"]}])
async def test_a_tool_outside_ask_is_denied_by_policy_at_once_and_listed(e2e: E2E) -> None:
    e2e.stub.main.turns = [tool("Bash", command="touch made.txt", description="Make"), text("Ok")]
    status, body = await e2e.post_run("Do it.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed")
    (run_id,) = [r["run_id"] for r in (await e2e.get("/v1/runs"))[1]["runs"]]
    async with e2e.ws(run_id) as ws:
        frames = await frames_until(ws, is_run_result)
    assert of_type(frames, "approval_needed") == []
    (resolved,) = of_type(frames, "approval_resolved")
    assert (resolved["decision"], resolved["by"]) == ("deny", "policy")
    assert card_result(frames, resolved["tool_id"])["error_type"] == "permission_denied"
    assert not (e2e.workspace / "made.txt").exists()
    _, listed = await e2e.get(f"/v1/runs/{run_id}/approvals")
    assert [(r["decision"], r["by"]) for r in listed["approvals"]] == [("deny", "policy")]
    # The row says what the model was told, as the card's result does.
    (row,) = listed["approvals"]
    assert row["message"] == NOT_ASKABLE_MESSAGE
    assert NOT_ASKABLE_MESSAGE in card_result(frames, resolved["tool_id"])["result"]


async def test_with_approvals_off_a_prompt_is_denied_as_before_and_no_approval_frame_goes_out(
    e2e: E2E,
) -> None:
    e2e.stub.main.turns = [write(e2e), text("Ok")]
    status, body = await e2e.post_run("Do it.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed")
    (run_id,) = [r["run_id"] for r in (await e2e.get("/v1/runs"))[1]["runs"]]
    argv = list(e2e.run_of(run_id).plan.argv)
    assert argv[argv.index("--permission-prompts") + 1] == "none"
    assert "--permission-prompt-tool" not in argv
    async with e2e.ws(run_id) as ws:
        frames = await frames_until(ws, is_run_result)
    assert [f for f in frames if f["type"] in APPROVAL_FRAMES] == []
    (result,) = of_type(frames, "tool_result")
    assert result["error_type"] == "permission_denied"
    _, listed = await e2e.get(f"/v1/runs/{run_id}/approvals")
    assert listed["approvals"] == []


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_restart_with_a_request_waiting_ends_it_interrupted_in_frames_and_list(
    e2e: E2E,
) -> None:
    a = await asking(e2e, [write(e2e)])
    await a.ws.close()
    assert e2e.handle is not None
    config = e2e.handle.app[CONFIG]
    await e2e.stop()
    await e2e.start(config)
    async with e2e.ws(a.run_id) as ws:
        frames = await frames_until(ws, is_run_result)
    (resolved,) = of_type(frames, "approval_resolved")
    assert (resolved["request_id"], resolved["by"]) == (a.request["request_id"], "interrupted")
    _, listed = await e2e.get(f"/v1/runs/{a.run_id}/approvals")
    assert [(r["decision"], r["by"]) for r in listed["approvals"]] == [("deny", "interrupted")]
    status, late = await e2e.post(a.path(), {"approved": True})
    assert (status, late["error"]["code"]) == (409, "approval_resolved")
