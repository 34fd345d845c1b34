"""A run's one final result: from its last ``result`` line, how the CLI ended, and its cards."""

from __future__ import annotations

from typing import Any, Final

import msgspec

import codelegate.translator.wire as wire
from codelegate.translator.bounds import bound_text
from codelegate.translator.frames import (
    FinalResult,
    InvocationStatus,
    PermissionDenial,
    RunStatus,
    ToolCounts,
)
from codelegate.translator.inputs import NAME_CHARS, Outcome
from codelegate.translator.redact import Redactor
from codelegate.translator.state import RunState

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


def _failure(s: RunState, outcome: Outcome) -> str | None:
    """Why an exited run failed, or None when it completed."""
    last = s.last_result
    ctx = s.ctx
    if ctx.resumed and s.cli_session is not None and s.cli_session != ctx.session_id:
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


def _denials(s: RunState) -> list[PermissionDenial]:
    denials = dict(s.denials)
    last = s.last_result
    if last is not None:
        try:
            listed = wire.denials_decoder.decode(last.permission_denials) or []
        except msgspec.MsgspecError:
            listed = []
        for denial in listed:
            if not denial.tool_use_id:
                continue
            tool_id = s.tool_id(denial.tool_use_id)
            if tool_id not in denials:
                denials[tool_id] = PermissionDenial(
                    tool_id=tool_id,
                    name=s.said(denial.tool_name or "unknown", NAME_CHARS),
                    input=s.redactor.clean_value(
                        denial.tool_input, string_bytes=s.limits.arg_bytes // 4
                    ),
                )
    return list(denials.values())[: s.limits.denials]


def final_result(s: RunState, outcome: Outcome, now: float) -> FinalResult:
    """The run's one result: last ``result`` line, outcome, cards (DESIGN "The final result")."""
    limits = s.limits
    redactor = s.redactor
    last = s.last_result
    changes, commands, commands_omitted = s.review.evidence(limits.final_result_bytes)
    if outcome.reason in _STOPPED:
        status: RunStatus = _STOPPED[outcome.reason]
        error: str | None = _STOP_ERRORS[outcome.reason]
    elif outcome.reason == "spawn_failed":
        status, error = "failed", _STOP_ERRORS["spawn_failed"]
    else:
        error = _failure(s, outcome)
        status = "failed" if error else "completed"
    result = FinalResult(
        run_id=s.ctx.run_id,
        status=status,
        session_id=s.session_id,
        resumed=s.ctx.resumed,
        result=redactor.clean_text(last.result or "", limits.final_result_bytes) if last else "",
        error=redactor.clean_chars(error, limits.error_chars) if error else None,
        exit_code=outcome.exit_code,
        num_turns=last.num_turns if last else None,
        duration_ms=last.duration_ms if last else max(int((now - s.ctx.started_at) * 1000), 0),
        total_cost_usd=last.total_cost_usd if last else None,
        usage=_usage(redactor, last.usage, 4096) if last else None,
        permission_denials=_denials(s),
        tools=ToolCounts(
            started=s.tools_started, completed=s.tools_completed, failed=s.tools_failed
        ),
        files_changed=list(s.files)[:200],
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
