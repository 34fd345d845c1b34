"""The daemon's half of approvals: answers, timeouts and the audit rows of pending requests.

The translator decides what a ``can_use_tool`` becomes (a question to a person, or a denial by
policy) and builds every line the CLI gets; this registry carries that out: it writes the
translator's lines to the CLI's stdin, keeps one timer per pending request (``[approvals]
timeout_s``: unanswered, it is denied with a message Claude can act on), takes the answers
that come over HTTP or WebSocket, and keeps the ``approvals`` table in step with the
``approval_resolved`` frames, so that every request is listed with its answer.

Every request ends exactly once: answered by a client, by the timeout, by a cancel (resolved
before the interrupt is written; nothing is written for it, the interrupt makes the CLI drop the
request itself), by policy, or ``interrupted`` when the daemon goes down or the run ends with
the request still open. Who may answer is whoever may reach the API: the socket's allowed
peers and TCP token holders, the same authority as a cancel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Final, Literal

import msgspec
import structlog

from codelegate.daemon.record import Run
from codelegate.daemon.store.approvals import ApprovalRow
from codelegate.daemon.store.store import RunStore
from codelegate.policy.approvals import check_answer, deny_message, timeout_message
from codelegate.policy.codes import (
    APPROVAL_NOT_FOUND,
    APPROVAL_RESOLVED,
    BAD_REQUEST,
)
from codelegate.policy.errors import PolicyError
from codelegate.translator.approvals import Asked
from codelegate.translator.frames import ApprovalResolved, Frame

_log = structlog.get_logger("codelegate.approvals")

# The longest text a client may send with an answer (feedback, an answer, a note).
TEXT_CHARS: Final = 4000
# A message to the model is stored bounded: it is the model's input, the frames hold the rest.
STORED_MESSAGE_CHARS: Final = 1000

_Text = Annotated[str, msgspec.Meta(max_length=TEXT_CHARS)]
_Texts = Annotated[dict[_Text, _Text], msgspec.Meta(max_length=64)]


class Answer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/runs/{id}/approvals/{request_id}`` (O Chat's APPROVAL_RESPONSE)."""

    approved: bool
    scope: Literal["once", "session"] = "once"
    mode: Literal["reject_soft", "reject_hard", "reject_explain"] | None = None
    feedback: _Text | None = None


class QuestionAnswer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/runs/{id}/questions/{request_id}``.

    ``answers`` maps each question's text to the answer (a label or free text; several labels
    of a multi-select question joined ``", "``); ``answer`` is short for the first question's
    (ConnectOnion's ASK_USER_RESPONSE). ``decline`` denies the question with ``message``.
    """

    answers: _Texts | None = None
    answer: _Text | None = None
    notes: _Texts | None = None
    decline: bool = False
    message: _Text | None = None


def decode_body(body: bytes, kind: type[Answer] | type[QuestionAnswer]) -> Any:
    """A strictly decoded answer body; 400 ``bad_request`` naming what is wrong."""
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PolicyError(BAD_REQUEST, f"bad answer: {str(exc)[:300]}") from None


Emit = Callable[[Run, list[Frame]], None]
# What a row takes of the translator's pending request as it is (its arguments are encoded).
_ASKED_FIELDS: Final = ("request_id", "kind", "tool", "tool_id", "asked_at", "expires_at")


class Approvals:
    """Every run's pending requests, as the daemon carries them out (one per RunManager)."""

    def __init__(self, store: RunStore, emit: Emit, timeout_s: float) -> None:
        self._store = store
        self._emit = emit
        self._timeout_s = timeout_s
        self._rows: dict[tuple[str, str], ApprovalRow] = {}  # pending rows of live runs
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}

    # -- from the CLI ----------------------------------------------------------------------

    def after_data(self, run: Run, frames: Iterable[Frame]) -> None:
        """After a chunk was translated: write the translator's lines, arm the new requests.

        ``frames`` are the chunk's frames (already emitted): a request policy denied at once has
        an ``approval_resolved`` among them and no pending entry; it gets its row from there.
        """
        translator = run.translator
        child = run.child
        for line in translator.approvals.take_control():
            if child is None or not child.send(line):
                _log.warning("approval_line_not_written", reason="stdin closed")
        for asked in translator.approvals.take_asked():
            self._asked(run, asked)
        self.track(run, frames, translator.approvals.take_denied())

    def _asked(self, run: Run, asked: Asked) -> None:
        key = (run.run_id, asked.request_id)
        row = asked_row(run.run_id, asked)
        self._rows[key] = row
        self._store.put_approval(row)
        delay = max(0.0, asked.expires_at - time.time())
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._expire, run, asked.request_id)
        _log.info("approval_asked", request_id=asked.request_id, kind=asked.kind, tool=asked.tool)

    def track(
        self,
        run: Run,
        frames: Iterable[Frame],
        said: Mapping[str, str] | None = None,
        /,
        **answer: str | None,
    ) -> None:
        """Bring the rows in step with the ``approval_resolved`` frames among ``frames``
        (``said``: the messages policy's denies among them gave the model, by request id)."""
        for frame in frames:
            if isinstance(frame, ApprovalResolved):
                message = said.get(frame.request_id) if said else None
                self._resolved(run, frame, answer if message is None else {"message": message})

    def _resolved(self, run: Run, frame: ApprovalResolved, answer: dict[str, str | None]) -> None:
        key = (run.run_id, frame.request_id)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        row = self._rows.pop(key, None)
        if row is None:  # denied by policy at once: never pending
            row = ApprovalRow(
                run_id=run.run_id,
                request_id=frame.request_id,
                kind="permission",
                tool=frame.tool,
                tool_id=frame.tool_id,
                asked_at=frame.ts,
            )
        row = msgspec.structs.replace(
            row,
            decision=frame.decision,
            scope=frame.scope,
            by=frame.by,
            answered_at=frame.ts,
            mode=answer.get("mode"),
            message=_bounded(run, answer.get("message")),
        )
        self._store.put_approval(row)
        _log.info(
            "approval_resolved", request_id=frame.request_id, decision=frame.decision, by=frame.by
        )

    def _expire(self, run: Run, request_id: str) -> None:
        self._timers.pop((run.run_id, request_id), None)
        if run.stopping is not None or run.done.is_set():
            return  # the cancel or the close resolves it
        message = timeout_message(self._timeout_s)
        out = run.translator.approvals.resolve(
            request_id, decision="deny", by="timeout", message=message, now=time.time()
        )
        if out is None:
            return
        frames, line = out
        if line is not None and run.child is not None:
            run.child.send(line)
        self._emit(run, frames)
        self.track(run, frames, message=message)

    # -- from a client ---------------------------------------------------------------------

    async def answer(
        self, run_id: str, run: Run | None, request_id: str, body: Answer
    ) -> dict[str, Any]:
        """Carry out a person's answer to a permission request; PolicyError when it cannot."""
        asked = await self._open(run_id, run, request_id, "permission")
        assert run is not None  # noqa: S101 - _open found its pending request
        scope = check_answer(asked.verdict, approved=body.approved, scope=body.scope)
        decision: Literal["allow", "deny"] = "allow" if body.approved else "deny"
        message = None if body.approved else deny_message(body.mode, body.feedback)
        out = run.translator.approvals.resolve(
            request_id,
            decision=decision,
            scope=scope,
            by="client",
            message=message,
            now=time.time(),
        )
        self._carry_out(run, out, mode=body.mode, message=message)
        return {"run_id": run_id, "request_id": request_id, "decision": decision, "scope": scope}

    async def answer_question(
        self, run_id: str, run: Run | None, request_id: str, body: QuestionAnswer
    ) -> dict[str, Any]:
        """Carry out a person's answer to an AskUserQuestion; PolicyError when it cannot."""
        asked = await self._open(run_id, run, request_id, "question")
        assert run is not None  # noqa: S101 - _open found its pending request
        if body.decline:
            message = deny_message(None, body.message)
            out = run.translator.approvals.resolve(
                request_id, decision="deny", by="client", message=message, now=time.time()
            )
            self._carry_out(run, out, message=message)
            return {"run_id": run_id, "request_id": request_id, "decision": "deny"}
        answers = dict(body.answers or {})
        if body.answer is not None:
            first = _first_question(asked)
            if first is None:
                raise PolicyError(BAD_REQUEST, "this request asks no question to answer")
            answers.setdefault(first, body.answer)
        out = run.translator.approvals.resolve(
            request_id,
            decision="allow",
            by="client",
            answers=answers,
            notes=dict(body.notes) if body.notes else None,
            now=time.time(),
        )
        self._carry_out(run, out)
        return {"run_id": run_id, "request_id": request_id, "decision": "allow"}

    async def _open(self, run_id: str, run: Run | None, request_id: str, kind: str) -> Asked:
        """The pending request a client answers; 404 / 409 when there is none to answer.

        The last await is the store's, on the way to a refusal: once a pending request is
        found, nothing awaits until its answer is written.
        """
        asked = run.translator.approvals.pending.get(request_id) if run is not None else None
        if asked is None or asked.kind != kind or run is None:
            rows = await self._store.approvals(run_id)
            if any(r.request_id == request_id and r.kind == kind for r in rows):
                raise PolicyError(APPROVAL_RESOLVED, "that request was already resolved")
            raise PolicyError(APPROVAL_NOT_FOUND, f"no {kind} request with that id")
        child = run.child
        if run.stopping is not None or child is None or not child.stdin_open:
            raise PolicyError(APPROVAL_RESOLVED, "the run is ending; the request is closed")
        return asked

    def _carry_out(
        self,
        run: Run,
        out: tuple[list[Frame], bytes | None] | None,
        **answer: str | None,
    ) -> None:
        if out is None:  # resolved meanwhile (nothing awaits between _open and here)
            raise PolicyError(APPROVAL_RESOLVED, "that request was already resolved")
        frames, line = out
        if line is not None and run.child is not None:
            run.child.send(line)
        self._emit(run, frames)
        self.track(run, frames, **answer)

    # -- the run ends ----------------------------------------------------------------------

    def resolve_all(self, run: Run, by: Literal["cancel", "interrupted"]) -> None:
        """Close every pending request of ``run`` (a cancel, the daemon going down): frames and
        rows, nothing written to the CLI (the interrupt that follows cancels them there)."""
        if not run.translator.approvals.pending:
            return
        frames = run.translator.approvals.resolve_all(by, time.time())
        self._emit(run, frames)
        self.track(run, frames)

    def forget(self, run: Run) -> None:
        """The run is over: no timer of it may fire, no row of it stays in memory."""
        for key in [k for k in self._timers if k[0] == run.run_id]:
            self._timers.pop(key).cancel()
        for key in [k for k in self._rows if k[0] == run.run_id]:
            del self._rows[key]

    async def listing(self, run_id: str) -> list[dict[str, Any]]:
        """``GET /v1/runs/{id}/approvals``: every request of the run and its answer."""
        rows = await self._store.approvals(run_id)
        return [_listed(row) for row in rows]


def asked_row(run_id: str, asked: Asked) -> ApprovalRow:
    """The approvals row of a request put to a person, not answered yet."""
    shared = {name: getattr(asked, name) for name in _ASKED_FIELDS}
    return ApprovalRow(run_id=run_id, arguments=msgspec.json.encode(asked.arguments), **shared)


def _listed(row: ApprovalRow) -> dict[str, Any]:
    out = msgspec.structs.asdict(row)
    del out["run_id"]
    out["arguments"] = msgspec.json.decode(row.arguments) if row.arguments else None
    return out


def _bounded(run: Run, text: str | None) -> str | None:
    if text is None:
        return None
    return run.translator.redactor.clean_chars(text, STORED_MESSAGE_CHARS)


def _first_question(asked: Asked) -> str | None:
    raw = asked.prompt.input  # the question as asked: the answers are keyed by its text
    questions = raw.get("questions")
    if isinstance(questions, list) and questions and isinstance(questions[0], dict):
        question = questions[0].get("question")
        return question if isinstance(question, str) else None
    return None
