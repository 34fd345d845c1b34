"""A run's inputs (context, limits), how it ended (outcome), and its one final result."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from codelegate.translator import wire
from codelegate.translator.frames import (
    FinalResult,
    InvocationStatus,
    PermissionDenial,
    RunStatus,
    ToolCounts,
)
from codelegate.translator.redact import Redactor, bound_text

if TYPE_CHECKING:
    from codelegate.translator.core import Translator


# A tool's name is short; bounded anyway, as it goes into every frame of its card.
NAME_CHARS: Final = 128


class RunContext(msgspec.Struct, frozen=True, kw_only=True):
    """What the daemon knows of a run before the CLI says anything."""

    run_id: str
    cwd: str  # resolved run cwd: summaries and files_changed are relative to it
    mode: str = "safe"  # request mode: safe | accept_edits | auto | plan
    parent_tool_call_id: str | None = None  # -> invocationId "claude_code:<id>", parentToolCallId
    parent_session_id: str | None = None
    session_id: str | None = None  # the id the CLI was launched with (--session-id / --resume)
    resumed: bool = False
    started_at: float  # epoch seconds
    # The last stateRevision and Work Room row number already used under this run's invocation
    # id by earlier runs (a follow-up continues the Work Room): the daemon keeps them in its store.
    revision_base: int = 0
    sequence_base: int = 0


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds on what frames carry (DESIGN invariant 7); bytes are UTF-8 bytes."""

    arg_bytes: int = 4096
    result_bytes: int = 4096
    final_result_bytes: int = 65536
    line_bytes: int = 8 * 1024 * 1024
    text_chars: int = 16000
    summary_chars: int = 240  # O Chat cuts card summaries there
    error_chars: int = 1024
    items: int = 64  # entries kept per list or object in args
    held_lines: int = 1000  # subagent lines waiting for their Task card
    denials: int = 32
    stderr_chars: int = 2000  # the end of stderr kept in a failed run's result


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """How the CLI process ended, as the daemon saw it."""

    reason: Literal["exited", "cancelled", "timeout", "interrupted", "spawn_failed"]
    exit_code: int | None = None
    signal: int | None = None
    stderr_tail: str = ""  # already redacted and bounded by the daemon
    frames_not_stored: int = 0  # frames past the run store's cap (delivered live only)


_STOPPED: Final[dict[str, RunStatus]] = {
    "cancelled": "cancelled",
    "timeout": "timeout",
    "interrupted": "interrupted",
}
_STOP_ERRORS: Final = {
    "cancelled": "the run was cancelled",
    "timeout": "the run timed out",
    "interrupted": "the run was interrupted (the daemon stopped)",
    "spawn_failed": "the Claude Code CLI could not be started",
}
_DONE_TEXT: Final = "The provider completed its run"
_ERROR_TEXT: Final = "The provider reported an error"
_STOPPED_TEXT: Final = "The provider stopped"
_usage_decoder: Final = msgspec.json.Decoder(dict[str, Any])


def invocation_end(status: RunStatus) -> tuple[InvocationStatus, str]:
    """The Work Room status and its allowlisted text for a run's final status."""
    if status == "completed":
        return "completed", _DONE_TEXT
    if status == "cancelled":
        return "cancelled", _STOPPED_TEXT
    if status == "failed":
        return "failed", _ERROR_TEXT
    return "failed", _STOPPED_TEXT  # timeout, interrupted: we stopped it


def _failure(t: Translator, outcome: Outcome) -> str | None:
    """Why an exited run failed, or None when it completed."""
    last = t.last_result
    ctx = t.ctx
    if ctx.resumed and t.cli_session is not None and t.cli_session != ctx.session_id:
        return "the CLI resumed a different session than the one asked for"
    if last is None:
        return "the Claude Code CLI ended without a result"
    if last.is_error or last.subtype != "success":
        if last.api_error_status is not None:
            return f"API error {last.api_error_status}"
        errors = _decode_errors(last.errors)
        detail = errors[0] if errors else (last.result or "")
        return f"{last.subtype}: {detail}" if detail else last.subtype or "error"
    if outcome.exit_code not in (0, None):
        return f"the Claude Code CLI exited with code {outcome.exit_code}"
    if outcome.signal is not None:
        return f"the Claude Code CLI was killed by signal {outcome.signal}"
    if outcome.exit_code is None:
        return "the Claude Code CLI exit status is unknown"
    return None


def _decode_errors(raw: msgspec.Raw) -> list[str]:
    try:
        return wire.errors_decoder.decode(raw) or []
    except msgspec.MsgspecError:
        return []


def _usage(redactor: Redactor, raw: msgspec.Raw, limit: int) -> dict[str, Any] | None:
    try:
        usage = _usage_decoder.decode(raw)
    except msgspec.MsgspecError:
        return None
    cleaned: dict[str, Any] = redactor.clean_value(usage, string_bytes=256, depth=3, items=32)
    return cleaned if len(msgspec.json.encode(cleaned)) <= limit else None


def _denials(t: Translator) -> list[PermissionDenial]:
    denials = dict(t.denials)
    last = t.last_result
    if last is not None:
        try:
            listed = wire.denials_decoder.decode(last.permission_denials) or []
        except msgspec.MsgspecError:
            listed = []
        for denial in listed:
            if not denial.tool_use_id:
                continue
            tool_id = t._tool_id(denial.tool_use_id)
            if tool_id not in denials:
                denials[tool_id] = PermissionDenial(
                    tool_id=tool_id,
                    name=t._said(denial.tool_name or "unknown", NAME_CHARS),
                    input=t.redactor.clean_value(
                        denial.tool_input, string_bytes=t.limits.arg_bytes // 4
                    ),
                )
    return list(denials.values())[: t.limits.denials]


def final_result(t: Translator, outcome: Outcome, now: float) -> FinalResult:
    """The run's one result: last ``result`` line, outcome, cards (PLAN "Final status rules")."""
    limits = t.limits
    redactor = t.redactor
    last = t.last_result
    changes, commands, commands_omitted = t.review.evidence(limits.final_result_bytes)
    if outcome.reason in _STOPPED:
        status: RunStatus = _STOPPED[outcome.reason]
        error: str | None = _STOP_ERRORS[outcome.reason]
    elif outcome.reason == "spawn_failed":
        status, error = "failed", _STOP_ERRORS["spawn_failed"]
    else:
        error = _failure(t, outcome)
        status = "failed" if error else "completed"
    result = FinalResult(
        run_id=t.ctx.run_id,
        status=status,
        session_id=t.session_id,
        resumed=t.ctx.resumed,
        result=redactor.clean_text(last.result or "", limits.final_result_bytes) if last else "",
        error=redactor.clean_chars(error, limits.error_chars) if error else None,
        exit_code=outcome.exit_code,
        num_turns=last.num_turns if last else None,
        duration_ms=last.duration_ms if last else max(int((now - t.ctx.started_at) * 1000), 0),
        total_cost_usd=last.total_cost_usd if last else None,
        usage=_usage(redactor, last.usage, 4096) if last else None,
        permission_denials=_denials(t),
        tools=ToolCounts(
            started=t.tools_started, completed=t.tools_completed, failed=t.tools_failed
        ),
        files_changed=t.files_changed[:200],
        changes=changes,
        commands=commands,
        commands_omitted=commands_omitted,
        stderr=(_stderr(redactor, outcome, limits.stderr_chars) if status != "completed" else None),
        frames_not_stored=outcome.frames_not_stored or msgspec.UNSET,
    )
    return _fit(result, limits.final_result_bytes)


def _stderr(redactor: Redactor, outcome: Outcome, limit: int) -> str | None:
    # The last lines say why a process died; the daemon already redacted them as one text, and
    # cleaning again keeps this module's own guarantee whoever built the outcome.
    tail = outcome.stderr_tail.strip()
    return redactor.clean_chars(tail[-limit:], limit) if tail else None


def _fit(result: FinalResult, limit: int) -> FinalResult:
    # The whole object stays within the bound: the final text gives way first, then the inputs
    # of denied calls.
    size = len(msgspec.json.encode(result))
    if size <= limit:
        return result
    text_bytes = len(result.result.encode())
    result = msgspec.structs.replace(
        result, result=bound_text(result.result, max(text_bytes - (size - limit) - 64, 0))
    )
    if len(msgspec.json.encode(result)) <= limit:
        return result
    denials = [msgspec.structs.replace(d, input=None) for d in result.permission_denials]
    return msgspec.structs.replace(
        result, permission_denials=denials, files_changed=[], stderr=None
    )
