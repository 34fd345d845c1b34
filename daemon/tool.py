"""The thin ``claude_code`` tool a ConnectOnion agent registers: one call, one delegated run.

Standard library only, so an agent can vendor or import this file without pulling in the
daemon's dependencies. It speaks HTTP/1.1 over the daemon's Unix socket and waits for the final
result (``wait: true``). Closing the connection early is how it cancels: the daemon cancels a
waiting run whose caller goes away. Everything the daemon refuses comes back as a dict, not an
exception, so the calling model can read why and adapt.

Register it with ``Agent("coder", tools=[claude_code])``; ConnectOnion injects the ``agent``
parameter (it leaves it out of the schema) and this tool passes the agent's current tool call id
as ``parent``, so the daemon's frames nest under the delegated call in O Chat.
"""

from __future__ import annotations

import contextlib
import grp
import http.client
import json
import os
import select
import socket
import sys
from collections.abc import Callable
from typing import Any, Final, Literal

Mode = Literal["safe", "accept_edits", "plan", "auto"]

SOCKET_ENV: Final = "CODELEGATE_SOCKET"
RUN_ID_HEADER: Final = "X-Codelegate-Run-Id"
_CONNECT_TIMEOUT_S: Final = 10.0
# How often a waiting call looks at the agent's Stop button; it costs one select() per tick.
_POLL_S: Final = 0.25
# After asking the daemon to cancel, how long to wait for its "cancelled" result (which carries
# the session id, so the agent can resume) before giving up on it.
_CANCEL_WAIT_S: Final = 15.0
# Statuses the daemon answers with before a run starts: the request itself was refused.
_REFUSED: Final = frozenset({400, 403, 404, 409, 413, 429})


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix stream socket; the Host header is only a placeholder."""

    def __init__(self, socket_path: str, timeout: float = _CONNECT_TIMEOUT_S) -> None:
        super().__init__("codelegate", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def state_dir() -> str:
    """Where development defaults (``make run``) keep the daemon's socket, store and config.

    ``$XDG_STATE_HOME/codelegate``, else ``~/.local/state/codelegate``: the same folder from any
    directory, and outside any workspace one would delegate into. The one owner of this rule:
    ``codelegate serve``/``doctor``/``run``/``watch`` and this tool all ask here.
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    return os.path.join(os.path.abspath(base), "codelegate")


def socket_path(explicit: str = "") -> str:
    """The daemon's socket: an explicit path, else ``$CODELEGATE_SOCKET``, else the dev default."""
    return explicit or os.environ.get(SOCKET_ENV) or os.path.join(state_dir(), "codelegate.sock")


def claude_code(
    task: str,
    cwd: str = ".",
    mode: Mode = "safe",
    session_id: str = "",
    agent: Any = None,
) -> dict[str, Any]:
    """Delegate a bounded coding task to Claude Code in a workspace directory and return its
    final result (status, result text, session_id, files_changed, permission_denials). mode is
    safe (no edits, no commands that change files), accept_edits (may edit files), plan (plans
    only) or auto (only where the operator enabled it). To continue the same Claude Code
    conversation, pass the session_id an earlier call returned. Review files_changed, the diff
    and the tests before relying on the work.

    (ConnectOnion sends only the first paragraph to the model, hence its length.)

    Args:
        task: What Claude Code should do, with everything it needs to know (files, goal,
            constraints, how to check the work).
        cwd: Directory to work in; it must lie inside a workspace root the operator allows.
            Relative paths are taken from this agent's working directory.
        mode: Permission mode: "safe" (edits and commands that change files are refused),
            "accept_edits" (file edits allowed), "plan" (plan only, change nothing), or "auto"
            (only where the operator enabled it).
        session_id: The session_id of an earlier result, to resume that conversation; empty
            for a new one.

    Returns:
        The final result: status ("completed", "failed", "cancelled", "timeout", or "refused"
        when the daemon declined the request), result (Claude Code's final answer), error,
        session_id, resumed, exit_code, files_changed, permission_denials, usage and
        total_cost_usd.
    """
    body: dict[str, Any] = {
        "task": task,
        # The daemon runs elsewhere (its own cwd); "." means where this agent works.
        "cwd": os.path.abspath(cwd or "."),
        "mode": mode or "safe",
        "wait": True,
    }
    if session_id:
        body["resume"] = session_id
    parent = _parent_of(agent)
    if parent:
        body["parent"] = parent
    return call_run(body, socket_path(), cancelled=_cancellation_check(agent))


def call_run(
    body: dict[str, Any],
    path: str,
    *,
    cancelled: Callable[[], bool] | None = None,
    poll_s: float = _POLL_S,
) -> dict[str, Any]:
    """POST ``body`` to ``/v1/runs`` and wait for the result, cancelling when asked or interrupted.

    ``cancelled`` is polled while waiting; once it answers True the run is cancelled and the
    daemon's ``cancelled`` result is returned. A KeyboardInterrupt cancels the run and propagates.
    """
    conn = UnixHTTPConnection(path)
    run_id = ""
    try:
        conn.request(
            "POST",
            "/v1/runs",
            body=json.dumps(body).encode(),
            # close: the daemon then ends the connection after the body, so "readable" in
            # _wait_readable always means progress (data or EOF), never a kept-alive idle socket.
            headers={"Content-Type": "application/json", "Connection": "close"},
        )
        # Held here: with "Connection: close" http.client drops conn.sock once headers are in.
        sock = conn.sock
        if sock is None:
            raise http.client.NotConnected("no socket after sending the request")
        stop = _wait_readable(sock, cancelled, poll_s)
        if stop and not _readable_now(sock):
            return _stopped(conn, sock, path, "", None)
        # The answer has started (or a stop came just as it did): read the status and headers.
        response = conn.getresponse()
        # A daemon that announces the run id up front lets a cancel name the run explicitly.
        run_id = response.getheader(RUN_ID_HEADER) or ""
        if run_id and (stop or _wait_readable(sock, cancelled, poll_s)):
            return _stopped(conn, sock, path, run_id, response)
        return _decode_answer(response.status, response.read())
    except KeyboardInterrupt:
        conn.close()  # the daemon cancels a waiting run whose caller goes away
        if run_id:
            _post_cancel(path, run_id)
        raise
    except (OSError, http.client.HTTPException) as exc:
        return _error_result("failed", "daemon_unreachable", unreachable(exc, path))
    finally:
        conn.close()


def cancel_run(run_id: str, path: str = "") -> bool:
    """Ask the daemon to cancel ``run_id``; True when it accepted."""
    return _post_cancel(socket_path(path), run_id)


def health(path: str = "", timeout: float = 5.0) -> bool:
    """True when ``GET /healthz`` answers 200 (the container HEALTHCHECK uses it)."""
    conn = UnixHTTPConnection(socket_path(path), timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _wait_readable(
    sock: socket.socket, cancelled: Callable[[], bool] | None, poll_s: float
) -> bool:
    """Block until the daemon sends something; True if the caller asked to stop first."""
    if cancelled is None:
        # Nothing to poll for: block in the read itself (no timeout on a run's answer; the
        # daemon's run timeout bounds it).
        sock.settimeout(None)
        return False
    while True:
        readable, _, _ = select.select([sock], [], [], poll_s)
        if readable:
            sock.settimeout(None)
            return False
        if cancelled():
            return True


def _readable_now(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _stopped(
    conn: UnixHTTPConnection,
    sock: socket.socket,
    path: str,
    run_id: str,
    response: http.client.HTTPResponse | None,
) -> dict[str, Any]:
    """The caller stopped: cancel the run, and return the daemon's final word if it comes soon."""
    if response is not None and run_id and _post_cancel(path, run_id):
        sock.settimeout(_CANCEL_WAIT_S)
        try:
            # The cancelled result still carries the session id, so the agent can resume.
            return _decode_answer(response.status, response.read())
        except (OSError, http.client.HTTPException):
            pass
    # Without a run id, hanging up is the cancel: the daemon drops a waiter's run.
    if response is not None:
        response.close()
    conn.close()
    result = _error_result("cancelled", "cancelled", "the calling agent stopped the run")
    result["run_id"] = run_id or None
    return result


def _post_cancel(path: str, run_id: str) -> bool:
    conn = UnixHTTPConnection(path)
    try:
        conn.request("POST", f"/v1/runs/{run_id}/cancel", body=b"")
        return conn.getresponse().status in (200, 202)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _decode_answer(status: int, raw: bytes) -> dict[str, Any]:
    """The daemon's answer as the tool's result dict; errors become ``refused``/``failed`` dicts."""
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
    result = _error_result("refused" if status in _REFUSED else "failed", code, message)
    result["http_status"] = status
    return result


def unreachable(exc: BaseException, path: str) -> str:
    """Why the daemon's socket could not be used, and what to do (the terminal client says it
    the same way). Permission is not absence: a caller outside the socket's group must hear
    that, not "is codelegate serving?"."""
    if isinstance(exc, PermissionError):
        group = ""
        with contextlib.suppress(OSError, KeyError):  # its folder may be closed to us too
            group = f" (group {grp.getgrgid(os.stat(path).st_gid).gr_name})"
        return (
            f"permission denied on {path}: uid {os.getuid()} may not use the daemon's socket; "
            f"the operator adds this user to the socket's group{group} and to [server] "
            "allowed_gids, restarts codelegate, and the user logs in again (README, Access)"
        )
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return (
            f"no daemon on {path}: is codelegate serving? "
            f"(make run, or set {SOCKET_ENV} to the socket it serves)"
        )
    return f"{type(exc).__name__}: {exc} (socket {path}; set {SOCKET_ENV} to choose another)"


def _error_result(status: str, code: str, message: str) -> dict[str, Any]:
    """A result dict of the usual shape for a run that never produced one."""
    text = f"{code}: {message}"
    return {
        "provider": "claude_code",
        "run_id": None,
        "status": status,
        "session_id": None,
        "resumed": False,
        "result": "",
        "error": text,
        "error_code": code,
        "exit_code": None,
        "usage": None,
        "total_cost_usd": None,
        "permission_denials": [],
        "files_changed": [],
    }


def _parent_of(agent: Any) -> dict[str, str] | None:
    """The calling agent's active tool call, as the daemon's ``parent`` object (or None)."""
    session = getattr(agent, "current_session", None)
    if not isinstance(session, dict):
        return None
    # ConnectOnion's tool executor sets this key on the session it hands to the tool for the
    # duration of the call (core/tool_executor.py); it is the LLM's id for this tool call.
    tool_call_id = session.get("_active_tool_call_id")
    if not isinstance(tool_call_id, str) or not tool_call_id:
        return None
    parent = {"tool_call_id": tool_call_id}
    agent_session = session.get("session_id")
    if isinstance(agent_session, str) and agent_session:
        parent["session_id"] = agent_session
    return parent


def _cancellation_check(agent: Any) -> Callable[[], bool] | None:
    """A poll for the agent's Stop: its IO's global cancel or a cancel aimed at this invocation."""
    io = getattr(agent, "io", None)
    is_cancelled = getattr(io, "is_cancelled", None)
    is_provider_cancelled = getattr(io, "is_provider_cancelled", None)
    if not callable(is_cancelled) and not callable(is_provider_cancelled):
        return None
    parent = _parent_of(agent)
    invocation = f"claude_code:{parent['tool_call_id']}" if parent else ""

    def cancelled() -> bool:
        if callable(is_cancelled) and is_cancelled():
            return True
        return bool(
            invocation and callable(is_provider_cancelled) and is_provider_cancelled(invocation)
        )

    return cancelled


def main(argv: list[str] | None = None) -> int:
    """``python -m daemon.tool health [SOCKET]``: exit 0 when the daemon is healthy."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "health":
        print("usage: python -m daemon.tool health [SOCKET]", file=sys.stderr)
        return 2
    return 0 if health(args[1] if len(args) > 1 else "") else 1


if __name__ == "__main__":
    raise SystemExit(main())
