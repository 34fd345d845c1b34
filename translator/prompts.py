"""What a ``can_use_tool`` request says, and the fixed texts O Chat shows it with.

The request body is decoded apart from its line (``wire.ControlRequest`` keeps it raw), so that
a body of an odd shape still leaves its request id to answer by. The approval card's texts come
from O Chat's allowlists (DESIGN "Approvals"): anything else hides the card.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from codelegate.policy.approvals import FILE_CHANGE_TOOLS, Prompt, Verdict
from codelegate.translator.frames import AskUserOption, AskUserQuestion, ProviderApproval

# A question's texts are the model's: bounded like a path or a name.
QUESTION_CHARS: Final = 1024

_SCOPE_TEXTS: Final = {
    "workroom": "This Work Room only",
    "elevated": "Outside this Work Room",
    "unknown": "Boundary could not be verified",
}
_INSPECT_TOOLS: Final = frozenset({"Read", "Glob", "Grep", "LS"})


class CanUseTool(msgspec.Struct, gc=False):
    """The fields of a ``can_use_tool`` request the translator reads (2.1.332's shape) besides
    the ones policy reads (its :class:`~policy.approvals.Prompt`)."""

    subtype: str = ""
    tool_use_id: str = ""
    description: str | None = None


class Option(msgspec.Struct, gc=False):
    label: str
    description: str = ""


class Question(msgspec.Struct, gc=False):
    """One of AskUserQuestion's questions (its input's ``questions``)."""

    question: str
    header: str = ""
    options: list[Option] = msgspec.field(default_factory=list)
    multiSelect: bool = False


class _Questions(msgspec.Struct, gc=False):
    questions: list[Question]


_request_decoder: Final = msgspec.json.Decoder(CanUseTool)
_prompt_decoder: Final = msgspec.json.Decoder(Prompt)


def decode_request(raw: msgspec.Raw) -> tuple[CanUseTool, Prompt | None] | None:
    """The request body and its prompt; None when the body is not an object, the prompt None
    when the fields policy needs are missing or of another shape (an input that is not an
    object, no tool name)."""
    try:
        request = _request_decoder.decode(raw)
    except msgspec.MsgspecError:
        return None
    try:
        return request, _prompt_decoder.decode(raw)
    except msgspec.MsgspecError:
        return request, None


def read_questions(raw: Any) -> list[Question] | None:
    """AskUserQuestion's questions; None when there are none or the input is of another shape."""
    try:
        questions = msgspec.convert(raw, _Questions).questions
    except msgspec.ValidationError:
        return None
    return questions or None


def shown_questions(
    questions: list[Question], said: Callable[[str], str], items: int
) -> list[AskUserQuestion]:
    """The questions as a frame carries them: every text through ``said``, lists bounded."""
    return [
        AskUserQuestion(
            question=said(q.question),
            header=said(q.header),
            options=[
                AskUserOption(label=said(o.label), description=said(o.description))
                for o in q.options[:items]
            ],
            multiSelect=q.multiSelect,
        )
        for q in questions[:items]
    ]


def provider_approval(
    tool: str, verdict: Verdict, files: list[str] | None, *, sensitive: bool = False
) -> ProviderApproval:
    """O Chat's card for a prompt about ``tool`` (the Claude tool name); ``sensitive``: the CLI
    asks because of the file itself (``Prompt.sensitive``), which O Chat's card must not call a
    routine change."""
    file_tool = tool in FILE_CHANGE_TOOLS
    return ProviderApproval(
        action=_action(tool),
        scope=_SCOPE_TEXTS[verdict.classification],
        reason=_reason(file_tool, sensitive),
        scopeClassification=verdict.classification,
        allowOnce=verdict.allow_once,
        allowSession=verdict.allow_session,
        files=files if file_tool else None,
    )


def _reason(file_tool: bool, sensitive: bool) -> str:
    if sensitive:
        # Writing .claude/settings.json or .git/config widens what runs unasked.
        return "Review the requested permission expansion"
    if file_tool:
        return "Apply the requested workspace file changes"
    return "Claude Code requested approval to continue"


def _action(tool: str) -> str:
    if tool == "Bash":
        return "Run a workspace command"
    if tool in FILE_CHANGE_TOOLS:
        return "Make workspace file changes"
    if tool in _INSPECT_TOOLS:
        return "Inspect the workspace"
    return "Perform a provider action"
