"""The ``claude_code`` tool a ConnectOnion agent registers: one call, one delegated run.

A drop-in for ConnectOnion's own tool: the same signature, ``claude_code(prompt, session_id="",
cwd="", model="", timeout=600, agent=None) -> str``, and the same JSON envelope (``provider,
session_id, resumed, status, result, error, exit_code, usage, total_cost_usd``) plus ours
(``run_id, files_changed, permission_denials, changes, commands``). The permission mode is not
the model's to choose: whoever registers the tool binds it, ``ClaudeCode(mode="accept_edits")``,
and the daemon still refuses a mode its operator did not allow. A permission request of the run
(daemon ``[approvals]`` on) is put to the agent's own IO and answered there (tool_approve.py);
without an IO it is denied, unless ``ClaudeCode(approve=…)`` decides.

Standard library only (with :mod:`.tool_follow`), so an agent's venv needs nothing else.
It starts the run over the daemon's Unix socket (``wait: true``: that connection is the run's
lifeline, hanging it up cancels the run), follows the run's NDJSON frames and relays each one
into the agent's IO, so O Chat and the Work Room show the cards while Claude Code works. A Stop
(the agent's, or one aimed at this invocation) cancels the run by name; the result then is the
daemon's ``cancelled`` one, with the session id to resume. A daemon that goes away mid-run is
``failed``/``daemon_unreachable``, never ``cancelled``, with the run and session ids (tool_result).
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
import time
from collections.abc import Callable
from typing import Any, Final, Literal, get_args

from codelegate.daemon.clients.tool_approve import Approve, Approver
from codelegate.daemon.clients.tool_follow import CANCEL_WAIT_S, Relay, follow
from codelegate.daemon.clients.tool_result import (
    decode_answer,
    envelope,
    error_result,
    known_session,
    lost,
    stopped,
)
from codelegate.daemon.clients.unix_http import UnixHTTPConnection, post_json

Mode = Literal["safe", "accept_edits", "plan", "auto"]
MODES: Final = frozenset(get_args(Mode))

SOCKET_ENV: Final = "CODELEGATE_SOCKET"
RUN_ID_HEADER: Final = "X-Codelegate-Run-Id"
INVOCATION_PREFIX: Final = "claude_code:"
# How often a waiting call looks at the agent's Stop; it costs one select() per tick.
_POLL_S: Final = 0.25


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


class ClaudeCode:
    """The tool with an operator-bound permission mode: ``tools=[ClaudeCode(mode=…)]``."""

    def __init__(
        self, mode: Mode = "safe", socket: str = "", approve: Approve | None = None
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; use one of: {', '.join(sorted(MODES))}")
        self._mode: Mode = mode
        self._socket = socket
        # Who answers a request when there is no person to ask (tool_approve); None: denied.
        self._approve = approve

    def claude_code(
        self,
        prompt: str,
        session_id: str = "",
        cwd: str = "",
        model: str = "",
        timeout: int = 600,
        agent: Any = None,
    ) -> str:
        """Delegate a bounded coding task to Claude Code and return one JSON envelope:
        status, result, session_id, changes (the diff of every file it changed), commands (each
        command it ran, with its outcome), files_changed, permission_denials. Review changes and
        commands in it: no other tool may run after this one in the same turn. To continue the
        same Claude Code conversation, pass the session_id it returned.

        Args:
            prompt: What Claude Code should do, with everything it needs to know (files, goal,
                constraints, how to check the work).
            session_id: The session_id of an earlier result, to resume that conversation;
                empty for a new one.
            cwd: Directory to work in, inside a workspace root the daemon allows; empty for
                this agent's working directory, relative paths from there.
            model: A Claude model name the daemon allows; empty for its default.
            timeout: Seconds before the run is stopped (its session stays resumable).
        """
        return json.dumps(
            delegate(
                prompt,
                mode=self._mode,
                session_id=session_id,
                cwd=cwd,
                model=model,
                timeout=timeout,
                agent=agent,
                path=socket_path(self._socket),
                approve=self._approve,
            ),
            ensure_ascii=False,
        )


# The safe default, as ConnectOnion's own module-level tool is bound to its manual mode.
claude_code = ClaudeCode().claude_code


def delegate(
    prompt: str,
    *,
    mode: Mode = "safe",
    session_id: str = "",
    cwd: str = "",
    model: str = "",
    timeout: float = 600,
    agent: Any = None,
    path: str = "",
    poll_s: float = _POLL_S,
    approve: Approve | None = None,
) -> dict[str, Any]:
    """One delegated run, followed to its end; the envelope as a dict (see the module doc)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        return error_result("refused", "bad_request", "timeout must be a positive number")
    body: dict[str, Any] = {
        "task": prompt,
        # The daemon runs elsewhere (its own cwd): "" or relative means where this agent works.
        "cwd": os.path.abspath(cwd or "."),
        "mode": mode,
        "wait": True,
    }
    if session_id:
        body["resume"] = session_id
    if model:
        body["model"] = model
    parent = _parent_of(agent)
    if parent:
        body["parent"] = parent
    path = path or socket_path()
    return call_run(
        body,
        path,
        cancelled=_cancellation_check(agent),
        relay=Relay(agent, Approver(agent, path, approve)),
        timeout_s=float(timeout),
        poll_s=poll_s,
    )


def call_run(
    body: dict[str, Any],
    path: str,
    *,
    cancelled: Callable[[], bool] | None = None,
    relay: Relay | None = None,
    timeout_s: float | None = None,
    poll_s: float = _POLL_S,
) -> dict[str, Any]:
    """POST ``body`` to ``/v1/runs``, follow the run's frames, and return its final result.

    ``cancelled`` is polled while the run goes; once it answers True (or ``timeout_s`` passed)
    the run is cancelled by name and the daemon's result for it is returned. A
    KeyboardInterrupt cancels the run and propagates.
    """
    conn = UnixHTTPConnection(path)
    run_id = ""
    relay = relay or Relay(None)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    stop = _Stop(cancelled, deadline) if cancelled is not None or deadline is not None else None
    try:
        conn.request(
            "POST",
            "/v1/runs",
            body=json.dumps(body).encode(),
            # close: the daemon ends the connection after the body, so "readable" always means
            # progress (data or EOF), never a kept-alive idle socket.
            headers={"Content-Type": "application/json", "Connection": "close"},
        )
        # Held here: with "Connection: close" http.client drops conn.sock once headers are in.
        sock = conn.sock
        if sock is None:
            raise http.client.NotConnected("no socket after sending the request")
        if _wait_readable(sock, stop, poll_s) and not _readable_now(sock):
            conn.close()  # stopped before the daemon even answered: hanging up is the cancel
            return stopped("", "", stop is not None and stop.timed_out)
        response = conn.getresponse()
        run_id = response.getheader(RUN_ID_HEADER) or ""
        if not run_id:
            return envelope(decode_answer(response.status, response.read()))
        # Its session, before any frame names it: so that a daemon gone before then still
        # leaves the model a session to resume (tool_result.lost).
        relay.session_id = known_session(path, run_id)
        relay.bind(stop, poll_s)
        relay.prompt(run_id, str(body.get("task", "")), body.get("parent"))
        final = follow(path, run_id, relay, stop, poll_s, _post_cancel)
        if final is None and _wait_readable(sock, stop, poll_s):
            # No frames to follow (the stream failed): the POST's answer is the result.
            _post_cancel(path, run_id)
        # The same result is the body of the POST: read it, so the daemon's answer completes.
        sock.settimeout(CANCEL_WAIT_S)
        try:
            answer = decode_answer(response.status, response.read())
        except (OSError, http.client.HTTPException):
            answer = None
        if answer is not None and answer.get("run_id") == run_id:
            final = answer
        if final is None and stop is not None and stop.stopped:
            conn.close()  # which cancels the run, if the daemon did not take the cancel
            return stopped(run_id, relay.session_id, stop.timed_out)
        if final is None:
            # Nobody stopped it: the daemon went away. Not "cancelled": that is the user's word.
            return lost(path, run_id, relay.session_id)
        result = envelope(final)
        if stop is not None and stop.timed_out and result["status"] == "cancelled":
            result["status"] = "timeout"
            result["error"] = f"Claude Code timed out after {timeout_s:g}s" + (
                "; resume its session_id to go on" if result["session_id"] else ""
            )
        if relay.failures:
            result["relay_failures"] = relay.failures
        return result
    except KeyboardInterrupt:
        conn.close()  # the daemon cancels a waiting run whose caller goes away
        if run_id:
            _post_cancel(path, run_id)
        raise
    except (OSError, http.client.HTTPException) as exc:
        if run_id:  # the run started: the daemon went away under it
            return lost(path, run_id, relay.session_id)
        return error_result("failed", "daemon_unreachable", unreachable(exc, path))
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


class _Stop:
    """The caller's Stop and the call's timeout as one poll; remembers which came first."""

    def __init__(self, cancelled: Callable[[], bool] | None, deadline: float | None) -> None:
        self._cancelled = cancelled
        self._deadline = deadline
        self.timed_out = False
        self.stopped = False

    def __call__(self) -> bool:
        if self.stopped:
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self.timed_out = self.stopped = True
        elif self._cancelled is not None and self._cancelled():
            self.stopped = True
        return self.stopped


def _wait_readable(sock: socket.socket, stop: Callable[[], bool] | None, poll_s: float) -> bool:
    """Block until the daemon sends something; True if the caller asked to stop first."""
    if stop is None:
        sock.settimeout(None)  # the daemon's run timeout bounds the wait
        return False
    while True:
        readable, _, _ = select.select([sock], [], [], poll_s)
        if readable:
            sock.settimeout(None)
            return False
        if stop():
            return True


def _readable_now(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _post_cancel(path: str, run_id: str) -> bool:
    return post_json(path, f"/v1/runs/{run_id}/cancel")[0] in (200, 202)


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


def _parent_of(agent: Any) -> dict[str, str] | None:
    """The agent's tool call this run works for, as the daemon's ``parent`` object (or None).

    A Work Room follow-up continues the invocation it was typed into (ConnectOnion's Host
    runs it as a fresh manual tool call, with ``_provider_continuation_of`` naming the
    original): the run then goes under that invocation's parent, so the Work Room keeps one
    timeline and its Stop reaches this run.
    """
    session = getattr(agent, "current_session", None)
    if not isinstance(session, dict):
        return None
    continued = session.get("_provider_continuation_of")
    tool_call_id: object
    if isinstance(continued, str) and continued.startswith(INVOCATION_PREFIX):
        tool_call_id = continued.removeprefix(INVOCATION_PREFIX)
    else:
        # ConnectOnion's tool executor sets this key on the session it hands to the tool for
        # the duration of the call (core/tool_executor.py); it is the LLM's id for this call.
        tool_call_id = session.get("_active_tool_call_id")
    if not isinstance(tool_call_id, str) or not tool_call_id:
        return None
    parent = {"tool_call_id": tool_call_id}
    agent_session = session.get("session_id")
    if isinstance(agent_session, str) and agent_session:
        parent["session_id"] = agent_session
    return parent


def _cancellation_check(agent: Any) -> Callable[[], bool] | None:
    """A poll for the agent's Stop: its IO's global cancel or a Stop aimed at this invocation."""
    io = getattr(agent, "io", None)
    is_cancelled = getattr(io, "is_cancelled", None)
    is_provider_cancelled = getattr(io, "is_provider_cancelled", None)
    if not callable(is_cancelled) and not callable(is_provider_cancelled):
        return None
    parent = _parent_of(agent)
    invocation = f"{INVOCATION_PREFIX}{parent['tool_call_id']}" if parent else ""

    def cancelled() -> bool:
        if callable(is_cancelled) and is_cancelled():
            return True
        return bool(
            invocation and callable(is_provider_cancelled) and is_provider_cancelled(invocation)
        )

    return cancelled


def main(argv: list[str] | None = None) -> int:
    """``python -m codelegate.daemon.clients.tool health [SOCKET]``: exit 0 when it is healthy."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "health":
        print("usage: python -m codelegate.daemon.clients.tool health [SOCKET]", file=sys.stderr)
        return 2
    return 0 if health(args[1] if len(args) > 1 else "") else 1


if __name__ == "__main__":
    raise SystemExit(main())
