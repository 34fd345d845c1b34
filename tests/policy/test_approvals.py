"""[approvals]: what a person may be asked, and how far an answer may reach (policy.approvals)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from codelegate.policy.approvals import (
    DENIED_MESSAGE,
    NOT_ASKABLE_MESSAGE,
    OFF_MESSAGE,
    TOO_MANY_MESSAGE,
    ApprovalsConfig,
    Prompt,
    SessionRule,
    Verdict,
    check_answer,
    check_question_answers,
    classify,
    deny_message,
    judge,
    session_rule,
    timeout_message,
)
from codelegate.policy.config import parse_config
from codelegate.policy.errors import ConfigError, PolicyError
from codelegate.policy.launch import build_argv, resolve_mode

CWD = "/srv/ws/demo"
ON = ApprovalsConfig(enabled=True)


def prompt(tool: str = "Write", **fields: Any) -> Prompt:
    fields.setdefault("input", {})
    return Prompt(tool_name=tool, **fields)


def config(approvals: str, policy: str = "") -> bytes:
    return f'[policy]\nworkspaces = ["/srv/ws"]\n{policy}\n[approvals]\n{approvals}\n'.encode()


# --- the config ---------------------------------------------------------------------------------


def test_approvals_are_off_by_default_and_never_offer_a_session_for_bash() -> None:
    parsed = parse_config(b'[policy]\nworkspaces = ["/srv/ws"]\n', "c.toml")
    assert parsed.approvals == ApprovalsConfig()
    assert parsed.approvals.enabled is False
    assert "Bash" in parsed.approvals.ask
    assert "Bash" not in parsed.approvals.allow_session


def test_an_approvals_section_parses_with_every_key() -> None:
    parsed = parse_config(
        config(
            'enabled = true\nask = ["Write", "Bash"]\nallow_session = ["Write"]\n'
            "timeout_s = 30\nmax_pending = 2"
        ),
        "c.toml",
    )
    assert parsed.approvals == ApprovalsConfig(
        enabled=True, ask=("Write", "Bash"), allow_session=("Write",), timeout_s=30, max_pending=2
    )


@pytest.mark.parametrize(
    ("body", "policy", "key", "says"),
    [
        ('ask = ["Bash(rm:*)"]', "", "approvals.ask[0]", "tool name"),
        ('ask = ["-x"]', "", "approvals.ask[0]", "tool name"),
        ('ask = ["Write"]\nallow_session = ["Edit"]', "", "approvals.allow_session[0]", "ask"),
        ('ask = ["ExitPlanMode"]', "", "approvals.ask[0]", "permission mode"),
        ('ask = ["AskUserQuestion"]', "", "approvals.ask[0]", "question"),
        ('ask = ["Write", "Bash"]', 'disallowed_tools = ["Bash"]', "approvals.ask[1]", "always"),
        ("timeout_s = 0", "", "approvals.timeout_s", ">= 1"),
        ("max_pending = 65", "", "approvals.max_pending", "<= 64"),
        ("enable = true", "", "approvals.enable", "expected one of: enabled, ask"),
    ],
)
def test_a_bad_approvals_section_names_its_key(body: str, policy: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(body, policy), "c.toml")
    assert caught.value.key == key
    assert says in caught.value.expected


def test_a_rule_with_content_in_disallowed_tools_does_not_stop_asking_for_the_tool() -> None:
    parsed = parse_config(
        config('ask = ["Bash"]\nallow_session = []', 'disallowed_tools = ["Bash(rm:*)"]'), "c"
    )
    assert parsed.approvals.ask == ("Bash",)


def test_bypass_in_the_approvals_section_is_refused_as_such() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config('ask = ["bypassPermissions"]'), "c.toml")
    assert "bypassPermissions" in caught.value.expected


# --- where a prompt reaches -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "scope"),
    [
        ({"input": {"file_path": f"{CWD}/n.txt"}}, "workroom"),
        ({"input": {"file_path": "n.txt"}}, "workroom"),
        ({"input": {"notebook_path": f"{CWD}/a/b.ipynb"}}, "workroom"),
        ({"input": {"file_path": f"{CWD}/../x.txt"}}, "elevated"),
        ({"input": {"file_path": "/srv/ws/demo2/x.txt"}}, "elevated"),
        ({"input": {"file_path": "/etc/passwd"}}, "elevated"),
        ({"input": {"file_path": CWD}}, "workroom"),
        # blocked_path is not "outside": the CLI sets it for `touch made.txt` inside too.
        ({"blocked_path": f"{CWD}/made.txt", "input": {"command": "touch made.txt"}}, "workroom"),
        ({"blocked_path": "/srv/ws/outside.txt", "input": {"command": "touch x"}}, "elevated"),
        # Inside, but the CLI says outside its working directories: believed.
        (
            {"input": {"file_path": f"{CWD}/n.txt"}, "decision_reason_type": "workingDir"},
            "elevated",
        ),
        # Inside, but a "sensitive file" to the CLI (.git/config runs commands on a `git
        # status`): not a routine Work Room change (tests/golden: the CLI's own prompt).
        (
            {"input": {"file_path": f"{CWD}/.git/config"}, "decision_reason_type": "safetyCheck"},
            "elevated",
        ),
        (
            {"input": {"command": "git status"}, "decision_reason_type": "safetyCheck"},
            "elevated",
        ),
        # A command without a path is not confined by anything we know of.
        ({"input": {"command": "python3 -c 'print(1)'"}}, "unknown"),
        ({"input": {"file_path": 7}}, "unknown"),
        ({"input": {"file_path": ""}}, "unknown"),
        ({"input": {"file_path": "a\x00b"}}, "unknown"),
        # Every path must be inside.
        ({"blocked_path": f"{CWD}/a", "input": {"file_path": "/tmp/b"}}, "elevated"),
    ],
)
def test_classify_compares_every_path_with_the_workspace(
    fields: dict[str, Any], scope: str
) -> None:
    assert classify(prompt("Write", **fields), CWD) == scope


def test_a_relative_workspace_is_never_called_confined() -> None:
    assert classify(prompt(input={"file_path": "n.txt"}), "relative/ws") == "unknown"


def test_a_workspace_at_the_root_holds_every_absolute_path() -> None:
    assert classify(prompt(input={"file_path": "/etc/x"}), "/") == "workroom"


# --- judge ----------------------------------------------------------------------------------------


def test_a_file_change_inside_the_work_room_is_asked_with_once_and_session() -> None:
    verdict = judge(ON, prompt(input={"file_path": f"{CWD}/n.txt"}), cwd=CWD, pending=0)
    # Not a rule for the whole tool (that one lets Write write anywhere, measured on 2.1.332):
    # an Edit rule, which the CLI applies to every file tool, over the workspace only.
    assert verdict == Verdict(
        ask=True,
        classification="workroom",
        allow_once=True,
        allow_session=True,
        session_rule=SessionRule(tool_name="Edit", rule_content=f"/{CWD}/**"),
    )


def test_a_tool_without_paths_gets_a_session_rule_for_the_whole_tool_if_listed() -> None:
    cfg = ApprovalsConfig(enabled=True, ask=("Bash", "Write"), allow_session=("Bash",))
    touch = prompt("Bash", blocked_path=f"{CWD}/made.txt", input={"command": "touch made.txt"})
    assert judge(cfg, touch, cwd=CWD, pending=0).session_rule == SessionRule(tool_name="Bash")


@pytest.mark.parametrize(
    ("allow_session", "cwd"),
    [
        # The Edit rule would also spare Edit, which the operator wants asked each time.
        (("Write",), CWD),
        # A workspace path with glob or rule syntax cannot go into a rule as it is.
        (("Write", "Edit", "MultiEdit", "NotebookEdit"), "/srv/ws/de*mo"),
        (("Write", "Edit", "MultiEdit", "NotebookEdit"), "/srv/ws/a b"),
        (("Write", "Edit", "MultiEdit", "NotebookEdit"), "/srv/ws/x)"),
    ],
)
def test_a_file_tool_is_offered_for_the_session_only_with_a_rule_that_stays_inside(
    allow_session: tuple[str, ...], cwd: str
) -> None:
    cfg = ApprovalsConfig(enabled=True, allow_session=allow_session)
    verdict = judge(cfg, prompt(input={"file_path": f"{cwd}/n.txt"}), cwd=cwd, pending=0)
    assert (verdict.ask, verdict.allow_once) == (True, True)
    assert (verdict.allow_session, verdict.session_rule) == (False, None)


def test_a_workspace_at_the_root_is_never_offered_a_session_rule() -> None:
    assert session_rule(ON, "Write", "/") is None
    assert session_rule(ON, "Bash", CWD) is None  # not in allow_session


def test_bash_is_asked_but_never_offered_for_the_session_by_default() -> None:
    touch = prompt("Bash", blocked_path=f"{CWD}/made.txt", input={"command": "touch made.txt"})
    verdict = judge(ON, touch, cwd=CWD, pending=0)
    assert (verdict.ask, verdict.allow_once, verdict.allow_session) == (True, True, False)


def test_outside_the_work_room_it_is_asked_with_the_allow_buttons_off() -> None:
    verdict = judge(ON, prompt(input={"file_path": "/etc/x"}), cwd=CWD, pending=0)
    assert verdict == Verdict(
        ask=True, classification="elevated", allow_once=False, allow_session=False
    )


def test_a_sensitive_file_inside_the_work_room_is_asked_with_the_allow_buttons_off() -> None:
    sensitive = prompt(
        input={"file_path": f"{CWD}/.git/config"}, decision_reason_type="safetyCheck"
    )
    assert sensitive.sensitive
    assert not prompt(input={}, decision_reason_type="workingDir").sensitive
    # No session rule either: an Edit rule over the workspace would not cover it anyway (the CLI
    # asks again), and offering one would say it does.
    assert judge(ON, sensitive, cwd=CWD, pending=0) == Verdict(
        ask=True, classification="elevated", allow_once=False, allow_session=False
    )


@pytest.mark.parametrize(
    ("cfg", "tool", "pending", "message"),
    [
        (ApprovalsConfig(), "Write", 0, OFF_MESSAGE),
        (ON, "WebFetch", 0, NOT_ASKABLE_MESSAGE),
        (
            ApprovalsConfig(enabled=True, ask=("Write",), allow_session=()),
            "Bash",
            0,
            NOT_ASKABLE_MESSAGE,
        ),
        (ON, "Write", 4, TOO_MANY_MESSAGE),
        # A hand-built config skips validation: the mode tools are refused anyway.
        (
            ApprovalsConfig(enabled=True, ask=("ExitPlanMode",), allow_session=()),
            "ExitPlanMode",
            0,
            NOT_ASKABLE_MESSAGE,
        ),
        (
            ApprovalsConfig(enabled=True, ask=("Bash(x)",), allow_session=()),
            "Bash(x)",
            0,
            NOT_ASKABLE_MESSAGE,
        ),
    ],
)
def test_what_policy_denies_at_once_says_why(
    cfg: ApprovalsConfig, tool: str, pending: int, message: str
) -> None:
    verdict = judge(cfg, prompt(tool, input={"file_path": f"{CWD}/n"}), cwd=CWD, pending=pending)
    assert verdict.ask is False
    assert verdict.allow_once is verdict.allow_session is False
    assert verdict.deny_message == message


def test_a_question_is_asked_unless_approvals_are_off_or_too_many_wait() -> None:
    question = prompt("AskUserQuestion", input={"questions": []})
    assert question.question
    asked = judge(ON, question, cwd=CWD, pending=3)
    assert (asked.ask, asked.allow_once, asked.allow_session) == (True, True, False)
    assert judge(ON, question, cwd=CWD, pending=4).deny_message == TOO_MANY_MESSAGE
    assert judge(ApprovalsConfig(), question, cwd=CWD, pending=0).deny_message == OFF_MESSAGE


# --- answers --------------------------------------------------------------------------------------

SESSION_OK = Verdict(ask=True, classification="workroom", allow_once=True, allow_session=True)
ONCE_ONLY = Verdict(ask=True, classification="workroom", allow_once=True, allow_session=False)


def test_session_scope_is_granted_only_where_policy_allows_it() -> None:
    assert check_answer(SESSION_OK, approved=True, scope="session") == "session"
    assert check_answer(SESSION_OK, approved=True, scope="once") == "once"
    with pytest.raises(PolicyError) as caught:
        check_answer(ONCE_ONLY, approved=True, scope="session")
    assert (caught.value.status, caught.value.code) == (403, "approval_scope_not_allowed")


def test_a_deny_is_always_for_this_request_only() -> None:
    assert check_answer(ONCE_ONLY, approved=False, scope="session") == "once"


def test_an_unknown_scope_is_a_bad_request() -> None:
    with pytest.raises(PolicyError) as caught:
        check_answer(SESSION_OK, approved=True, scope="forever")
    assert (caught.value.status, caught.value.code) == (400, "bad_request")


ASKED = ("Colour?", "Size?")


@pytest.mark.parametrize(
    ("answers", "notes"),
    [
        ({"Colour?": "Red"}, {}),
        ({"Colour?": "Red", "Size?": "L"}, {"Size?": "roomy"}),
        # Some questions left unanswered: the CLI takes what is there.
        ({"Size?": "L"}, {"Colour?": "no idea"}),
    ],
)
def test_an_answer_to_a_question_that_was_asked_is_taken(
    answers: dict[str, str], notes: dict[str, str]
) -> None:
    check_question_answers(ASKED, answers, notes)


@pytest.mark.parametrize(
    ("answers", "notes", "says"),
    [
        ({}, {}, "no answer given"),
        ({}, {"Colour?": "a note is no answer"}, "no answer given"),
        ({"Colour?": ""}, {}, "no answer given"),
        ({"Colour?": "Red", "Size?": "  "}, {}, "no answer given"),
        ({"Other question?": "x"}, {}, "not asked"),
        ({"Colour?": "Red", "colour?": "Blue"}, {}, "not asked"),
        ({"Colour?": "Red"}, {"Other question?": "x"}, "not asked"),
    ],
)
def test_an_answer_that_answers_no_question_asked_is_a_bad_request(
    answers: dict[str, str], notes: dict[str, str], says: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        check_question_answers(ASKED, answers, notes)
    assert (caught.value.status, caught.value.code) == (400, "bad_request")
    assert says in caught.value.message
    # What a person typed is not echoed back (it may hold anything).
    assert "Other question?" not in caught.value.message


def test_a_deny_tells_the_model_the_feedback_or_the_text_of_its_mode() -> None:
    assert deny_message(None, "  Use the other file.  ") == "Use the other file."
    assert deny_message("reject_hard", "Stop.") == "Stop."
    assert deny_message(None, None) == DENIED_MESSAGE
    assert deny_message("reject_soft", " ") == DENIED_MESSAGE
    assert "end your turn" in deny_message("reject_hard", None)
    assert "explain" in deny_message("reject_explain", None)
    with pytest.raises(PolicyError) as caught:
        deny_message("reject_all", None)
    assert caught.value.status == 400


def test_the_timeout_message_names_the_wait_and_what_to_do() -> None:
    assert timeout_message(120.0).startswith("No one answered within 120 s, so this was not run.")
    assert "1.5 s" in timeout_message(1.5)


# --- the CLI's argv -------------------------------------------------------------------------------

SID = "0b6f6d52-3b9e-4bb1-9d4c-5a3e2f0c1d2e"


def argv_of(approvals: ApprovalsConfig, *rules: str) -> tuple[str, ...]:
    base = parse_config(config(""), "c.toml")
    cfg = msgspec.structs.replace(
        base,
        approvals=approvals,
        policy=msgspec.structs.replace(base.policy, allowed_tools=rules),
    )
    return build_argv(cfg, mode=resolve_mode(cfg, None), session_id=SID, resumed=False)


def flags_after(argv: tuple[str, ...], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def test_approvals_off_launch_with_prompts_denied_and_on_with_prompts_asked_on_stdio() -> None:
    off = argv_of(ApprovalsConfig())
    assert flags_after(off, "--permission-prompts") == ["none"]
    assert "--permission-prompt-tool" not in off
    on = argv_of(ON)
    assert flags_after(on, "--permission-prompts") == ["host"]
    assert flags_after(on, "--permission-prompt-tool") == ["stdio"]
    assert flags_after(on, "--permission-mode") == ["manual"]


@pytest.mark.parametrize(
    ("approvals", "rules"),
    [
        (ApprovalsConfig(), ("--permission-prompts", "host")),
        (ApprovalsConfig(), ("--permission-prompt-tool", "stdio")),
        (ON, ("--permission-prompt-tool", "mcp__evil__approve")),
        (ON, ("--permission-prompts", "none")),
        (ON, ("--permission-prompts=none",)),
        (ApprovalsConfig(), ("--permission-prompt-tool=stdio",)),
    ],
)
def test_the_argv_guard_refuses_any_other_prompt_setting(
    approvals: ApprovalsConfig, rules: tuple[str, ...]
) -> None:
    """Defence in depth: a Config built in code skips validation, the guard does not."""
    with pytest.raises(PolicyError) as caught:
        argv_of(approvals, *rules)
    assert caught.value.code == "bypass_refused"
