"""Input Structs for Claude Code's ``stream-json`` lines.

Only the fields the translator uses are declared: msgspec skips the rest without building
Python objects, which is most of the translator's speed. Lines are a tagged union on ``type``
(``result`` lines put ``type`` near the end of the object; msgspec finds it anyway). Unknown
types are not an error of the union's own: :func:`decode_line` falls back to reading the bare
``type`` so that an unknown type is counted apart from a malformed line. The types that carry
nothing for cards are in the union all the same (:data:`QUIET_LINES`): a block of lines holding
one is still decoded in one call.

``system`` lines declare only ``subtype``: each subtype the translator acts on is decoded a second
time with its own Struct, so that a field of an odd shape in a subtype we ignore never costs us
the line.
"""

from __future__ import annotations

from typing import Any, Final, Union, cast, get_args

import msgspec

from codelegate.translator.partial import Event, LooseStreamEvent

# Raw fields are captured without being parsed; "absent" reads the same as JSON null.
_RAW_NULL: Final = msgspec.Raw(b"null")


class Block(msgspec.Struct, gc=False):
    """A content block of an assistant message (text, thinking, tool_use, …)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None


class Message(msgspec.Struct, gc=False):
    content: list[Block] | str = ""


class Part(msgspec.Struct, gc=False):
    """A part of a tool_result's content list (text, image, …)."""

    type: str = ""
    text: str | None = None


class ResultBlock(msgspec.Struct, gc=False):
    """A content block of a user message; only ``tool_result`` blocks matter."""

    type: str = ""
    tool_use_id: str | None = None
    content: str | list[Part] | None = None
    is_error: bool | None = None


class UserMessage(msgspec.Struct, gc=False):
    content: list[ResultBlock] | str = ""


class _Line(msgspec.Struct, tag_field="type", gc=False):
    pass


class Assistant(_Line, tag="assistant"):
    message: Message
    parent_tool_use_id: str | None = None


class User(_Line, tag="user"):
    message: UserMessage
    parent_tool_use_id: str | None = None
    # Structured data about the tool's result (Edit's structuredPatch, an async launch …). Its
    # shape differs per tool: kept raw and decoded only for the tools that need it.
    tool_use_result: msgspec.Raw = _RAW_NULL
    # The echo of a user message written to stdin (--replay-user-messages), not a tool result.
    isReplay: bool = False


class System(_Line, tag="system"):
    """Any ``system`` line. Fields used by some subtypes only are kept raw (their shape may
    differ in subtypes we ignore) and read with :func:`text` / :func:`task_usage`."""

    subtype: str = ""
    session_id: str | None = None
    tool_use_id: msgspec.Raw = _RAW_NULL
    tool_name: msgspec.Raw = _RAW_NULL
    message: msgspec.Raw = _RAW_NULL
    decision_reason: msgspec.Raw = _RAW_NULL
    task_id: msgspec.Raw = _RAW_NULL
    status: msgspec.Raw = _RAW_NULL
    summary: msgspec.Raw = _RAW_NULL
    description: msgspec.Raw = _RAW_NULL
    last_tool_name: msgspec.Raw = _RAW_NULL
    usage: msgspec.Raw = _RAW_NULL
    patch: msgspec.Raw = _RAW_NULL
    tasks: msgspec.Raw = _RAW_NULL  # background_tasks_changed: every open background task


class Result(_Line, tag="result"):
    subtype: str = ""
    is_error: bool = False
    result: str | None = None
    session_id: str | None = None
    num_turns: int | None = None
    duration_ms: int | None = None
    total_cost_usd: float | None = None
    api_error_status: int | str | None = None
    usage: msgspec.Raw = _RAW_NULL
    permission_denials: msgspec.Raw = _RAW_NULL
    errors: msgspec.Raw = _RAW_NULL


class ToolProgressLine(_Line, tag="tool_progress"):
    tool_use_id: str = ""
    # A heartbeat has a synthetic tool_use_id ("<id>-heartbeat-0"); the tool's id is here.
    parent_tool_use_id: str | None = None
    elapsed_time_seconds: float = 0


class StreamEvent(_Line, tag="stream_event"):
    """A partial message (``--include-partial-messages``): a block starts, text grows. The
    full assistant line of each block still follows; thinking and tool input deltas are not
    read (a card's arguments come complete with that line)."""

    event: Event | None = None
    parent_tool_use_id: str | None = None


class ControlRequest(_Line, tag="control_request"):
    """The CLI asks the host (``can_use_tool``): the request is decoded by translator.approvals,
    so that a request of an odd shape can still be answered (denied) by its id."""

    request_id: str = ""
    request: msgspec.Raw = _RAW_NULL


class ControlCancel(_Line, tag="control_cancel_request"):
    """The CLI withdraws a request of its own (before it answers an interrupt)."""

    request_id: str = ""


class Quiet(_Line):
    """A line of a type that carries nothing for cards: read, dropped, never counted."""


# The quiet types of this CLI version (control_response answers our own requests: initialize,
# interrupt, stop_task; rate_limit_event is about quotas). One Struct each, made here: each tag
# needs a class of its own, and a class says no more than its tag.
QUIET_LINES: Final[tuple[type[Quiet], ...]] = tuple(
    cast(type[Quiet], msgspec.defstruct(f"Quiet_{tag}", (), bases=(Quiet,), tag=tag))
    for tag in (
        "rate_limit_event",
        "keep_alive",
        "control_response",
        "conversation_reset",
        "prompt_suggestion",
        "auth_status",
    )
)

Line = (
    Assistant
    | User
    | System
    | Result
    | ToolProgressLine
    | StreamEvent
    | ControlRequest
    | ControlCancel
    | Quiet
)


# --- system subtypes the translator acts on (decoded a second time) ---------------------------


class TaskUsage(msgspec.Struct, gc=False):
    total_tokens: int | None = None
    tool_uses: int | None = None
    duration_ms: int | None = None


class TaskPatch(msgspec.Struct, gc=False):
    status: str | None = None


class _Task(msgspec.Struct, gc=False):  # one of background_tasks_changed's ``tasks``
    task_id: str = ""


# --- tool_use_result shapes --------------------------------------------------------------------


class Hunk(msgspec.Struct, gc=False):
    oldStart: int
    oldLines: int
    newStart: int
    newLines: int
    lines: list[str]


class ToolUseResult(msgspec.Struct, gc=False):
    status: str | None = None  # "async_launched" for a background subagent
    type: str | None = None  # Write: "create" | "update"
    structuredPatch: list[Hunk] | None = None


class Denial(msgspec.Struct, gc=False):
    tool_use_id: str | None = None
    tool_name: str | None = None
    tool_input: Any = None


class _Envelope(msgspec.Struct, gc=False):
    type: str | None = None


# The classes lines are decoded into (Quiet itself stands for its tagged subclasses only), and
# their tags: a line of any other type is counted as ``unknown_type``.
_DECODED: Final = (*(cls for cls in get_args(Line) if cls is not Quiet), *QUIET_LINES)
KNOWN_TYPES: Final = frozenset(cls.__struct_config__.tag for cls in _DECODED)
# ``system`` subtypes that the pinned CLI (2.1.332) emits. A subtype outside this set is counted
# as ``unknown_type``, so that operators see a new CLI version speak of something new.
KNOWN_SUBTYPES: Final = frozenset(
    [
        "agents_killed",
        "api_error",
        "api_retry",
        "away_summary",
        "background_tasks_changed",
        "bridge_state",
        "bridge_status",
        "checkpoint_done",
        "cloud_session_delta",
        "cloud_session_status",
        "code_change_published",
        "commands_changed",
        "compact_boundary",
        "control_request_progress",
        "dev_intent",
        "elicitation_complete",
        "feedback_draft_queued",
        "file_attachments_missing",
        "file_snapshot",
        "files_persisted",
        "hook_progress",
        "hook_response",
        "hook_started",
        "informational",
        "inherited_asks_settled",
        "init",
        "instruction_size_warning",
        "late_allow_not_run",
        "local_command",
        "local_command_output",
        "memory_recall",
        "memory_saved",
        "mirror_error",
        "model_consent_fallback",
        "model_fallback",
        "model_refusal_fallback",
        "model_refusal_no_fallback",
        "notification",
        "peer_message_hold",
        "per_turn_effort_changed",
        "permission_check_status",
        "permission_denied",
        "permission_retry",
        "placed",
        "plugin_install",
        "post_turn_summary",
        "rewind_stand_in",
        "scheduled_task_fire",
        "session_metadata",
        "session_state_changed",
        "session_title_changed",
        "session_writes_lost",
        "shell_cwd",
        "start_folder",
        "status",
        "stop_hook_summary",
        "task_list_statuses",
        "task_notification",
        "task_progress",
        "task_started",
        "task_summary",
        "task_updated",
        "thinking",
        "thinking_tokens",
        "tool_host_result",
        "turn_began_before_init",
        "turn_duration",
        "turn_handoff_available",
        "turn_preempted",
        "turn_starting",
        "ui_focus",
        "ui_invalidate",
        "ui_log",
        "ui_notify",
        "ui_notify_cancel",
        "ui_panes",
        "ui_placed",
        "ui_scroll",
        "ui_status",
        "ui_toast",
        "upgrade_relay_marker",
        "vcs_state_changed",
        "voice_call_talk",
        "worker_shutting_down",
    ]
)

_line_decoder: Final[msgspec.json.Decoder[Line]] = msgspec.json.Decoder(
    Union[_DECODED]  # noqa: UP007 - a union of classes made at run time
)
_envelope_decoder: Final = msgspec.json.Decoder(_Envelope)
_loose_decoder: Final = msgspec.json.Decoder(LooseStreamEvent)


class UnknownType(Exception):
    """A well-formed line of a type this version does not know (counted, never fatal)."""


def decode_line(line: bytes) -> Line:
    """Decode one line (a :class:`Quiet` one for a known type that carries nothing).

    Raises :class:`UnknownType`, or ``msgspec.MsgspecError`` for a malformed line.
    """
    try:
        return _line_decoder.decode(line)
    except msgspec.ValidationError:
        kind = line_type(line)
        if kind == "stream_event":
            # An event or delta of a type the union does not list: it carries nothing, but a
            # line of a wrong shape is still malformed (this raises).
            loose = _loose_decoder.decode(line)
            return StreamEvent(parent_tool_use_id=loose.parent_tool_use_id)
        if kind is not None and kind not in KNOWN_TYPES:
            raise UnknownType(kind) from None
        raise


def line_type(line: bytes) -> str | None:
    """A line's bare ``type`` (None when it names none); raises ``msgspec.DecodeError`` for a
    line that is not a JSON object."""
    return _envelope_decoder.decode(line).type


tool_use_result_decoder: Final = msgspec.json.Decoder(ToolUseResult)
denials_decoder: Final = msgspec.json.Decoder(list[Denial])
errors_decoder: Final = msgspec.json.Decoder(list[str])
_text_decoder: Final = msgspec.json.Decoder(str | None)
_usage_decoder: Final = msgspec.json.Decoder(TaskUsage | None)
_patch_decoder: Final = msgspec.json.Decoder(TaskPatch | None)
_tasks_decoder: Final = msgspec.json.Decoder(list[_Task] | None)


def decode_lines(block: bytes | memoryview) -> list[Line]:
    """Every line of a block of complete lines at once; raises if any line is bad or unknown."""
    return _line_decoder.decode_lines(block)


def text(raw: msgspec.Raw) -> str | None:
    """A raw field as a string; None when absent, null or not a string."""
    if raw is _RAW_NULL:
        return None  # absent (decoded lines share the default): most fields of most lines
    try:
        return _text_decoder.decode(raw)
    except msgspec.ValidationError:
        return None


def task_usage(raw: msgspec.Raw) -> TaskUsage:
    """A task's usage counters (empty when absent or of another shape)."""
    try:
        return _usage_decoder.decode(raw) or TaskUsage()
    except msgspec.ValidationError:
        return TaskUsage()


def patch_status(raw: msgspec.Raw) -> str | None:
    """The status of a ``task_updated`` patch, if it has one."""
    try:
        patch = _patch_decoder.decode(raw)
    except msgspec.ValidationError:
        return None
    return patch.status if patch else None


def task_ids(raw: msgspec.Raw) -> tuple[str, ...] | None:
    """The ids of the tasks a ``background_tasks_changed`` line lists (every open background
    task: Bash or subagent); None when it lists none readable."""
    try:
        tasks = _tasks_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return None if tasks is None else tuple(task.task_id for task in tasks)
