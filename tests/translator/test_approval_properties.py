"""No answer widens permissions: the control lines' guard, and a property over any sequence of
prompts and answers (README "Approvals": no bypass, no mode change, no rule beyond the session,
a session rule only for an allow_session tool inside the Work Room, one approval_resolved per
request)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from codelegate.policy.approvals import FILE_CHANGE_TOOLS, ApprovalsConfig, SessionRule
from codelegate.policy.errors import PolicyError
from codelegate.translator import Outcome, Translator
from codelegate.translator.control import (
    Channel,
    _refuse_widening,
    allow,
    answer_questions,
    deny,
)
from codelegate.translator.frames import ApprovalNeeded, ApprovalResolved, AskUser, Frame
from tests.translator.helpers import CWD, assistant, context, init_line, line, tool_use

# --- the guard ---------------------------------------------------------------------------------


def answer_obj(**response: Any) -> dict[str, Any]:
    return {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": "r", "response": response},
    }


def test_the_three_answers_are_whole_json_lines() -> None:
    for raw in (
        allow("r", {"command": "ls"}),
        allow("r", {"file_path": "a"}, SessionRule(tool_name="Edit", rule_content="//srv/ws/**")),
        allow("r", {"command": "ls"}, SessionRule(tool_name="Bash")),
        deny("r", "No."),
        answer_questions("r", {"questions": []}, {"Q": "A"}, {"Q": "n"}),
    ):
        assert raw.endswith(b"\n")
        assert raw.count(b"\n") == 1
        assert json.loads(raw)["response"]["request_id"] == "r"


def test_a_deny_without_a_message_is_never_written() -> None:
    with pytest.raises(ValueError, match="message"):
        deny("r", "  ")


def test_the_input_as_asked_may_name_anything_it_is_the_tools_own() -> None:
    # A tool input with a "mode" key, or a command mentioning bypassPermissions, is the tool's.
    asked = {"mode": "bypassPermissions", "destination": "localSettings", "setMode": 1}
    assert json.loads(allow("r", asked))["response"]["response"]["updatedInput"] == asked


@pytest.mark.parametrize(
    "obj",
    [
        answer_obj(behavior="allow", updatedInput={}, mode="bypassPermissions"),
        answer_obj(
            behavior="allow",
            updatedInput={},
            updatedPermissions=[
                {"type": "setMode", "mode": "bypassPermissions", "destination": "session"}
            ],
        ),
        answer_obj(
            behavior="allow",
            updatedInput={},
            updatedPermissions=[
                {"type": "addDirectories", "directories": ["/"], "destination": "session"}
            ],
        ),
        answer_obj(
            behavior="allow",
            updatedInput={},
            updatedPermissions=[
                {
                    "type": "addRules",
                    "rules": [{"toolName": "Bash"}],
                    "behavior": "allow",
                    "destination": "localSettings",
                }
            ],
        ),
        answer_obj(behavior="deny", message="No.", interrupt=True),
        answer_obj(behavior="allowAlways", updatedInput={}),
        {**answer_obj(behavior="deny", message="x"), "extra": 1},
        {"type": "control_request", "response": answer_obj(behavior="deny")["response"]},
        {"type": "control_response", "response": "x"},
        answer_obj(behavior="deny", message=["setMode"]),
        {
            "type": "control_response",
            "response": {"subtype": "error", "request_id": "r", "response": {}},
        },
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": 1, "response": {"behavior": "deny"}},
        },
    ],
)
def test_the_guard_refuses_any_answer_that_widens_or_is_not_ours(obj: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="refusing"):
        _refuse_widening(obj)


@pytest.mark.parametrize(
    "update",
    [
        "addRules",
        {"type": "addRules", "rules": [], "behavior": "allow", "destination": "session"},
        {"type": "addRules", "rules": ["Write"], "behavior": "allow", "destination": "session"},
        {
            "type": "addRules",
            "rules": [{"toolName": ""}],
            "behavior": "allow",
            "destination": "session",
        },
        {
            "type": "addRules",
            "rules": [{"toolName": "Bash", "ruleContent": "rm -rf /"}],
            "behavior": "allow",
            "destination": "session",
        },
        {
            "type": "addRules",
            "rules": [{"toolName": "W"}, {"toolName": "B"}],
            "behavior": "allow",
            "destination": "session",
        },
        {
            "type": "replaceRules",
            "rules": [{"toolName": "W"}],
            "behavior": "allow",
            "destination": "session",
        },
        *(
            {"type": "addRules", "rules": [rule], "behavior": "allow", "destination": "session"}
            for rule in (
                {"toolName": "Edit", "ruleContent": "//**"},
                {"toolName": "Edit", "ruleContent": "/srv/**"},
                {"toolName": "Edit", "ruleContent": "//srv/*/**"},
                {"toolName": "Edit", "ruleContent": 5},
                {"toolName": "Bash(x)"},
            )
        ),
    ],
)
def test_the_only_permission_update_is_one_session_rule(update: Any) -> None:
    with pytest.raises(ValueError, match="refusing"):
        _refuse_widening(answer_obj(behavior="allow", updatedInput={}, updatedPermissions=[update]))


# --- when the run is over, with messages written mid-run -----------------------------------------


def test_a_message_written_mid_run_keeps_the_run_open_until_the_cli_echoed_it() -> None:
    channel = Channel()
    channel.replayed("Do it.")  # the prompt's echo comes first
    channel.input_written("steer")
    channel.result()  # the turn that was running when it was written
    assert not channel.over
    channel.replayed("steer")
    channel.result()  # the message's own turn
    assert channel.over
    channel.input_written("more")  # written after the result, before stdin closed
    assert not channel.over


def test_the_translator_counts_echoes_and_shows_none() -> None:
    translator = Translator(context())
    echo = line(
        type="user",
        message={"role": "user", "content": "steer"},
        parent_tool_use_id=None,
        isReplay=True,
    )
    translator.channel.input_written("steer")
    assert translator.receive_data(echo + echo, 1.0) == []
    assert translator.channel.prompted
    assert translator.channel.unread == 0


# --- the property --------------------------------------------------------------------------------

# Weighted towards what can be approved for the session (file tools, Bash, inside the Work Room).
TOOLS = st.sampled_from(
    ["Write", "Write", "Edit", "Bash", "Bash", "Read", "WebFetch", "AskUserQuestion", "Mystery"]
)
PATHS = st.sampled_from([f"{CWD}/n.txt", "n.txt", f"{CWD}/a/b", "../out.txt", "/etc/passwd", None])
SUGGESTIONS = st.sampled_from(
    [
        [],
        [{"type": "setMode", "mode": "bypassPermissions", "destination": "session"}],
        [{"type": "setMode", "mode": "acceptEdits", "destination": "session"}],
        [
            {
                "type": "addRules",
                "rules": [{"toolName": "Bash", "ruleContent": "touch x"}],
                "behavior": "allow",
                "destination": "localSettings",
            }
        ],
        [{"type": "addDirectories", "directories": ["/"], "destination": "session"}],
    ]
)
ANSWERS = st.lists(
    st.tuples(
        st.sampled_from(["allow", "allow", "deny", "timeout", "cancel", "withdraw"]),
        st.sampled_from(["once", "session", "session", "forever"]),
        st.integers(0, 4),  # which request (by order asked): repeats and late answers too
        st.sampled_from([None, "", "Use the other one.", "bypassPermissions"]),
    ),
    max_size=10,
)
CONFIGS = st.builds(
    ApprovalsConfig,
    enabled=st.just(True),
    ask=st.sampled_from([("Write", "Edit", "Bash", "Read"), ("Write", "Bash", "Read")]),
    allow_session=st.sampled_from(
        [(), ("Write",), ("Write", "Edit"), ("Write", "Bash"), ("Write", "Edit", "Bash")]
    ),
    max_pending=st.integers(1, 3),
)


def prompt_line(n: int, tool: str, path: str | None, suggestions: list[Any]) -> bytes:
    raw: dict[str, Any] = {"command": "touch x"} if tool == "Bash" else {}
    if path is not None and tool != "Bash":
        raw["file_path"] = path
    if tool == "AskUserQuestion":
        raw = {"questions": [{"question": "Q?", "header": "H", "options": [{"label": "A"}]}]}
    request: dict[str, Any] = {
        "subtype": "can_use_tool",
        "tool_name": tool,
        "input": raw,
        "tool_use_id": f"t{n}",
        "permission_suggestions": suggestions,
    }
    if tool == "Bash" and path is not None:
        request["blocked_path"] = path
    return assistant(tool_use(f"t{n}", tool, **raw)) + line(
        type="control_request", request_id=f"cli-{n}", request=request
    )


def check_line(raw: bytes, cfg: ApprovalsConfig, classified: dict[str, tuple[str, str]]) -> None:
    obj = json.loads(raw)
    assert obj["type"] == "control_response"
    response = obj["response"]["response"]
    assert response["behavior"] in ("allow", "deny")
    rest = {k: v for k, v in response.items() if k != "updatedInput"}
    rest.pop("message", None)  # words for the model (a person's feedback may say anything)
    text = json.dumps(rest)
    for word in ("setMode", '"mode"', "bypassPermissions", "addDirectories", "localSettings"):
        assert word not in text
    for update in response.get("updatedPermissions", []):
        event("a session rule was written")
        (rule,) = update["rules"]
        assert update == {
            "type": "addRules",
            "rules": [rule],
            "behavior": "allow",
            "destination": "session",
        }
        tool, klass = classified[obj["response"]["request_id"]]
        assert klass == "workroom"
        assert tool in cfg.allow_session
        if tool in FILE_CHANGE_TOOLS:
            # Never the whole tool: that would let it write outside the workspace.
            assert rule == {"toolName": "Edit", "ruleContent": f"/{CWD}/**"}
            assert FILE_CHANGE_TOOLS.intersection(cfg.ask) <= set(cfg.allow_session)
        else:
            assert rule == {"toolName": tool}
    if response["behavior"] == "deny":
        assert response["message"].strip()


# The answers that matter most, always tried (random search finds them in a few % of cases).
SESSION_FOR_ALL = ApprovalsConfig(
    enabled=True, allow_session=("Write", "Edit", "MultiEdit", "NotebookEdit", "Bash")
)


@example(
    cfg=SESSION_FOR_ALL, prompts=[("Write", "n.txt", [])], answers=[("allow", "session", 0, None)]
)
@example(
    cfg=SESSION_FOR_ALL,
    prompts=[("Bash", "n.txt", []), ("Write", "../out.txt", [])],
    answers=[
        ("allow", "session", 0, None),
        ("allow", "session", 4, None),
        ("allow", "session", 1, None),
    ],
)
@example(
    cfg=ApprovalsConfig(enabled=True, allow_session=("Write",)),
    prompts=[("Write", "n.txt", [])],
    answers=[("allow", "session", 0, None)],
)
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfg=CONFIGS,
    prompts=st.lists(st.tuples(TOOLS, PATHS, SUGGESTIONS), min_size=1, max_size=5),
    answers=ANSWERS,
)
def test_no_sequence_of_prompts_and_answers_widens_permissions(
    cfg: ApprovalsConfig, prompts: list[tuple[str, str | None, list[Any]]], answers: Any
) -> None:
    translator = Translator(context(), approvals=cfg)
    frames: list[Frame] = translator.start(1000.0)
    frames += translator.receive_data(init_line(), 1000.0)
    lines: list[bytes] = []
    classified: dict[str, tuple[str, str]] = {}  # the CLI's request id -> tool, class
    order: list[str] = []  # our request ids, as asked
    cli_ids: dict[str, str] = {}
    refusals: list[int] = []

    def take() -> None:
        lines.extend(translator.approvals.take_control())
        for asked in translator.approvals.take_asked():
            order.append(asked.request_id)
            cli_ids[asked.request_id] = asked.cli_request_id
            classified[asked.cli_request_id] = (
                asked.prompt.tool_name,
                asked.verdict.classification,
            )

    queue = list(enumerate(prompts))
    now = 1001.0
    # The first prompt comes first; "which == 4" brings the next one between two answers; the
    # rest come after the last answer (and are still pending at close).
    steps = [("prompt", "", 4, None), *answers, *[("prompt", "", 4, None)] * len(prompts)]
    for action, scope, which, message in steps:
        now += 1
        if which == 4 and queue:
            n, (tool, path, suggestions) = queue.pop(0)
            frames += translator.receive_data(prompt_line(n, tool, path, suggestions), now)
            take()
        if action == "prompt" or not order:
            continue
        rid = order[which % len(order)]
        if action == "withdraw":
            frames += translator.receive_data(
                line(type="control_cancel_request", request_id=cli_ids[rid]), now
            )
            continue
        if action == "cancel":
            frames += translator.approvals.resolve_all("cancel", now)
            continue
        try:
            out = translator.approvals.resolve(
                rid,
                decision="allow" if action == "allow" else "deny",
                by="client" if action in ("allow", "deny") else "timeout",
                scope=scope,
                message=message,
                now=now,
            )
        except PolicyError as refused:
            refusals.append(refused.status)
            continue
        if out is not None:
            frames += out[0]
            if out[1] is not None:
                lines.append(out[1])
    frames += translator.close(Outcome(reason="exited", exit_code=0), now + 1)
    assert set(refusals) <= {400, 403}
    for raw in lines:
        check_line(raw, cfg, classified)
    # Exactly one approval_resolved per request: asked ones, and those denied at once.
    asked_ids = [f.id for f in frames if isinstance(f, ApprovalNeeded | AskUser)]
    resolved = Counter(f.request_id for f in frames if isinstance(f, ApprovalResolved))
    assert set(asked_ids) <= set(resolved)
    assert all(count == 1 for count in resolved.values())
    assert len(resolved) == len(prompts)
    # At most one line per CLI request: the first answer wins.
    answered = Counter(json.loads(raw)["response"]["request_id"] for raw in lines)
    assert all(count == 1 for count in answered.values())
