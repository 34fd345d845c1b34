"""Permission prompts (can_use_tool) through the translator: frames out, answer lines as data.

The request shapes are the pinned CLI's (docs/cli-control-channel.md §2, §5, asserted against the
real CLI in tests/golden/test_control_channel.py).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import msgspec
import pytest

from codelegate.policy.approvals import ApprovalsConfig
from codelegate.policy.errors import PolicyError
from codelegate.translator import Limits, Outcome, Redactor, Translator
from codelegate.translator.frames import Frame, decode_frame, encode_frame
from codelegate.translator.state import SAID_CHARS
from tests.golden.test_control_channel import ASK, QUESTION, sensitive_write
from tests.translator.helpers import (
    CWD,
    EXITED,
    as_data,
    assistant,
    context,
    init_line,
    line,
    tool_result,
    tool_use,
)

ON = ApprovalsConfig(enabled=True, timeout_s=60)


def can_use_tool(
    tool: str, use_id: str, request_id: str = "req-1", **fields: Any
) -> tuple[bytes, dict[str, Any]]:
    """A can_use_tool line of the pinned CLI's shape, and the raw input it asks about."""
    raw = fields.pop("input", {})
    request = {
        "subtype": "can_use_tool",
        "tool_name": tool,
        "display_name": tool,
        "input": raw,
        "tool_use_id": use_id,
        **fields,
    }
    return line(type="control_request", request_id=request_id, request=request), raw


def cancel(request_id: str = "req-1") -> bytes:
    return line(type="control_cancel_request", request_id=request_id)


def started(approvals: ApprovalsConfig | None = ON, **ctx: Any) -> Translator:
    translator = Translator(context(**ctx), Limits(), Redactor(), approvals, **({}))
    translator.start(1000.0)
    translator.receive_data(init_line(), 1000.0)
    return translator


def asked(translator: Translator, tool: str, use_id: str, **fields: Any) -> list[dict[str, Any]]:
    """The tool_use line, then its can_use_tool: the frames of the latter."""
    translator.receive_data(assistant(tool_use(use_id, tool, **fields.get("input", {}))), 1001.0)
    data, _ = can_use_tool(tool, use_id, **fields)
    return as_data(translator.receive_data(data, 1002.0))


def answer(out: tuple[list[Frame], bytes | None] | None) -> tuple[list[dict[str, Any]], Any]:
    assert out is not None
    frames, raw = out
    return as_data(frames), json.loads(raw) if raw is not None else None


def write_input(name: str = "n.txt") -> dict[str, Any]:
    return {"file_path": f"{CWD}/{name}", "content": "x\n"}


# --- approvals off: fail closed, as before --------------------------------------------------------


def test_with_approvals_off_a_prompt_is_denied_at_once_and_makes_no_frame() -> None:
    translator = started(approvals=None)
    frames = asked(translator, "Write", "t1", input=write_input())
    assert frames == []
    (deny,) = translator.approvals.take_control()
    assert json.loads(deny)["response"] == {
        "subtype": "success",
        "request_id": "req-1",
        "response": {
            "behavior": "deny",
            "message": json.loads(deny)["response"]["response"]["message"],
        },
    }
    assert "approvals are off" in json.loads(deny)["response"]["response"]["message"]
    assert translator.approvals.take_asked() == []
    assert translator.approvals.pending == {}
    # The host's deny has no system/permission_denied line: its tool_result closes the card.
    closing = as_data(translator.receive_data(tool_result("t1", "denied", is_error=True), 1003.0))
    (result,) = [f for f in closing if f["type"] == "tool_result"]
    assert (result["status"], result["error_type"]) == ("failed", "permission_denied")
    final = translator.close(EXITED, 1004.0)[-1]
    assert [d.tool_id for d in final.result.permission_denials] == ["claude:t1"]  # type: ignore[union-attr]


def test_an_approvals_config_that_is_not_enabled_is_off() -> None:
    translator = started(approvals=ApprovalsConfig(enabled=False))
    assert asked(translator, "Write", "t1", input=write_input()) == []
    assert len(translator.approvals.take_control()) == 1


# --- asked, then answered -------------------------------------------------------------------------


def test_a_file_change_in_the_work_room_is_asked_in_o_chats_shape() -> None:
    translator = started()
    frames = asked(translator, "Write", "t1", input=write_input(), description="n.txt")
    waiting, needed = frames
    assert waiting["type"] == "provider_invocation"
    assert (waiting["status"], waiting["currentSummary"]) == (
        "awaiting_approval",
        "Waiting for your decision",
    )
    assert needed["type"] == "approval_needed"
    assert needed["id"] == needed["request_id"] == f"run-1:{needed['seq']}"
    assert needed["tool"] == "Write"
    assert needed["arguments"] == write_input()
    assert needed["description"] == "n.txt"
    assert needed["tool_id"] == needed["activityId"] == "claude:t1"
    assert needed["expires_at"] == 1002.0 + 60
    assert needed["invocationId"] == "claude_code:call_1"
    card = needed["providerApproval"]
    # Each text from O Chat's own list (DESIGN "Approvals"; anything else hides the card).
    assert card["action"] == "Make workspace file changes"
    assert card["reason"] == "Apply the requested workspace file changes"
    assert (card["scopeClassification"], card["scope"]) == ("workroom", "This Work Room only")
    assert card["allowOnce"] is card["allowSession"] is True
    assert card["files"] == ["n.txt"]
    assert translator.approvals.take_control() == []
    (pending,) = translator.approvals.take_asked()
    assert translator.approvals.take_asked() == []
    assert pending.request_id == needed["id"]
    assert (pending.kind, pending.tool, pending.tool_id) == ("permission", "Write", "claude:t1")
    assert pending.input == write_input()
    assert translator.approvals.pending == {pending.request_id: pending}


def test_allow_once_sends_the_input_exactly_as_asked_and_the_card_runs() -> None:
    translator = started()
    frames = asked(translator, "Write", "t1", input=write_input())
    rid = frames[-1]["id"]
    resolved, sent = answer(
        translator.approvals.resolve(rid, decision="allow", by="client", now=1003.0)
    )
    assert sent == {
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": "req-1",
            "response": {"behavior": "allow", "updatedInput": write_input()},
        },
    }
    done, running = resolved
    assert done == {
        **{k: done[k] for k in ("id", "run_id", "seq", "ts", "provider", "child_session_id")},
        "type": "approval_resolved",
        "invocationId": "claude_code:call_1",
        "parentToolCallId": "call_1",
        "request_id": rid,
        "decision": "allow",
        "scope": "once",
        "by": "client",
        "tool": "Write",
        "tool_id": "claude:t1",
    }
    assert (running["status"], running["currentSummary"]) == (
        "running",
        "Working in the selected workspace",
    )
    assert running["stateRevision"] > frames[0]["stateRevision"]
    assert translator.approvals.pending == {}
    closing = as_data(translator.receive_data(tool_result("t1", "written"), 1004.0))
    assert [f["status"] for f in closing if f["type"] == "tool_result"] == ["completed"]


def test_allow_for_the_session_adds_only_a_session_rule_for_the_tool() -> None:
    translator = started()
    rid = asked(translator, "Edit", "t1", input={"file_path": "a.py", "old_string": "a"})[-1]["id"]
    resolved, sent = answer(
        translator.approvals.resolve(
            rid, decision="allow", scope="session", by="client", now=1003.0
        )
    )
    # Edit rules cover every file tool; this one only inside the run's workspace.
    assert sent["response"]["response"]["updatedPermissions"] == [
        {
            "type": "addRules",
            "rules": [{"toolName": "Edit", "ruleContent": f"/{CWD}/**"}],
            "behavior": "allow",
            "destination": "session",
        }
    ]
    assert resolved[0]["scope"] == "session"


def test_session_scope_for_bash_is_refused_and_the_request_stays_pending() -> None:
    translator = started()
    touch = {"command": "touch made.txt", "description": "Make"}
    frames = asked(translator, "Bash", "t1", input=touch, blocked_path=f"{CWD}/made.txt")
    needed = frames[-1]
    assert needed["providerApproval"]["action"] == "Run a workspace command"
    assert needed["providerApproval"]["reason"] == "Claude Code requested approval to continue"
    assert (
        needed["providerApproval"]["allowOnce"],
        needed["providerApproval"]["allowSession"],
    ) == (
        True,
        False,
    )
    assert "files" not in needed["providerApproval"]
    with pytest.raises(PolicyError) as caught:
        translator.approvals.resolve(
            needed["id"], decision="allow", scope="session", by="client", now=1.0
        )
    assert caught.value.code == "approval_scope_not_allowed"
    assert needed["id"] in translator.approvals.pending
    _, sent = answer(
        translator.approvals.resolve(needed["id"], decision="allow", by="client", now=1003.0)
    )
    assert "updatedPermissions" not in sent["response"]["response"]


def test_a_deny_reaches_the_model_and_closes_the_card_permission_denied() -> None:
    translator = started()
    rid = asked(translator, "Write", "t1", input=write_input())[-1]["id"]
    feedback = f"Use the other file ({secrets.token_hex(4)})"
    resolved, sent = answer(
        translator.approvals.resolve(
            rid, decision="deny", by="client", message=feedback, now=1003.0
        )
    )
    assert sent["response"]["response"] == {"behavior": "deny", "message": feedback}
    assert [(f["type"], f.get("decision")) for f in resolved] == [
        ("approval_resolved", "deny"),
        ("provider_invocation", None),
    ]
    closing = as_data(translator.receive_data(tool_result("t1", feedback, is_error=True), 1004.0))
    (card,) = [f for f in closing if f["type"] == "tool_result"]
    assert (card["status"], card["error_type"], card["error"]) == (
        "failed",
        "permission_denied",
        feedback,
    )


def test_a_deny_without_a_message_still_sends_one() -> None:
    translator = started()
    rid = asked(translator, "Write", "t1", input=write_input())[-1]["id"]
    _, sent = answer(
        translator.approvals.resolve(rid, decision="deny", by="client", message=" ", now=1.0)
    )
    assert sent["response"]["response"] == {"behavior": "deny", "message": "The user denied this"}


def test_a_timeout_denies_with_a_message_the_model_can_act_on() -> None:
    translator = started()
    rid = asked(translator, "Write", "t1", input=write_input())[-1]["id"]
    resolved, sent = answer(
        translator.approvals.resolve(rid, decision="deny", by="timeout", now=1062.0)
    )
    message = sent["response"]["response"]["message"]
    assert message.startswith("No one answered within 60 s, so this was not run.")
    assert resolved[0]["by"] == "timeout"
    assert resolved[0]["ts"] == 1062.0


def test_the_first_answer_wins_and_an_unknown_request_is_none() -> None:
    translator = started()
    rid = asked(translator, "Write", "t1", input=write_input())[-1]["id"]
    assert translator.approvals.resolve(rid, decision="allow", by="client", now=1.0) is not None
    assert translator.approvals.resolve(rid, decision="deny", by="client", now=2.0) is None
    assert translator.approvals.resolve(rid, decision="deny", by="timeout", now=3.0) is None
    assert translator.approvals.resolve("run-1:999", decision="deny", by="client", now=1.0) is None


def test_only_a_client_can_allow() -> None:
    translator = started()
    rid = asked(translator, "Write", "t1", input=write_input())[-1]["id"]
    with pytest.raises(ValueError, match="only a client"):
        translator.approvals.resolve(rid, decision="allow", by="timeout", now=1.0)
    assert rid in translator.approvals.pending


# --- denied by policy at once ---------------------------------------------------------------------


def test_a_tool_outside_ask_is_denied_at_once_with_one_approval_resolved_by_policy() -> None:
    translator = started(approvals=ApprovalsConfig(enabled=True, ask=("Write",), allow_session=()))
    frames = asked(translator, "Bash", "t1", input={"command": "touch x"})
    (resolved,) = frames
    assert (resolved["type"], resolved["by"], resolved["decision"]) == (
        "approval_resolved",
        "policy",
        "deny",
    )
    assert resolved["request_id"] == resolved["id"]
    assert resolved["tool"] == "Bash"
    (deny,) = translator.approvals.take_control()
    message = json.loads(deny)["response"]["response"]["message"]
    assert "does not let anyone approve" in message
    # The daemon's approvals row gets what the model was told; taken once.
    assert translator.approvals.take_denied() == {resolved["request_id"]: message}
    assert translator.approvals.take_denied() == {}
    assert translator.approvals.take_asked() == []
    assert translator.approvals.pending == {}


def test_past_max_pending_a_prompt_is_denied_at_once() -> None:
    translator = started(approvals=ApprovalsConfig(enabled=True, max_pending=1))
    first = asked(translator, "Write", "t1", input=write_input(), agent_id="a1")
    assert first[-1]["type"] == "approval_needed"
    assert first[-1]["agent_id"] == "a1"
    translator.receive_data(assistant(tool_use("t2", "Write", **write_input("m.txt"))), 1.0)
    data, _ = can_use_tool("Write", "t2", "req-2", input=write_input("m.txt"), agent_id="a2")
    (resolved,) = as_data(translator.receive_data(data, 1.0))
    assert resolved["by"] == "policy"
    assert len(translator.approvals.pending) == 1


def test_outside_the_work_room_it_is_asked_with_the_allow_buttons_off() -> None:
    translator = started()
    outside = {"file_path": "/etc/out.txt", "content": "x"}
    needed = asked(translator, "Write", "t1", input=outside, decision_reason_type="workingDir")[-1]
    assert needed["providerApproval"]["scope"] == "Outside this Work Room"
    assert needed["providerApproval"]["scopeClassification"] == "elevated"
    assert needed["providerApproval"]["allowOnce"] is False
    assert needed["providerApproval"]["allowSession"] is False
    assert needed["providerApproval"]["files"] == ["out.txt"]
    bash = started()
    unknown = asked(bash, "Bash", "t9", input={"command": "python3 -c 1"})[-1]
    assert unknown["providerApproval"]["scope"] == "Boundary could not be verified"


# O Chat's card for a Write of the workspace's .git/config (the CLI's "sensitive file" prompt).
SENSITIVE_CARD: dict[str, Any] = {
    "action": "Make workspace file changes",
    "scope": "Outside this Work Room",
    "reason": "Review the requested permission expansion",
    "scopeClassification": "elevated",
    "allowOnce": False,
    "allowSession": False,
    "files": [".git/config"],  # where it is: "config" alone says nothing
}


def sensitive(translator: Translator, name: str) -> dict[str, Any]:
    """The approval_needed frame of the CLI's own "sensitive file" prompt for a Write of
    ``name`` in the workspace (the request as captured from the real CLI)."""
    fields = sensitive_write(f"{CWD}/{name}", name)
    for key in ("subtype", "tool_name", "display_name"):
        del fields[key]
    return asked(translator, "Write", "t1", **fields)[-1]


def test_a_sensitive_file_in_the_work_room_is_elevated_and_named_by_its_path() -> None:
    needed = sensitive(started(), ".git/config")
    # Not "This Work Room only" with Allow once / for the session, as a routine change is: one
    # approval of .git/config lets the next read-only `git status` run any command.
    assert needed["providerApproval"] == SENSITIVE_CARD
    assert needed["description"] == ".git/config"


def test_a_sensitive_files_path_is_redacted_and_bounded_like_the_other_paths() -> None:
    secret = secrets.token_hex(16)
    name = f"{secret}/" + "d" * 3000 + "/.bashrc"
    translator = Translator(context(), Limits(), Redactor([secret]), ON)
    translator.start(1000.0)
    translator.receive_data(init_line(), 1000.0)
    needed = sensitive(translator, name)
    (shown,) = needed["providerApproval"]["files"]
    assert secret not in json.dumps(needed)
    assert shown.startswith("[redacted]/ddd")
    assert len(shown) <= SAID_CHARS
    assert needed["providerApproval"]["scopeClassification"] == "elevated"


def test_a_sensitive_file_without_a_path_to_show_shows_none() -> None:
    translator = started()
    fields = sensitive_write("", "")
    needed = asked(
        translator,
        "Write",
        "t1",
        input={"content": "x"},
        **{k: fields[k] for k in ("decision_reason", "decision_reason_type")},
    )[-1]
    assert needed["providerApproval"]["scopeClassification"] == "elevated"
    assert "files" not in needed["providerApproval"]


@pytest.mark.parametrize(
    ("tool", "action"),
    [("Read", "Inspect the workspace"), ("WebFetch", "Perform a provider action")],
)
def test_each_tool_gets_its_allowlisted_action(tool: str, action: str) -> None:
    translator = started(approvals=ApprovalsConfig(enabled=True, ask=(tool,), allow_session=()))
    needed = asked(translator, tool, "t1", input={"file_path": "/etc/x"})[-1]
    assert needed["providerApproval"]["action"] == action
    assert needed["providerApproval"]["reason"] == "Claude Code requested approval to continue"


# --- withdrawn, cancelled, ended ------------------------------------------------------------------


def test_a_request_the_cli_withdraws_is_resolved_interrupted_and_nothing_is_written() -> None:
    translator = started()
    rid = asked(translator, "Write", "t1", input=write_input())[-1]["id"]
    frames = as_data(translator.receive_data(cancel(), 1003.0))
    assert [(f["type"], f.get("by")) for f in frames] == [
        ("approval_resolved", "interrupted"),
        ("provider_invocation", None),
    ]
    assert translator.approvals.take_control() == []
    assert translator.approvals.resolve(rid, decision="allow", by="client", now=1.0) is None
    # A cancel for a request no longer pending, or never seen, changes nothing.
    assert translator.receive_data(cancel() + cancel("other"), 1004.0) == []


def test_resolve_all_on_cancel_ends_every_pending_request_without_a_line() -> None:
    translator = started()
    asked(translator, "Write", "t1", input=write_input())
    translator.receive_data(assistant(tool_use("t2", "Edit", file_path="b")), 1.0)
    translator.receive_data(can_use_tool("Edit", "t2", "req-2", input={"file_path": "b"})[0], 1.0)
    frames = as_data(translator.approvals.resolve_all("cancel", 1005.0))
    assert [(f["type"], f["by"]) for f in frames] == [
        ("approval_resolved", "cancel"),
        ("approval_resolved", "cancel"),
    ]
    asked(translator, "Write", "t3", input=write_input("c.txt"), request_id="req-3")
    frames = as_data(translator.approvals.resolve_all("interrupted", 1006.0))
    assert [f["type"] for f in frames] == ["approval_resolved"]  # the daemon is going down
    assert translator.approvals.pending == {}
    assert translator.approvals.resolve_all("cancel", 1007.0) == []


def test_close_resolves_what_is_left_interrupted_before_the_result() -> None:
    translator = started()
    asked(translator, "Write", "t1", input=write_input())
    frames = as_data(translator.close(Outcome(reason="interrupted"), 1005.0))
    kinds = [(f["type"], f.get("by")) for f in frames]
    assert kinds.index(("approval_resolved", "interrupted")) < kinds.index(("tool_result", None))
    assert kinds[-1] == ("run_result", None)
    # Not "running" again on the way out: the Work Room goes from waiting to its end.
    statuses = [f["status"] for f in frames if f["type"] == "provider_invocation"]
    assert statuses == ["failed"]
    assert translator.approvals.resolve_all("interrupted", 1006.0) == []
    assert translator.approvals.resolve("run-1:5", decision="deny", by="client", now=1.0) is None


def test_a_restored_translator_knows_its_pending_requests_and_can_only_interrupt_them() -> None:
    translator = Translator(context(), approvals=ON)
    stored = translator.start(1000.0)
    stored += translator.receive_data(init_line(), 1000.0)
    stored += translator.receive_data(assistant(tool_use("t1", "Write", **write_input())), 1.0)
    stored += translator.receive_data(can_use_tool("Write", "t1", input=write_input())[0], 1.0)
    stored += translator.receive_data(assistant(tool_use("t2", "Edit", file_path="b")), 1.0)
    stored += translator.receive_data(
        can_use_tool("Edit", "t2", "req-2", input={"file_path": "b"})[0], 1.0
    )
    first, second = translator.approvals.take_asked()
    out = translator.approvals.resolve(second.request_id, decision="allow", by="client", now=2.0)
    assert out is not None
    stored += out[0]
    # What the store gives back after a restart: the frames, approval frames among them.
    restored = Translator.restore(
        context(), [decode_frame(encode_frame(f)) for f in stored], approvals=ON
    )
    (pending,) = restored.approvals.pending.values()
    assert (pending.request_id, pending.kind, pending.tool_id) == (
        first.request_id,
        "permission",
        "claude:t1",
    )
    assert pending.cli_request_id == ""
    # The CLI that asked is gone: nothing can be written to it, only the end is left.
    assert (
        restored.approvals.resolve(first.request_id, decision="allow", by="client", now=3.0) is None
    )
    assert (
        restored.approvals.resolve(first.request_id, decision="deny", by="timeout", now=3.0) is None
    )
    closing = as_data(restored.close(Outcome(reason="interrupted"), 4.0))
    ends = [f for f in closing if f["type"] == "approval_resolved"]
    assert [(f["request_id"], f["by"]) for f in ends] == [(first.request_id, "interrupted")]
    assert ends[0]["seq"] > max(f.seq for f in stored)


def test_a_restored_question_is_pending_too() -> None:
    translator = Translator(context(), approvals=ON)
    stored = translator.start(1000.0)
    stored += translator.receive_data(can_use_tool("AskUserQuestion", "t1", input=ASK)[0], 1.0)
    restored = Translator.restore(context(), stored, approvals=ON)
    (pending,) = restored.approvals.pending.values()
    assert (pending.kind, pending.tool) == ("question", "AskUserQuestion")


def test_a_restore_skips_requests_that_were_resolved() -> None:
    translator = started()
    rid = asked(translator, "Write", "t1", input=write_input())[-1]["id"]
    out = translator.approvals.resolve(rid, decision="deny", by="client", now=2.0)
    assert out is not None
    frames = [*translator.close(EXITED, 3.0)]
    restored = Translator.restore(context(), frames, approvals=ON)
    assert restored.approvals.pending == {}


# --- questions ------------------------------------------------------------------------------------


def test_ask_user_question_becomes_an_ask_user_frame_in_connectonions_shape() -> None:
    translator = started()
    waiting, frame = asked(
        translator, "AskUserQuestion", "t1", input=ASK, requires_user_interaction=True
    )
    assert waiting["status"] == "awaiting_approval"
    assert frame["type"] == "ask_user"
    assert frame["request_id"] == frame["id"]
    assert frame["question"] == QUESTION
    assert frame["options"] == ["Red", "Blue"]
    assert frame["multi_select"] is False
    assert frame["questions"] == ASK["questions"]
    assert frame["tool_id"] == "claude:t1"
    assert frame["expires_at"] == 1062.0
    (pending,) = translator.approvals.take_asked()
    assert pending.kind == "question"


def test_answers_travel_back_in_updated_input_with_notes_in_annotations() -> None:
    translator = started()
    rid = asked(translator, "AskUserQuestion", "t1", input=ASK)[-1]["id"]
    resolved, sent = answer(
        translator.approvals.resolve(
            rid,
            decision="allow",
            by="client",
            answers={QUESTION: "Red, Blue"},
            notes={QUESTION: "both, please"},
            now=1003.0,
        )
    )
    assert sent["response"]["response"] == {
        "behavior": "allow",
        "updatedInput": {
            **ASK,
            "answers": {QUESTION: "Red, Blue"},
            "annotations": {QUESTION: {"notes": "both, please"}},
        },
    }
    assert (resolved[0]["decision"], resolved[0]["scope"]) == ("allow", "once")


@pytest.mark.parametrize(
    ("answers", "notes"),
    [
        (None, None),
        ({}, None),
        ({QUESTION: ""}, None),
        ({"Not asked?": "x"}, None),
        ({QUESTION: "Red", "Not asked?": "x"}, None),
        ({QUESTION: "Red"}, {"Not asked?": "x"}),
    ],
)
def test_an_answer_that_answers_no_question_asked_is_refused_and_the_question_stays_open(
    answers: dict[str, str] | None, notes: dict[str, str] | None
) -> None:
    # Sent on, it would tell the model "The user did not answer" and use the question up
    # (tests/golden: the CLI takes empty answers as that).
    translator = started()
    rid = asked(translator, "AskUserQuestion", "t1", input=ASK)[-1]["id"]
    with pytest.raises(PolicyError) as caught:
        translator.approvals.resolve(
            rid, decision="allow", by="client", answers=answers, notes=notes, now=1003.0
        )
    assert (caught.value.status, caught.value.code) == (400, "bad_request")
    assert rid in translator.approvals.pending
    resolved, sent = answer(
        translator.approvals.resolve(
            rid, decision="allow", by="client", answers={QUESTION: "Blue"}, now=1004.0
        )
    )
    assert sent["response"]["response"]["updatedInput"] == {**ASK, "answers": {QUESTION: "Blue"}}
    assert [f["type"] for f in resolved] == ["approval_resolved", "provider_invocation"]


def test_a_question_answered_by_the_text_its_frame_showed_reaches_the_cli_as_asked() -> None:
    # A frame shows a question redacted and bounded; a client can only key its answer by that.
    secret = secrets.token_hex(16)
    long = "Which one? " + "x" * 3000
    masked = f"Use the key {secret}?"
    raw = {"questions": [{**ASK["questions"][0], "question": q} for q in (long, masked)]}
    translator = Translator(context(), Limits(), Redactor([secret]), ON)
    translator.start(1000.0)
    translator.receive_data(init_line(), 1000.0)
    frame = asked(translator, "AskUserQuestion", "t1", input=raw)[-1]
    shown = [q["question"] for q in frame["questions"]]
    assert secret not in json.dumps(frame)
    assert shown[0] != long
    _, sent = answer(
        translator.approvals.resolve(
            frame["id"],
            decision="allow",
            by="client",
            answers={shown[0]: "Red", shown[1]: "Blue"},
            notes={shown[1]: "the blue one"},
            now=1003.0,
        )
    )
    updated = sent["response"]["response"]["updatedInput"]
    assert updated["answers"] == {long: "Red", masked: "Blue"}
    assert updated["annotations"] == {masked: {"notes": "the blue one"}}


@pytest.mark.parametrize("bad", [{"questions": []}, {"questions": "x"}, {}])
def test_a_question_that_cannot_be_read_is_denied_at_once(bad: dict[str, Any]) -> None:
    translator = started()
    (resolved,) = asked(translator, "AskUserQuestion", "t1", input=bad)
    assert resolved["by"] == "policy"
    (deny,) = translator.approvals.take_control()
    assert "could not be read" in json.loads(deny)["response"]["response"]["message"]


# --- odd lines ------------------------------------------------------------------------------------


def diagnostics(frames: list[Frame]) -> list[str]:
    return [f["code"] for f in as_data(frames) if f["type"] == "diagnostic"]


def test_a_request_without_an_id_is_counted_and_cannot_be_answered() -> None:
    translator = started()
    data = line(type="control_request", request={"subtype": "can_use_tool"})
    assert diagnostics(translator.receive_data(data, 1.0)) == ["malformed_line"]
    assert translator.approvals.take_control() == []


@pytest.mark.parametrize(
    "body",
    [
        None,
        "x",
        {"subtype": "can_use_tool", "tool_name": "Write", "input": {}},
        {"subtype": "can_use_tool", "tool_name": "Write", "input": [], "tool_use_id": "t"},
        {"subtype": "can_use_tool", "tool_name": 5, "input": {}, "tool_use_id": "t"},
    ],
)
def test_a_request_of_an_odd_shape_is_denied_by_its_id(body: Any) -> None:
    translator = started()
    data = line(type="control_request", request_id="r", request=body)
    assert diagnostics(translator.receive_data(data, 1.0)) == ["malformed_line"]
    (deny,) = translator.approvals.take_control()
    assert json.loads(deny)["response"]["request_id"] == "r"
    assert json.loads(deny)["response"]["response"]["behavior"] == "deny"


def test_a_request_of_another_kind_is_counted_as_unknown() -> None:
    translator = started()
    data = line(type="control_request", request_id="r", request={"subtype": "hook_callback"})
    assert diagnostics(translator.receive_data(data, 1.0)) == ["unknown_type"]
    assert translator.approvals.take_control() == []


def test_the_same_request_twice_is_asked_once() -> None:
    translator = started()
    asked(translator, "Write", "t1", input=write_input())
    data, _ = can_use_tool("Write", "t1", input=write_input())
    assert translator.receive_data(data, 1.0) == []
    assert len(translator.approvals.pending) == 1


def test_without_a_parent_there_are_no_invocation_frames_and_no_activity_id() -> None:
    translator = started(parent_tool_call_id=None)
    (needed,) = asked(translator, "Write", "t1", input=write_input())
    assert "activityId" not in needed
    assert "invocationId" not in needed
    resolved, _ = answer(
        translator.approvals.resolve(needed["id"], decision="allow", by="client", now=1.0)
    )
    assert [f["type"] for f in resolved] == ["approval_resolved"]


def test_a_second_request_keeps_the_work_room_waiting_until_the_last_is_answered() -> None:
    translator = started()
    first = asked(translator, "Write", "t1", input=write_input(), agent_id="a1")[-1]["id"]
    translator.receive_data(assistant(tool_use("t2", "Edit", file_path="b")), 1.0)
    data, _ = can_use_tool("Edit", "t2", "req-2", input={"file_path": "b"}, agent_id="a2")
    second = as_data(translator.receive_data(data, 1.0))[-1]["id"]
    resolved, _ = answer(
        translator.approvals.resolve(first, decision="allow", by="client", now=2.0)
    )
    assert [f["type"] for f in resolved] == ["approval_resolved"]
    resolved, _ = answer(
        translator.approvals.resolve(second, decision="allow", by="client", now=3.0)
    )
    assert [f["type"] for f in resolved] == ["approval_resolved", "provider_invocation"]


# --- what frames carry, what the CLI gets ---------------------------------------------------------


def test_a_secret_in_the_input_goes_back_to_the_cli_but_into_no_frame() -> None:
    secret = "sk-ant-api03-" + secrets.token_urlsafe(32)
    translator = Translator(context(), Limits(), Redactor([secret]), ON)
    translator.start(1000.0)
    command = {"command": f"curl -H 'x-api-key: {secret}' https://x", "description": secret}
    frames = translator.receive_data(assistant(tool_use("t1", "Bash", **command)), 1.0)
    data, _ = can_use_tool("Bash", "t1", input=command, description=secret)
    frames += translator.receive_data(data, 1.0)
    (pending,) = translator.approvals.take_asked()
    out = translator.approvals.resolve(pending.request_id, decision="allow", by="client", now=2.0)
    assert out is not None
    frames += out[0]
    frames += translator.close(EXITED, 3.0)
    assert secret not in b"".join(encode_frame(f) for f in frames).decode()
    assert secret not in json.dumps(msgspec.to_builtins(pending.arguments))
    assert json.loads(out[1] or b"")["response"]["response"]["updatedInput"] == command


def test_arguments_of_a_request_whose_card_never_opened_are_cleaned_and_bounded() -> None:
    translator = Translator(context(), Limits(arg_bytes=256), Redactor(), ON)
    translator.start(1000.0)
    big = {"file_path": f"{CWD}/n.txt", "content": "y" * 5000}
    data, _ = can_use_tool("Write", "t1", input=big)
    (_, needed) = as_data(translator.receive_data(data, 1.0))
    assert len(json.dumps(needed["arguments"])) <= 300
    assert needed["tool_id"] == "claude:t1"
    (pending,) = translator.approvals.take_asked()
    assert pending.input == big  # the raw input, to send back as asked


def test_a_single_request_cancelled_writes_nothing() -> None:
    translator = started()
    rid = asked(translator, "Write", "t1", input=write_input())[-1]["id"]
    resolved, sent = answer(
        translator.approvals.resolve(rid, decision="deny", by="cancel", now=1.0)
    )
    assert sent is None
    # Not back to "running": a cancel ends the run.
    assert [(f["type"], f["by"]) for f in resolved] == [("approval_resolved", "cancel")]
