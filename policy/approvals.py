"""``[approvals]``: which permission prompts a person may answer, and how far an answer reaches.

Off by default: a run fails closed exactly as before (``--permission-prompts none``). On, the
CLI asks the host (``can_use_tool``), and this module decides before anyone is asked
(:func:`judge`): a prompt for a tool outside ``ask`` is denied at once, as is one past
``max_pending``; the rest become a request a person answers. :func:`check_answer` refuses an
answer that would reach further than the operator allows: ``session`` scope only for
``allow_session`` tools asked about inside the Work Room, and only as the session rule policy
chose (:class:`SessionRule`). No answer can change the permission mode: the mode-switching tools
can never be asked about (they would leave plan mode on an "allow"), and the control lines
(``translator.control``) carry nothing else.

A session rule naming a whole file tool (``{"toolName": "Write"}``) lets that tool write
*anywhere* for the rest of the session, outside the workspace too (measured on 2.1.332). So a
file tool's rule is ``Edit(//<cwd>/**)``: the CLI's Edit rules cover every file-editing tool,
and this one only inside the run's workspace (measured: a later Write inside runs unasked, one
outside is asked again). It covers all four file tools at once, so it is offered only when every
file tool the operator asks about may be approved for the session.

Pure: the workspace is compared as strings (``posixpath``), nothing is read from disk.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

from codelegate.policy.codes import APPROVAL_SCOPE_NOT_ALLOWED, BAD_REQUEST
from codelegate.policy.errors import PolicyError

Scope = Literal["workroom", "elevated", "unknown"]
AnswerScope = Literal["once", "session"]
RejectMode = Literal["reject_soft", "reject_hard", "reject_explain"]

QUESTION_TOOL: Final = "AskUserQuestion"
# The CLI's ``decision_reason_type`` of a prompt about a path outside its working directories,
# and of one about a "sensitive file" inside them (.git/config, .bashrc, .claude/settings.json:
# measured on 2.1.332, asked in acceptEdits too). Neither is a routine Work Room change: a
# workspace's .git/config runs commands (core.fsmonitor) on the next read-only ``git status``.
ELEVATED_REASONS: Final = frozenset({"workingDir", "safetyCheck"})
# Claude Code's tools that change files: a session rule covers them all at once (above), and a
# card of one is a file change (translator.summary).
FILE_CHANGE_TOOLS: Final = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
# Tools whose "allow" changes the session's permission mode (plan mode ends on ExitPlanMode):
# never asked about, whatever the config says, so no answer can produce a mode change.
MODE_TOOLS: Final = frozenset({"ExitPlanMode", "EnterPlanMode"})
# A tool name, not a rule: a rule's content (``Bash(git:*)``) is the CLI's to match, and a
# session rule we write names a whole tool.
TOOL_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_PATH_KEYS: Final = ("file_path", "notebook_path")
# A workspace path that can go into a rule as it is: no glob or rule syntax, no spaces.
_RULE_PATH: Final = re.compile(r"/[A-Za-z0-9._/@+-]*", re.ASCII)

OFF_MESSAGE: Final = (
    "This needs a person's approval, and approvals are off for this daemon, so it was not run. "
    "Continue without it, or end your turn and say what you need."
)
NOT_ASKABLE_MESSAGE: Final = (
    "This needs a person's approval, and the operator does not let anyone approve this tool "
    "here, so it was not run. Continue without it, or end your turn and say what you need."
)
TOO_MANY_MESSAGE: Final = (
    "Too many approval requests of this run are waiting for an answer already, so this was "
    "not run. Wait for them, or continue without it."
)
UNREADABLE_MESSAGE: Final = "The permission request could not be read, so this was not run."
DENIED_MESSAGE: Final = "The user denied this"
_REJECT_MESSAGES: Final[dict[str, str]] = {
    "reject_soft": DENIED_MESSAGE,
    "reject_hard": "The user denied this. Do not try it another way; end your turn.",
    "reject_explain": "The user denied this and asks you to explain why it is needed first.",
}


class ApprovalsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[approvals]``: whether a person may answer permission prompts, and for what."""

    enabled: bool = False
    # Prompts for other tools are denied at once.
    ask: tuple[str, ...] = ("Edit", "Write", "MultiEdit", "NotebookEdit", "Bash")
    # May be approved for the rest of the session (a session rule for the whole tool). Not Bash
    # by default: a rule for Bash would let every later command run unasked.
    allow_session: tuple[str, ...] = ("Edit", "Write", "MultiEdit", "NotebookEdit")
    # Unanswered this long: denied, with a message the model can act on.
    timeout_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 120.0
    # Requests of one run waiting at once (more come only from parallel subagents); more: denied.
    max_pending: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4


def approvals_problem(cfg: ApprovalsConfig, disallowed: tuple[str, ...]) -> tuple[str, str] | None:
    """``(key, expected)`` for what is wrong with ``[approvals]``, None when nothing is.

    ``disallowed`` is ``[policy] disallowed_tools``: a tool always denied cannot be asked about.
    """
    for field in ("ask", "allow_session"):
        for index, name in enumerate(getattr(cfg, field)):
            key = f"approvals.{field}[{index}]"
            if not TOOL_NAME.fullmatch(name):
                return key, f"expected a tool name such as 'Write' (no rule content); got {name!r}"
            if name in MODE_TOOLS:
                return key, f"{name} changes the permission mode: it is never approvable"
            if name == QUESTION_TOOL:
                return key, f"{QUESTION_TOOL} is a question, always put to a person; remove it"
            if name in disallowed:
                return key, f"{name} is in policy.disallowed_tools: it is always denied"
    for index, name in enumerate(cfg.allow_session):
        if name not in cfg.ask:
            return (
                f"approvals.allow_session[{index}]",
                f"expected a tool listed in approvals.ask; got {name!r}",
            )
    return None


class Prompt(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A permission prompt of the CLI: the fields of its ``can_use_tool`` request policy reads,
    raw (decoded from the request itself, other fields ignored)."""

    tool_name: str
    input: dict[str, Any]
    blocked_path: str | None = None
    decision_reason_type: str | None = None
    agent_id: str | None = None

    @property
    def question(self) -> bool:
        """AskUserQuestion: a question for a person, not a permission."""
        return self.tool_name == QUESTION_TOOL

    @property
    def sensitive(self) -> bool:
        """The CLI asks because of the file itself (a "sensitive file"), not of its place."""
        return self.decision_reason_type == "safetyCheck"


class SessionRule(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The one session rule an approval for the session may add (an allow rule, destination
    ``session``): a tool, narrowed to a path pattern for the file tools."""

    tool_name: str
    rule_content: str | None = None


class Verdict(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What policy says of a prompt before anyone is asked."""

    ask: bool  # False: denied now with ``deny_message`` (``by: policy``)
    classification: Scope
    allow_once: bool  # O Chat's allowOnce: only inside the Work Room
    allow_session: bool  # a session rule may be granted: ``session_rule``
    deny_message: str | None = None
    session_rule: SessionRule | None = None


def classify(prompt: Prompt, cwd: str) -> Scope:
    """Where the prompt reaches: ``workroom`` (every path it names inside ``cwd``),
    ``elevated`` (a path outside it) or ``unknown`` (no path to judge by: a Bash command is not
    confined by anything the CLI tells us, so without a path it is not called confined)."""
    if prompt.decision_reason_type in ELEVATED_REASONS:
        return "elevated"  # the CLI's own word: outside the working directories, or sensitive
    paths: list[object] = [prompt.blocked_path] if prompt.blocked_path is not None else []
    paths += [prompt.input[key] for key in _PATH_KEYS if key in prompt.input]
    if not paths:
        return "unknown"
    root = posixpath.normpath(cwd)
    for path in paths:
        if not isinstance(path, str) or not path or "\x00" in path or not root.startswith("/"):
            return "unknown"
        full = posixpath.normpath(posixpath.join(root, path))
        if full != root and not full.startswith(root.rstrip("/") + "/"):
            return "elevated"
    return "workroom"


def judge(cfg: ApprovalsConfig, prompt: Prompt, *, cwd: str, pending: int) -> Verdict:
    """Ask a person, or deny now; ``pending`` is how many requests of the run wait already."""
    if prompt.question:
        # A question carries no permission: nothing to classify, nothing to keep for a session.
        if not cfg.enabled or pending >= cfg.max_pending:
            return Verdict(
                ask=False,
                classification="workroom",
                allow_once=False,
                allow_session=False,
                deny_message=OFF_MESSAGE if not cfg.enabled else TOO_MANY_MESSAGE,
            )
        return Verdict(ask=True, classification="workroom", allow_once=True, allow_session=False)
    scope = classify(prompt, cwd)
    tool = prompt.tool_name
    message: str | None = None
    if not cfg.enabled:
        message = OFF_MESSAGE
    elif tool not in cfg.ask or tool in MODE_TOOLS or not TOOL_NAME.fullmatch(tool):
        message = NOT_ASKABLE_MESSAGE
    elif pending >= cfg.max_pending:
        message = TOO_MANY_MESSAGE
    workroom = scope == "workroom"
    rule = session_rule(cfg, tool, cwd) if message is None and workroom else None
    return Verdict(
        ask=message is None,
        classification=scope,
        allow_once=message is None and workroom,
        allow_session=rule is not None,
        deny_message=message,
        session_rule=rule,
    )


def session_rule(cfg: ApprovalsConfig, tool: str, cwd: str) -> SessionRule | None:
    """The rule a session approval of ``tool`` adds, None when it may not have one (see the
    module docstring for why a file tool's is an Edit rule over the workspace)."""
    if tool not in cfg.allow_session:
        return None
    if tool not in FILE_CHANGE_TOOLS:
        return SessionRule(tool_name=tool)
    asked_files = FILE_CHANGE_TOOLS.intersection(cfg.ask)
    root = posixpath.normpath(cwd)
    if not asked_files <= set(cfg.allow_session) or not _RULE_PATH.fullmatch(root) or root == "/":
        return None
    return SessionRule(tool_name="Edit", rule_content=f"/{root}/**")


def check_answer(verdict: Verdict, *, approved: bool, scope: str) -> AnswerScope:
    """The scope an answer gets; refuses one that reaches further than policy allows.

    ``session`` on a deny means nothing (a deny is for this request): it is ``once``.
    """
    if scope not in ("once", "session"):
        raise PolicyError(BAD_REQUEST, f"scope must be 'once' or 'session'; got {scope!r}")
    if not approved or scope == "once":
        return "once"
    if not verdict.allow_session:
        raise PolicyError(
            APPROVAL_SCOPE_NOT_ALLOWED,
            "this request may be approved once only: the operator allows session approval "
            "only for [approvals] allow_session tools, inside the Work Room",
        )
    return "session"


def check_question_answers(
    asked: Collection[str], answers: Mapping[str, str], notes: Mapping[str, str]
) -> None:
    """Refuses an answer to a question request that answers no question that was asked.

    ``asked``: the questions' texts as asked (the CLI keys answers by them). An answer keyed by
    any other text, or an empty one, would reach the model as "the user did not answer" and
    use the question up, while the client is told it succeeded: it is refused (400) instead,
    and the question stays open for a correct answer. The texts are not echoed: a person typed
    them.
    """
    for key in (*answers, *notes):
        if key not in asked:
            raise PolicyError(
                BAD_REQUEST,
                "an answer or note names a question that was not asked: key each by the "
                "question's text as asked, or use 'answer' for the first question",
            )
    if not answers or not all(text.strip() for text in answers.values()):
        raise PolicyError(
            BAD_REQUEST,
            "no answer given: answer at least one question that was asked (no empty answer), "
            "or decline",
        )


def deny_message(mode: str | None, feedback: str | None) -> str:
    """What a person's deny tells the model: their feedback, else the text of its mode."""
    if feedback is not None and feedback.strip():
        return feedback.strip()
    if mode is not None and mode not in _REJECT_MESSAGES:
        raise PolicyError(
            BAD_REQUEST, f"mode must be one of {', '.join(_REJECT_MESSAGES)}; got {mode!r}"
        )
    return _REJECT_MESSAGES[mode or "reject_soft"]


def timeout_message(timeout_s: float) -> str:
    """The deny a request gets when nobody answered in time."""
    return (
        f"No one answered within {timeout_s:g} s, so this was not run. Continue without it, "
        "or end your turn and say what you need approved."
    )
