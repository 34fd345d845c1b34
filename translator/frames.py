"""Frames: what crosses the live boundary (WebSocket, NDJSON, the run store).

They follow ConnectOnion's Agent IO wire events so that existing clients, which key cards by
``tool_id`` and update them in place, render them unchanged. Every frame is a frozen msgspec
Struct tagged by ``type``; fields that are ``None`` by default are left out of the JSON, so that a
frame carries only what applies to it. See DESIGN.md, "Frames".
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

PROVIDER: Final = "claude_code"

ToolStatus = Literal["in_progress", "completed", "failed"]
ErrorType = Literal["tool_error", "permission_denied", "cancelled", "interrupted", "timeout"]
InvocationStatus = Literal[
    "starting", "running", "awaiting_approval", "completed", "failed", "cancelled"
]
OChatPermissionMode = Literal["manual", "auto_approve"]
ActivityKind = Literal["command", "file_change", "inspect", "search", "tool"]
ActivityStatus = Literal["running", "completed", "failed"]
DiagnosticCode = Literal[
    "malformed_line", "oversized_line", "unknown_type", "stderr", "orphan_line", "frames_not_stored"
]
RunStatus = Literal["completed", "failed", "cancelled", "timeout", "interrupted"]
# Who resolved an approval request: a person (client), nobody in time, a cancel of the run,
# operator policy (denied before anyone was asked), or the CLI or daemon going away.
ResolvedBy = Literal["client", "timeout", "cancel", "policy", "interrupted"]
ScopeClass = Literal["workroom", "elevated", "unknown"]


# Fields a client relies on (provider, status, role, result …) have no default: ``omit_defaults``
# leaves a default-valued field out of the JSON, and O Chat drops a provider_invocation without
# ``provider`` or ``taskTitle``.
class _Frame(msgspec.Struct, frozen=True, gc=False, omit_defaults=True, tag_field="type"):
    """Fields every frame carries: the envelope, first in the JSON.

    They may be given by position (in this order; the run state stamps them so), every other
    field of a frame by keyword only: a Struct takes positions much faster than keywords.
    """

    id: str
    run_id: str
    seq: int
    ts: float
    provider: Literal["claude_code"]
    child_session_id: str | None = None
    invocationId: str | None = None
    parentToolCallId: str | None = None


class ToolCall(_Frame, tag="tool_call", frozen=True, kw_only=True):
    """A card opens: the first time a tool_use id is seen."""

    tool_id: str
    name: str
    args: Any
    status: Literal["in_progress"]
    parent_tool_id: str | None = None
    summary: str = ""


class ToolProgress(_Frame, tag="tool_progress", frozen=True, kw_only=True):
    """An open card is still working (elapsed time, subagent counters)."""

    tool_id: str
    name: str
    elapsed_ms: int
    summary: str | None = None
    tool_uses: int | None = None
    total_tokens: int | None = None
    last_tool_name: str | None = None


class ToolCallUpdate(_Frame, tag="tool_call_update", frozen=True, kw_only=True):
    """An open card's progress as text (a running update replaces a card's text in O Chat).

    Sent only without a Work Room: inside one, O Chat ignores it for typed rows. Other clients
    read ``tool_progress``."""

    tool_id: str
    name: str
    status: Literal["in_progress"]
    result: str
    parent_tool_id: str | None = None


class ToolResult(_Frame, tag="tool_result", frozen=True, kw_only=True):
    """A card closes, exactly once."""

    tool_id: str
    name: str
    status: Literal["completed", "failed"]
    result: str
    timing_ms: int | None = None
    error: str | None = None
    error_type: ErrorType | None = None
    diff: str | None = None
    parent_tool_id: str | None = None


class ProviderMessage(_Frame, tag="provider_message", frozen=True, kw_only=True):
    """Assistant text."""

    role: Literal["assistant"]
    # The run's n-th message ("<run_id>:message:<n>"): O Chat keeps a message by it. Empty only
    # in frames stored before it existed.
    messageId: str = ""
    text: str
    parent_tool_id: str | None = None
    # True while the text is still streaming (the last frame of a messageId has the full text):
    # a client that prints messages once prints the one without it.
    partial: bool = False


class ProviderInvocation(_Frame, tag="provider_invocation", frozen=True, kw_only=True):
    """The delegated call's lifecycle, for O Chat's Work Room (when the request named a parent)."""

    status: InvocationStatus
    stateRevision: int
    permissionMode: OChatPermissionMode
    sessionId: str | None = None
    elapsedMs: int
    taskTitle: Literal["Complete the requested task"]
    currentSummary: str | None = None
    resultSummary: str | None = None
    errorSummary: str | None = None


class ProviderActivity(_Frame, tag="provider_activity", frozen=True, kw_only=True):
    """One Work Room row, mirroring a card (when the request named a parent)."""

    activityId: str
    sequence: int  # the row's place in the Work Room: its card's first-seen ordinal there
    kind: ActivityKind
    status: ActivityStatus
    title: str
    summary: str
    files: list[str] | None = None  # file_change rows: the files, relative to the run's cwd


class ProviderApproval(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """O Chat's approval card texts: each from its allowlist (DESIGN "Approvals"), or it hides
    the card. No defaults: every field is always in the JSON."""

    action: str
    scope: str
    reason: str
    scopeClassification: ScopeClass
    allowOnce: bool
    allowSession: bool
    files: list[str] | None = None  # file tools: its name; a sensitive file's workspace path


class ApprovalNeeded(_Frame, tag="approval_needed", frozen=True, kw_only=True):
    """A permission prompt a person may answer; ``id`` (= ``request_id``) names the request."""

    request_id: str
    tool: str  # the Claude tool name
    arguments: Any  # the tool input, redacted and bounded like a card's args
    description: str | None = None
    tool_id: str  # the card it concerns
    activityId: str | None = None  # the card's Work Room row (with a parent only)
    expires_at: float  # epoch seconds, like ts
    agent_id: str | None = None  # asked from inside a subagent
    providerApproval: ProviderApproval


class AskUserOption(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    label: str
    description: str


class AskUserQuestion(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    question: str
    header: str
    options: list[AskUserOption]
    multiSelect: bool


class AskUser(_Frame, tag="ask_user", frozen=True, kw_only=True):
    """AskUserQuestion: ConnectOnion's ``ask_user`` shape (its first question in ``question``,
    ``options``, ``multi_select``) plus every question in ``questions``."""

    request_id: str
    tool_id: str
    question: str
    options: list[str]
    multi_select: bool
    questions: list[AskUserQuestion]
    expires_at: float
    agent_id: str | None = None


class ApprovalResolved(_Frame, tag="approval_resolved", frozen=True, kw_only=True):
    """A request's end, exactly once per request (also for one policy denied at once)."""

    request_id: str
    decision: Literal["allow", "deny"]
    scope: Literal["once", "session"]
    by: ResolvedBy
    tool: str  # the Claude tool name, as in approval_needed
    tool_id: str


class PermissionDenial(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    tool_id: str
    name: str
    input: Any = None


# How a Bash command of the review evidence ended; "interrupted": the run ended before its
# result came, so it may have run, in part or whole (a parent must not take it as not run).
CommandOutcome = Literal["completed", "failed", "denied", "interrupted"]


class Command(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A Bash command the run ran and how it ended (review evidence, ``translator.review``)."""

    command: str
    outcome: CommandOutcome
    error: str | None = None


class ToolCounts(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    started: int = 0
    completed: int = 0
    failed: int = 0


class FinalResult(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The run's one result: the HTTP answer with ``wait`` and the body of ``run_result``."""

    provider: str = PROVIDER
    run_id: str
    status: RunStatus
    session_id: str | None = None
    resumed: bool = False
    result: str = ""
    error: str | None = None
    exit_code: int | None = None
    num_turns: int | None = None
    duration_ms: int | None = None
    total_cost_usd: float | None = None
    usage: dict[str, Any] | None = None
    permission_denials: list[PermissionDenial] = msgspec.field(default_factory=list)
    tools: ToolCounts = msgspec.field(default_factory=ToolCounts)
    files_changed: list[str] = msgspec.field(default_factory=list)
    # Review evidence (translator.review): the diffs of the changed files, the Bash commands.
    changes: str = ""
    commands: list[Command] = msgspec.field(default_factory=list)
    commands_omitted: int = 0
    # The end of the CLI's stderr (redacted, bounded), when the run did not complete.
    stderr: str | None = None
    # Frames the run store did not keep ([limits] cap; they went out live). Left out when none.
    frames_not_stored: int | msgspec.UnsetType = msgspec.UNSET


class RunResult(_Frame, tag="run_result", frozen=True, kw_only=True):
    """The last frame of every run."""

    result: FinalResult


class Diagnostic(_Frame, tag="diagnostic", frozen=True, kw_only=True):
    """Bad or unknown input, counted; never the raw content."""

    code: DiagnosticCode
    count: int
    detail: str | None = None


Frame = (
    ToolCall
    | ToolCallUpdate
    | ToolProgress
    | ToolResult
    | ProviderMessage
    | ProviderInvocation
    | ProviderActivity
    | RunResult
    | Diagnostic
    | ApprovalNeeded
    | AskUser
    | ApprovalResolved
)

_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(Frame)


def encode_frame(frame: Frame) -> bytes:
    """One frame as compact JSON bytes (encode once, send to every subscriber)."""
    return _encoder.encode(frame)


def decode_frame(data: bytes | str) -> Frame:
    """The inverse of :func:`encode_frame` (for the store, clients and tests)."""
    return _decoder.decode(data)


def frame_id(run_id: str, seq: int) -> str:
    """A frame's stable id: the same frame replayed, from memory or the store, has the same id."""
    return f"{frame_id_prefix(run_id)}{seq}"


def frame_id_prefix(run_id: str) -> str:
    """What every frame id of ``run_id`` starts with, its ``seq`` following (:func:`frame_id`):
    the run state makes it once, as it stamps every frame."""
    return run_id + ":"
