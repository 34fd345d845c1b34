"""Following a run for the ``claude_code`` tool: its NDJSON frames, relayed into Agent IO.

Standard library only, like :mod:`.tool`. The stream (tool_stream) is read a poll at a time,
so that the caller's Stop is looked at between frames.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from codelegate.daemon.clients.tool_approve import Approver
from codelegate.daemon.clients.tool_stream import CONNECT_TIMEOUT_S, EventStream, StreamRefused

# Frames meant for the daemon's own clients (the final result, counters of bad input): not Agent
# IO events. The final result comes back to the model as the tool's result instead.
DAEMON_ONLY: Final = frozenset({"run_result", "diagnostic", "approval_resolved"})
# Once the run is cancelled, how long its "cancelled" result (with the session id) may take.
CANCEL_WAIT_S: Final = 15.0
# A follower the daemon closed (it lagged) picks up again with after=; a few times at most.
_RECONNECTS: Final = 5
# O Chat's bound for a provider message's text.
_MESSAGE_CHARS: Final = 16000
# ConnectOnion's terminal console renders Rich markup: a "[" in a path or command must not be
# taken for a tag.
_RICH_ESCAPE: Final = str.maketrans({"[": "\\["})


def follow(
    path: str,
    run_id: str,
    relay: Relay,
    stop: Callable[[], bool] | None,
    poll_s: float,
    cancel: Callable[[str, str], bool],
) -> dict[str, Any] | None:
    """Relay the run's frames until ``run_result``; its result, or None if the stream failed."""
    after = 0
    give_up_at: float | None = None  # once stopped: how long the cancelled result may take
    reconnects = 0
    while reconnects <= _RECONNECTS:
        try:
            stream = EventStream(path, run_id, after, CONNECT_TIMEOUT_S)
        except OSError:
            return None
        try:
            while True:
                if give_up_at is None and stop is not None and stop():
                    # Refused only when the run already ended: its result is on the way anyway.
                    cancel(path, run_id)
                    give_up_at = time.monotonic() + CANCEL_WAIT_S
                if give_up_at is not None and time.monotonic() > give_up_at:
                    return None
                frames = stream.frames(poll_s)
                if frames is None:
                    break  # closed by the daemon (we lagged, or it stops): resume with after=
                for frame in frames:
                    seq = frame.get("seq")
                    if not isinstance(seq, int) or seq <= after:
                        continue  # a replayed frame we relayed already
                    after = seq
                    if frame.get("type") == "run_result":
                        result = frame.get("result")
                        return result if isinstance(result, dict) else None
                    relay.frame(frame)
        except StreamRefused:
            return None
        finally:
            stream.close()
        reconnects += 1
    return None


class Relay:
    """Hands a run's frames to the calling agent's IO, the way ConnectOnion's own tools do.

    With a session: ``agent._record_trace(entry)``, then ``agent.io.send_live_trace(entry)``.
    The trace is what the hosted Work Room reads (a per-invocation Stop is refused ``not_active``
    without the invocation in it; a follow-up finds the session to resume there); the live lane
    shows the cards while the tool still runs. An agent without an IO (a local one) gets a line
    per card on its console instead.
    """

    def __init__(self, agent: Any, approver: Approver | None = None) -> None:
        self._agent = agent
        self._approver = approver  # approval_needed / ask_user: answered, not shown as cards
        session = getattr(agent, "current_session", None)
        self._session: dict[str, Any] | None = session if isinstance(session, dict) else None
        record = getattr(agent, "_record_trace", None)
        self._record = record if callable(record) and self._session is not None else None
        io = getattr(agent, "io", None)
        self._io = io
        live = getattr(io, "send_live_trace", None)
        self._live = live if callable(live) else None
        log = getattr(io, "log", None)
        self._log = log if callable(log) else None
        printer = getattr(getattr(agent, "logger", None), "print", None)
        self._print = printer if io is None and callable(printer) else None
        self._acknowledged = False
        self.failures = 0
        # The run's session, as the daemon said it at the start, then as its frames name it:
        # what the tool still has to give the model when the daemon goes away before its result
        # (tool_result.lost).
        self.session_id = ""

    def bind(self, stop: Callable[[], bool] | None, poll_s: float) -> None:
        """The call's Stop and timeout, for the approver to look at while it waits."""
        if self._approver is not None:
            self._approver.bind(stop, poll_s)

    def frame(self, frame: dict[str, Any]) -> None:
        """Relay one daemon frame (daemon-only frames are not Agent IO events)."""
        session = frame.get("child_session_id")
        if isinstance(session, str) and session:
            self.session_id = session
        kind = frame.get("type")
        if kind in DAEMON_ONLY or not isinstance(kind, str):
            return
        try:
            if kind in ("approval_needed", "ask_user"):
                if self._approver is not None:
                    ask = (
                        self._approver.approval
                        if kind == "approval_needed"
                        else self._approver.question
                    )
                    ask(frame)
                return
            self._acknowledge()
            if self._record is not None:
                entry = frame
                if kind == "tool_result" and "name" in frame:
                    # ConnectOnion's audit record (approvals.record_tool) takes every named
                    # tool_result of the trace for a call the agent made; Claude Code's inner
                    # tools are not the agent's, and its own claude_code tool names none. The
                    # card keeps the name its tool_call gave it.
                    entry = {k: v for k, v in frame.items() if k != "name"}
                self._record(entry)
                if self._live is not None:
                    self._live(entry)
            elif self._log is not None:
                self._log(kind, **{k: v for k, v in frame.items() if k != "type"})
            if self._print is not None:
                self._progress(frame)
        except Exception:
            # Showing progress must never lose the run's result: the model still gets it.
            self.failures += 1

    def prompt(self, run_id: str, text: str, parent: object) -> None:
        """Show the prompt in the Work Room, as the user's turn (ConnectOnion's tools do too)."""
        if not isinstance(parent, dict) or not isinstance(parent.get("tool_call_id"), str):
            return
        cleaned = text.replace("\x00", "").strip()
        if not cleaned:
            return
        if len(cleaned) > _MESSAGE_CHARS:
            cleaned = cleaned[: _MESSAGE_CHARS - 1] + "…"
        session = self._session or {}
        request_id = session.get("_provider_direct_message_id")
        # A follow-up's message carries the Host's request id, so the browser can match the
        # text it sent; a first run's, the run id (stable, unique).
        key = request_id if isinstance(request_id, str) and request_id else run_id
        self.frame(
            {
                "type": "provider_message",
                "provider": "claude_code",
                "invocationId": "claude_code:" + parent["tool_call_id"],
                "parentToolCallId": parent["tool_call_id"],
                "messageId": f"user:{key}"[:512],
                "role": "user",
                "text": cleaned,
            }
        )

    def _acknowledge(self) -> None:
        """A Work Room follow-up: tell the Host the provider turn started (once)."""
        if self._acknowledged:
            return
        self._acknowledged = True
        session = self._session
        send = getattr(self._io, "send", None)
        if session is None or not callable(send):
            return
        request_id = session.get("_provider_direct_message_id")
        invocation = session.get("_provider_continuation_of")
        revision = session.get("_provider_direct_state_revision")
        if not (isinstance(request_id, str) and request_id and isinstance(invocation, str)):
            return
        if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
            return
        send(
            {
                "type": "PROVIDER_INPUT_ACK",
                "requestId": request_id,
                "invocationId": invocation,
                "accepted": True,
                "stateRevision": revision,
            }
        )
        session["_provider_direct_acknowledged"] = True

    def _progress(self, frame: dict[str, Any]) -> None:
        if self._print is None:
            return
        kind = frame["type"]
        name = str(frame.get("name", ""))
        if kind == "tool_call":
            summary = str(frame.get("summary") or "")
            line = f"  ⎿ {name}" + (f"  {summary}" if summary else "")
        elif kind == "tool_result":
            mark = "✓" if frame.get("status") == "completed" else "✗"
            timing = frame.get("timing_ms")
            took = f" ({timing / 1000:.1f}s)" if isinstance(timing, int | float) else ""
            error = frame.get("error")
            line = f"  {mark} {name}{took}" + (f": {error}" if error else "")
        elif (
            kind == "provider_message"
            and frame.get("role") == "assistant"
            and isinstance(frame.get("text"), str)
        ):
            first = frame["text"].strip().splitlines()
            line = f"  Claude Code: {first[0][:200]}" if first else ""
        else:
            return
        if line:
            self._print(line.translate(_RICH_ESCAPE))
