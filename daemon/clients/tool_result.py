"""The ``claude_code`` tool's result: ConnectOnion's envelope, and a result the daemon never sent.

Standard library only, like :mod:`.tool`. A run can end for the tool without the daemon's final
result in two ways, and the model must hear which one it was: the caller stopped it (its Stop or
the call's timeout: ``cancelled`` / ``timeout``), or the daemon went away under it (killed,
restarted, its connection dropped: ``failed`` / ``daemon_unreachable``). Calling the second a
cancel would tell the model that the user stopped the run. Both keep the run id and the run's
session id, so that the agent can resume the session once the daemon is back: the one the
daemon launched the run with (asked as soon as the run has an id, :func:`known_session`), or the
one its frames named since. Where none is known, the result says that a new call starts afresh.
"""

from __future__ import annotations

import json
from typing import Any, Final

from codelegate.daemon.clients.unix_http import request_json

# Statuses the daemon answers with before a run starts: the request itself was refused.
_REFUSED: Final = frozenset({400, 403, 404, 409, 413, 429})


def envelope(final: dict[str, Any]) -> dict[str, Any]:
    """ConnectOnion's envelope types: strings where it has strings, ``{}`` for no usage."""
    result = dict(final)
    result["provider"] = "claude_code"
    result["session_id"] = final.get("session_id") or ""
    result["resumed"] = bool(final.get("resumed"))
    result["result"] = final.get("result") or ""
    result["error"] = final.get("error") or ""
    result["usage"] = final.get("usage") or {}
    for key, empty in (("exit_code", None), ("total_cost_usd", None), ("run_id", None)):
        result.setdefault(key, empty)
    for key in ("files_changed", "permission_denials", "commands"):
        result.setdefault(key, [])
    result.setdefault("changes", "")
    return result


def error_result(status: str, code: str, message: str) -> dict[str, Any]:
    """A result dict of the usual shape for a run that never produced one."""
    text = f"{code}: {message}"
    return envelope({"run_id": None, "status": status, "error": text, "error_code": code})


def decode_answer(status: int, raw: bytes) -> dict[str, Any]:
    """The daemon's answer as a result dict; errors become ``refused``/``failed`` dicts."""
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        data = None
    if 200 <= status < 300 and isinstance(data, dict) and "status" in data:
        return data
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code", "http_error"))
        message = str(error.get("message", ""))
    else:
        code, message = "http_error", f"unexpected answer from the daemon (HTTP {status})"
    result = error_result("refused" if status in _REFUSED else "failed", code, message)
    result["http_status"] = status
    return result


def stopped(run_id: str, session_id: str, timed_out: bool) -> dict[str, Any]:
    """The caller's Stop (or the call's timeout) came, and the daemon's result did not."""
    code = "timeout" if timed_out else "cancelled"
    result = error_result(code, code, "the run was stopped before the daemon reported its result")
    return _of_run(result, run_id, session_id)


def known_session(path: str, run_id: str) -> str:
    """The session the daemon launched ``run_id`` with, or "" if it does not say.

    Asked as soon as the POST's answer names the run: its frames may name the session only at
    the CLI's first output (seconds later, or never, if the daemon goes away first)."""
    return _session_of(*_state(path, run_id))


def lost(path: str, run_id: str, session_id: str) -> dict[str, Any]:
    """No one stopped the run, yet its result did not come: the daemon went away (or its
    connection dropped). A daemon that is back and knows how the run ended has the last word
    (a restart closes it ``interrupted``); else the result says what happened, and how to go on."""
    status, state = _state(path, run_id)
    final = state.get("result") if status == 200 and state is not None else None
    if isinstance(final, dict) and final.get("status") not in (None, "running"):
        return _of_run(envelope(final), run_id, session_id)
    session_id = session_id or _session_of(status, state)
    message = f"the daemon went away before it reported the run's result (run {run_id})"
    if session_id:
        message += (
            f"; once codelegate serves again, GET /v1/runs/{run_id} says how the run ended, "
            "and this session_id resumes it"
        )
    else:
        # The model must not think it resumes anything: say what a new call does.
        message += (
            ", and the daemon that serves now has no record of it"
            if status == 404
            else f" and before the tool learnt the run's session; once codelegate serves again, "
            f"GET /v1/runs/{run_id} says how the run ended and which session it had"
        )
        message += (
            ". No session_id is known for it: calling claude_code again starts a fresh Claude "
            "Code session, which knows nothing of this run (the workspace keeps whatever it "
            "changed)"
        )
    return _of_run(error_result("failed", "daemon_unreachable", message), run_id, session_id)


def _state(path: str, run_id: str) -> tuple[int, dict[str, Any] | None]:
    """``GET /v1/runs/{run_id}``: its status (0: no daemon answered) and the run's state."""
    status, state = request_json(path, "GET", f"/v1/runs/{run_id}")
    return status, state if isinstance(state, dict) else None


def _session_of(status: int, state: dict[str, Any] | None) -> str:
    session = state.get("session_id") if status == 200 and state is not None else None
    return session if isinstance(session, str) else ""


def _of_run(result: dict[str, Any], run_id: str, session_id: str) -> dict[str, Any]:
    """``result`` with the run's id and the session its frames named (unless it names one)."""
    result["run_id"] = run_id or result.get("run_id") or None
    result["session_id"] = result.get("session_id") or session_id
    return result
