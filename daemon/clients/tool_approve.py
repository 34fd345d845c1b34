"""The ``claude_code`` tool's answers: a run's approval requests put to the agent's own IO.

Standard library only, like :mod:`.tool`. ConnectOnion 1.9.2's ``IO.request_approval`` returns a
bool, which would lose the answer's scope, mode and feedback; so the request goes out as the very
event it sends (``approval_needed`` with ``tool``, ``arguments`` and the presentation keys it
passes on: ``provider``, ``invocationId``, ``parentToolCallId``, ``activityId``,
``providerApproval``), ``id`` set to the daemon's request id — an answer naming another request
is dropped by ConnectOnion as stale — and the first message ``receive()`` gives is the answer,
posted to the daemon as it is. O Chat's approval card works unchanged. A question goes out as
ConnectOnion's ``ask_user`` event, one per question, and the answers are posted together.

Fail closed: without an IO that can send and receive, or for a requester ConnectOnion calls other
than ``admin``, the request is denied ("No one can approve this here") unless whoever registered
the tool passed ``approve`` (called with the frame when there is nobody to ask; True/False, or
an answer dict for the daemon). The call blocks while the person decides, as ConnectOnion's own
tools do; a Stop that arrives meanwhile (``UserInterrupt``, or a ``PROVIDER_INTERRUPT`` taken as
the answer) cancels the run, and so does the call's timeout. When the daemon ends the request
first (its timeout, a cancel, another client's answer, the run's end), or goes away, the wait
ends with it (tool_wait): nothing is posted, and the tool goes on following the run (or finds the
daemon gone and says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from codelegate.daemon.clients.tool_wait import Watch, closer_of, warn_unclosable
from codelegate.daemon.clients.unix_http import post_json

NO_ONE_HERE: Final = "No one can approve this here"
# A person who chose nothing: the daemon refuses an answer that answers no question.
NO_ANSWER: Final = "The user gave no answer to the questions"
# The keys of an approval_needed event ConnectOnion passes on to the browser (IO.request_approval).
_PRESENTATION: Final = ("provider", "invocationId", "parentToolCallId", "activityId")

Approve = Callable[[dict[str, Any]], "bool | dict[str, Any]"]


class Approver:
    """Answers one run's requests through the agent's IO (or the operator's ``approve``)."""

    def __init__(self, agent: Any, path: str, approve: Approve | None = None) -> None:
        self._path = path
        self._approve = approve
        io = getattr(agent, "io", None)
        send, receive = getattr(io, "send", None), getattr(io, "receive", None)
        session = getattr(agent, "current_session", None)
        requester = session.get("requester") if isinstance(session, dict) else None
        # As ConnectOnion's codex tool: a requester it knows to be no admin may not approve.
        allowed = not isinstance(requester, dict) or requester.get("level") == "admin"
        self._io = io if callable(send) and callable(receive) and allowed else None
        # How the wait for an answer is ended when the daemon ends the request (tool_wait).
        self._close = closer_of(self._io)
        self._stop: Callable[[], bool] | None = None
        self._poll_s = 0.25  # until call_run binds the call's own poll (tool._POLL_S)
        is_cancelled = getattr(io, "is_cancelled", None)
        self._interrupted = is_cancelled if callable(is_cancelled) else None
        self.answered = 0

    def bind(self, stop: Callable[[], bool] | None, poll_s: float) -> None:
        """The call's Stop and timeout (tool._Stop), looked at while the tool waits too."""
        self._stop = stop
        self._poll_s = poll_s

    def approval(self, frame: dict[str, Any]) -> None:
        """Answer an ``approval_needed`` frame (blocks until it is answered)."""
        url = _url(frame, "approvals")
        if url is None:
            return
        if self._io is not None:
            answer = self._ask(_approval_event(frame), frame)
            if answer is None:
                return
            body = _approval_body(answer)
        elif self._approve is not None:  # nobody to ask: the operator's rule decides
            decided = self._approve(frame)
            body = decided if isinstance(decided, dict) else {"approved": bool(decided)}
        else:
            body = {"approved": False, "feedback": NO_ONE_HERE}
        self._post(url, body)

    def question(self, frame: dict[str, Any]) -> None:
        """Answer an ``ask_user`` frame, one ``ask_user`` event per question (blocks)."""
        url = _url(frame, "questions")
        if url is None:
            return
        if self._io is None:
            self._post(url, {"decline": True, "message": NO_ONE_HERE})
            return
        answers: dict[str, str] = {}
        questions = frame.get("questions")
        for number, item in enumerate(questions if isinstance(questions, list) else []):
            if not isinstance(item, dict) or not isinstance(item.get("question"), str):
                continue
            options = [o.get("label") for o in item.get("options", []) if isinstance(o, dict)]
            event = {
                "type": "ask_user",
                "id": frame["request_id"] if number == 0 else f"{frame['request_id']}/{number}",
                "question": item["question"],
                "options": [o for o in options if isinstance(o, str)],
                "multi_select": bool(item.get("multiSelect")),
            }
            answer = self._ask(event, frame)
            if answer is None:
                return
            text = answer.get("answer")
            if isinstance(text, list):  # several labels of a multi-select question
                text = ", ".join(str(t) for t in text)
            if isinstance(text, str) and text:
                answers[item["question"]] = text
        if not answers:
            self._post(url, {"decline": True, "message": NO_ANSWER})
            return
        self._post(url, {"answers": answers})

    def _ask(self, event: dict[str, Any], frame: dict[str, Any]) -> dict[str, Any] | None:
        """Send ``event``, take the answer; None when there is none to post: a Stop or the
        call's timeout came instead (the run is cancelled), or the daemon ended the request."""
        io = self._io
        assert io is not None  # noqa: S101 - callers checked
        watch = None
        try:
            io.send(event)  # first: the watch closes the request the IO now holds open
            if self._close is not None:
                watch = Watch(
                    self._path,
                    frame,
                    event,
                    self._close,
                    self._stop,
                    self._poll_s,
                    self._interrupted,
                )
                with watch:
                    answer = io.receive()
            else:  # an IO the wait cannot be ended on: as ConnectOnion's own tools wait
                warn_unclosable(io)
                answer = io.receive()
        except Exception as exc:
            # ConnectOnion's Stop while waiting (UserInterrupt): stop the run, not the tool.
            if type(exc).__name__ != "UserInterrupt":
                raise
            answer = None
        over = watch.over if watch is not None else None
        if over == "resolved":
            return None  # the daemon's answer stands; the run goes on and the frames say how
        if (
            over == "stopped"
            or not isinstance(answer, dict)
            or answer.get("type") in ("PROVIDER_INTERRUPT", "INTERRUPT")
        ):
            post_json(self._path, f"/v1/runs/{frame['run_id']}/cancel")
            return None
        return answer

    def _post(self, url: str, body: dict[str, Any]) -> None:
        status, _ = post_json(self._path, url, body)
        if status == 200:
            self.answered += 1
        # 409: answered elsewhere, timed out or the run is ending; the frames say which.


def _url(frame: dict[str, Any], kind: str) -> str | None:
    run_id, request_id = frame.get("run_id"), frame.get("request_id")
    if not isinstance(run_id, str) or not isinstance(request_id, str):
        return None
    return f"/v1/runs/{run_id}/{kind}/{request_id}"


def _approval_event(frame: dict[str, Any]) -> dict[str, Any]:
    """The event ``IO.request_approval`` would send for this frame, with its id."""
    presentation = frame.get("providerApproval")
    event: dict[str, Any] = {"type": "approval_needed", "id": frame["request_id"]}
    if isinstance(presentation, dict) and frame.get("parentToolCallId"):
        # A Work Room card: O Chat shows the allowlisted texts, never the raw command.
        event["tool"] = "claude_code"
        event["arguments"] = {k: presentation.get(k) for k in ("action", "scope", "reason")}
    else:
        event["tool"] = f"Claude Code › {frame.get('tool', '')}"
        event["arguments"] = frame.get("arguments")
        if frame.get("description"):
            event["description"] = frame["description"]
    for key in _PRESENTATION:
        value = frame.get(key)
        if isinstance(value, str) and value:
            event[key] = value
    if isinstance(presentation, dict):
        event["providerApproval"] = presentation
    return event


def _approval_body(answer: dict[str, Any]) -> dict[str, Any]:
    """ConnectOnion's normalised answer as the daemon's body (an unreadable one is a deny)."""
    approved = answer.get("approved") is True
    body: dict[str, Any] = {"approved": approved}
    if answer.get("scope") in ("once", "session") and approved:
        body["scope"] = answer["scope"]
    if not approved:
        if answer.get("mode") in ("reject_soft", "reject_hard", "reject_explain"):
            body["mode"] = answer["mode"]
        feedback = answer.get("feedback")
        if isinstance(feedback, str) and feedback.strip():
            body["feedback"] = feedback[:4000]
    return body
