"""While the ``claude_code`` tool waits for a person's answer: seeing the request end without one.

Standard library only, like :mod:`.tool`. The tool blocks in the agent IO's ``receive()`` (the way
ConnectOnion's own tools wait). The daemon may end the request first: its approval timeout, a
cancel, another client's answer, the run's end, or its own end (killed, it went away). A
:class:`Watch` sees that on its own connection (``GET /v1/runs/{id}/events?after=<the request's
seq>``, on a thread, for as long as the tool waits), and sees the call's timeout and a Stop aimed at
the invocation (the tool's ``_Stop``, polled there). Either way it ends the wait by closing the
request on the IO the way an answer does: ConnectOnion's ``answer_request`` with a deny naming the
request. The blocked ``receive()`` then returns that deny, which the tool knows not to post; and
since ConnectOnion holds at most one request open and takes at most one answer for it, a late answer
to the closed request is refused as stale, never delivered, so it cannot be taken for the answer to
the next request nor left for the agent's own next ``receive()``.

Why not ``WebSocketIO.receive_interruptibly(event)``: it stops the wait, but leaves the request
open in ConnectOnion, so a late answer still lands in the mailbox, and ConnectOnion's
normalised approval answer has neither a type nor the request id to pick it out by.

Hosted, the tool's IO is ConnectOnion's ``InterruptibleIO`` lease over the ``WebSocketIO``
(1.9.0 to 1.9.2, alike here). The lease has no public way to end a wait or close a request: its
``receive()`` ends on a message or on its own ``cancel()``, which revokes the whole invocation
(sends dropped, the tool's result replaced by "interrupted"). So the watch takes the
``answer_request`` of the IO the lease wraps, from its private ``__io``: the one private name
the tool uses. It fails safe, and says so: an IO where it is missing (another ConnectOnion),
or whose ``answer_request`` will not take the closing answer, is waited on as ConnectOnion's own
tools wait (until an answer or a Stop: a request the daemon ended first then waits for the
person's answer, which the daemon refuses), with a warning on Python's ``logging`` (on stderr
where the agent configured none) that says why.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Literal

from codelegate.daemon.clients.tool_stream import CONNECT_TIMEOUT_S, EventStream, StreamRefused

Over = Literal["resolved", "stopped"]
Close = Callable[[dict[str, Any]], object]
# ConnectOnion's answer to each kind of request event (WebSocketIO._ANSWER_TYPES).
ANSWER_TYPES: Final = {"approval_needed": "APPROVAL_RESPONSE", "ask_user": "ASK_USER_RESPONSE"}
# The closing answers: a deny, in the shape ConnectOnion takes for each kind.
_CLOSING: Final[dict[str, dict[str, Any]]] = {
    "APPROVAL_RESPONSE": {"approved": False},
    "ASK_USER_RESPONSE": {"answer": ""},
}
# ConnectOnion 1.9's InterruptibleIO keeps the IO it wraps under this (name-mangled) name.
_LEASE_INNER: Final = "_InterruptibleIO__io"
_log = logging.getLogger(__name__)
# What the tool's waits lose without a way to close a request (said in each warning).
_WAITS_ON: Final = (
    "a request the daemon ends first (its timeout, a cancel, another client's answer, the "
    "run's end) keeps the tool waiting until the person answers it or a Stop comes "
    "(README, From a ConnectOnion agent: ConnectOnion versions)"
)
# A watch the daemon closed (it lagged) picks up again with after=; a few times at most.
_RECONNECTS: Final = 5


def closer_of(io: Any) -> Close | None:
    """ConnectOnion's ``answer_request`` of ``io`` or of the IO its lease wraps; else None."""
    for candidate in (io, getattr(io, _LEASE_INNER, None)):
        # Looked up on the class, as ConnectOnion probes its optional IO methods: a test
        # double's __getattr__ must not fabricate one.
        answer = getattr(type(candidate), "answer_request", None)
        if candidate is not None and callable(answer):
            return functools.partial(answer, candidate)
    return None


def warn_unclosable(io: Any) -> None:
    """Say that a request put to ``io`` cannot be closed (logged: a warning never raises)."""
    _log.warning(
        "codelegate claude_code: the agent's IO (%s.%s) has no answer_request, nor a "
        "ConnectOnion lease around one: %s",
        type(io).__module__,
        type(io).__qualname__,
        _WAITS_ON,
    )


class Watch:
    """One request's watch, for the time the tool waits on it (a context manager).

    ``over`` says why the wait was ended for it: ``resolved`` (the daemon ended the request or the
    run, or went away: post nothing, cancel nothing) or ``stopped`` (the call's timeout or a Stop
    the poll took: cancel the run). None: an answer (or the IO's own Stop) ended the wait.
    """

    def __init__(
        self,
        path: str,
        frame: dict[str, Any],
        event: dict[str, Any],
        close: Close,
        stop: Callable[[], bool] | None,
        poll_s: float,
        interrupted: Callable[[], bool] | None,
    ) -> None:
        self._path = path
        self._run_id = str(frame["run_id"])
        self._request_id = frame["request_id"]
        seq = frame.get("seq")
        self._after = seq if isinstance(seq, int) and seq > 0 else 0
        answer_type = ANSWER_TYPES[str(event["type"])]
        self._closing = {"type": answer_type, "request_id": event["id"], **_CLOSING[answer_type]}
        self._close = close
        self._stop = stop
        self._poll_s = poll_s
        self._interrupted = interrupted
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="claude_code-watch", daemon=True)
        self.over: Over | None = None

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        after = self._after
        for _ in range(_RECONNECTS + 1):
            try:
                stream = EventStream(self._path, self._run_id, after, CONNECT_TIMEOUT_S)
            except OSError as exc:
                if isinstance(exc, ConnectionError | FileNotFoundError):
                    # No daemon listens (any more): the request went with it. The tool's
                    # follower finds the daemon gone too and says so (tool_result.lost).
                    self._end("resolved")
                # Else nothing to watch with: the wait goes on as it would without a watch.
                return
            try:
                while not self._done.is_set():
                    if self._stop is not None and self._stop():
                        self._end("stopped")
                        return
                    frames = stream.frames(self._poll_s)
                    if frames is None:
                        break  # the daemon closed the stream: resume with after=
                    for frame in frames:
                        seq = frame.get("seq")
                        if isinstance(seq, int) and seq > after:
                            after = seq
                        if self._ends(frame):
                            self._end("resolved")
                            return
            except StreamRefused as refused:
                if refused.status == 0:  # it hung up before any answer: the daemon went away
                    self._end("resolved")
                return
            finally:
                stream.close()
            if self._done.is_set():
                return

    def _ends(self, frame: dict[str, Any]) -> bool:
        kind = frame.get("type")
        return kind == "run_result" or (
            kind == "approval_resolved" and frame.get("request_id") == self._request_id
        )

    def _end(self, over: Over) -> None:
        if self._interrupted is not None and self._interrupted():
            # The agent's Stop revoked the IO: its receive() raises UserInterrupt by itself, and
            # a closing answer would only be left in the mailbox.
            return
        self.over = over
        try:
            self._close(dict(self._closing))
        except Exception as exc:
            # Another ConnectOnion's answer_request: the watch thread must not die of it unseen.
            _log.warning(
                "codelegate claude_code: the agent's IO refused to close request %s (%s: %s); %s",
                self._request_id,
                type(exc).__name__,
                exc,
                _WAITS_ON,
            )
