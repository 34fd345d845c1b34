"""The translator: Claude Code ``stream-json`` bytes in, Agent IO frames out.

Sans-IO in the manner of h11: one object owns all the state of a run, bytes come in through
:meth:`Translator.receive_data` in any chunking, time comes in as an argument, and frames come
back as lists. This module owns the run: intake of lines, the Work Room lifecycle, diagnostics
and the final result; the transitions of each card are in :mod:`translator.cards`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, Literal

import msgspec

from codelegate.policy.approvals import ApprovalsConfig
from codelegate.translator import wire
from codelegate.translator.approvals import ApprovalRules, restore_pending
from codelegate.translator.cards import NAME_PREFIX, TOOL_PREFIX, Card, CardRules, StreamedText
from codelegate.translator.control import Channel, task_count
from codelegate.translator.frames import (
    PROVIDER,
    Diagnostic,
    DiagnosticCode,
    ErrorType,
    FinalResult,
    Frame,
    InvocationStatus,
    PermissionDenial,
    ProviderInvocation,
    RunResult,
    frame_id,
)
from codelegate.translator.lines import LineSplitter
from codelegate.translator.outcome import (
    NAME_CHARS,
    Limits,
    Outcome,
    RunContext,
    final_result,
    invocation_end,
)
from codelegate.translator.redact import PLAIN, Redactor
from codelegate.translator.review import Review

__all__ = ["NAME_PREFIX", "TOOL_PREFIX", "Card", "Translator"]

# The most of a path or an id the CLI reports that a frame carries (a tool name: NAME_CHARS).
_SAID_CHARS: Final = 1024
# O Chat drops invocation frames whose ids do not match this (chat-item-mapper.ts).
_AGENT_IO_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,512}")
_END_ERROR_TYPES: Final[dict[str, ErrorType]] = {
    "cancelled": "cancelled",
    "timeout": "timeout",
    "interrupted": "interrupted",
}
_HANDLED_SUBTYPES: Final = frozenset(
    {
        "init",
        "background_tasks_changed",
        "permission_denied",
        "task_started",
        "task_progress",
        "task_updated",
        "task_notification",
    }
)
# Partial-message events that can open a card or grow a text (the rest carry nothing).
_STREAMED: Final = frozenset({"content_block_start", "content_block_delta", "message_start"})
# Known subtypes that carry nothing for cards: most system lines, dismissed with one lookup.
_PASSIVE_SUBTYPES: Final = wire.KNOWN_SUBTYPES - _HANDLED_SUBTYPES


class Translator(CardRules, ApprovalRules):
    """The state machine of one run. See the module docstring and PLAN's interface."""

    def __init__(
        self,
        ctx: RunContext,
        limits: Limits | None = None,
        redactor: Redactor | None = None,
        approvals: ApprovalsConfig | None = None,
    ) -> None:
        self.ctx = ctx
        self._run_id = ctx.run_id
        self.limits = limits = limits or Limits()
        # The run's redactor: it knows the credentials the daemon passed to this run's CLI.
        self.redactor = redactor or PLAIN
        self._said_cache: dict[str, str] = {}
        self._tool_ids: dict[str, str] = {}  # the CLI's tool_use id -> the frames' tool_id
        self.seq = 0
        self.session_id: str | None = ctx.session_id
        self.result: FinalResult | None = None
        self._splitter = LineSplitter(limits.line_bytes)
        self._out: list[Frame] = []
        self._now = ctx.started_at
        self._started = False
        self._closed = False
        self._cli_session: str | None = None
        self._cards: dict[str, Card] = {}
        self._seen: set[str] = set()
        self._tasks: dict[str, str] = {}  # task_id -> tool_use_id
        self._held: dict[str, list[wire.Assistant | wire.User]] = {}
        self._held_count = 0
        self._last_result: wire.Result | None = None
        self._denials: dict[str, PermissionDenial] = {}
        self._files: dict[str, None] = {}
        self.review = Review(ctx.cwd)
        # When the run is over (the daemon closes the CLI's stdin then): see translator.control.
        self.channel = Channel()
        self.tools_started = self.tools_completed = self.tools_failed = 0
        self._revision = ctx.revision_base  # the Work Room's, continued across its runs
        self._sequence = ctx.sequence_base  # the last Work Room row number used
        self._message_ids: dict[str, None] = {}
        # The text block streaming now, per agent (None = the main one), until its full line.
        self._streaming: dict[str | None, StreamedText] = {}
        self._diag: dict[DiagnosticCode, int] = {}
        self._diag_sent: dict[DiagnosticCode, int] = {}
        parent = ctx.parent_tool_call_id
        invocation = f"claude_code:{parent}" if parent else None
        ok = invocation is not None and _AGENT_IO_ID.fullmatch(invocation) is not None
        self._invocation = invocation if ok else None
        self._parent = parent if ok else None
        self._permission: Literal["manual", "auto_approve"] = (
            "auto_approve" if ctx.mode in ("accept_edits", "auto") else "manual"
        )
        self._init_approvals(approvals)  # off without a config: prompts denied, no frame

    # --- the public API ---------------------------------------------------------------------

    def start(self, now: float) -> list[Frame]:
        """Frames of the run's start: the ``provider_invocation`` when a parent was named."""
        if self._started or self._closed:
            return []
        self._started = True
        self._now = now
        self._invocation_frame("running", current="Working in the selected workspace")
        return self._take()

    def receive_data(self, data: bytes, now: float) -> list[Frame]:
        """Frames for the stdout bytes ``data`` (any chunking; ``b""`` = end of output)."""
        if self._closed:
            return []
        self._now = now
        splitter = self._splitter
        before = splitter.oversized
        blocks = splitter.feed_blocks(data)
        if blocks is None:
            for line in splitter.feed(data):
                self._line(line)
        else:
            for block in blocks:
                self._block(block)
        for _ in range(splitter.oversized - before):
            self._count("oversized_line")
        return self._take()

    def stderr_seen(self, count: int, now: float) -> list[Frame]:
        """A ``stderr`` diagnostic for ``count`` stderr lines so far (sent at powers of two)."""
        if self._closed:
            return []
        self._now = now
        seen = self._diag.get("stderr", 0)
        if count > seen:
            self._diag["stderr"] = count
            if count.bit_length() > self._diag_sent.get("stderr", 0).bit_length():
                self._diagnostic("stderr", count)
        return self._take()

    def frames_not_stored(self, count: int, now: float) -> list[Frame]:
        """A ``frames_not_stored`` diagnostic when the run store stops keeping this run's frames
        (its cap): sent at the first one, and the total at the end (``close``)."""
        if self._closed:
            return []
        self._now = now
        first = "frames_not_stored" not in self._diag
        self._diag["frames_not_stored"] = count
        if first:
            self._diagnostic("frames_not_stored", count)
        return self._take()

    def close(self, outcome: Outcome, now: float) -> list[Frame]:
        """Close every open card, then ``run_result`` (always the last frame of a run)."""
        if self._closed:
            return []
        self._now = now
        for line in self._splitter.feed(b""):
            self._line(line)
        for agent in list(self._streaming):
            self._end_stream(agent)
        for asked in list(self._pending.values()):  # nobody can answer them any more
            self._settle(asked, "deny", "once", "interrupted", ending=True)
        # Subagent lines still waiting for their Task card are not dropped: shown as they are.
        while self._held:
            _, held = self._held.popitem()
            self._count("orphan_line")
            for msg in held:
                self._dispatch(msg)
        error_type = _END_ERROR_TYPES.get(outcome.reason, "interrupted")
        for card in list(self._cards.values()):
            if card.task_status is not None:
                self._end_task(card, card.task_status, "")
                continue
            self._close_card(
                card,
                ok=False,
                text="",
                error=card.denied or "the run ended before the tool finished",
                error_type="permission_denied" if card.denied else error_type,
            )
        for code, count in self._diag.items():
            if self._diag_sent.get(code) != count:
                self._diagnostic(code, count)
        result = final_result(self, outcome, now)
        self.result = result
        if self._invocation is not None:
            status, text = invocation_end(result.status)
            if status == "completed":
                self._invocation_frame(status, result=text)
            else:
                self._invocation_frame(status, error=text)
        self._emit_result(result)
        self._closed = True
        return self._take()

    @classmethod
    def restore(
        cls,
        ctx: RunContext,
        frames: Iterable[Frame],
        limits: Limits | None = None,
        redactor: Redactor | None = None,
        approvals: ApprovalsConfig | None = None,
    ) -> Translator:
        """A translator in the state the stored ``frames`` of a run leave (daemon restart)."""
        from codelegate.translator.restore import restore_into

        translator = cls(ctx, limits, redactor, approvals)
        frames = list(frames)
        restore_into(translator, frames)
        restore_pending(translator, frames)
        return translator

    # --- facts the final result is built from ------------------------------------------------

    @property
    def cli_session(self) -> str | None:
        """The session id the CLI itself reported (init or result), if any."""
        return self._cli_session

    @property
    def last_result(self) -> wire.Result | None:
        return self._last_result

    @property
    def revision(self) -> int:
        """The last ``stateRevision`` used under this run's invocation id (kept by the daemon)."""
        return self._revision

    @property
    def activity_sequence(self) -> int:
        """The last Work Room row number used under this run's invocation id."""
        return self._sequence

    @property
    def denials(self) -> dict[str, PermissionDenial]:
        return self._denials

    @property
    def files_changed(self) -> list[str]:
        return list(self._files)

    # --- lines --------------------------------------------------------------------------------

    def _block(self, block: bytes | memoryview) -> None:
        # The hot path: a whole chunk of complete lines decoded in one call. Any bad or unknown
        # line fails the block, which is then read line by line to count it.
        try:
            messages = wire.decode_lines(block)
        except msgspec.MsgspecError:
            for line in self._splitter.complete_lines(block):
                self._line(line)
            return
        dispatch = self._dispatch
        stream_event, system, passive = wire.StreamEvent, wire.System, _PASSIVE_SUBTYPES
        for msg in messages:
            kind = type(msg)
            # The commonest lines that carry nothing are dismissed here, without a call:
            # partial deltas of thinking and tool input, and passive system subtypes.
            if kind is stream_event:
                event = msg.event  # type: ignore[union-attr]
                if event is not None and event.type in _STREAMED:
                    delta = event.delta
                    if delta is None or delta.type == "text_delta":
                        self._stream(msg)  # type: ignore[arg-type]
                continue
            if kind is system and msg.subtype in passive:  # type: ignore[union-attr]
                continue
            dispatch(msg)

    def _line(self, raw: bytes) -> None:
        try:
            msg = wire.decode_line(raw)
        except wire.UnknownType:
            self._count("unknown_type")
            return
        except msgspec.MsgspecError:
            self._count("malformed_line")
            return
        if msg is not None:
            self._dispatch(msg)

    def _dispatch(self, msg: wire.Line) -> None:
        # ``type(msg) is`` rather than isinstance (this runs once per line); mypy narrows both.
        if type(msg) is wire.Assistant:
            parent = msg.parent_tool_use_id
            if parent is not None and parent not in self._seen:
                self._hold(parent, msg)
            else:
                self._assistant(msg)
        elif type(msg) is wire.User:
            parent = msg.parent_tool_use_id
            if msg.isReplay:
                self.channel.replayed()  # a user message we wrote, taken in: nothing to show
            elif parent is not None and parent not in self._seen:
                self._hold(parent, msg)
            else:
                self._user(msg)
        elif type(msg) is wire.System:
            self._system(msg)
        elif type(msg) is wire.ToolProgressLine:
            cards = self._cards
            card = cards.get(msg.tool_use_id) or cards.get(msg.parent_tool_use_id or "")
            if card is not None:
                elapsed = int(msg.elapsed_time_seconds * 1000)
                self._progress(card, elapsed)
                self._update(card, f"Still running after {elapsed // 1000} s")
        elif type(msg) is wire.Result:
            # Several result lines may come (after a background task): the last one wins.
            self._last_result = msg
            self._session(msg.session_id)
            self.channel.result()
        elif type(msg) is wire.StreamEvent:
            self._stream(msg)
        elif type(msg) is wire.ControlRequest:
            self._control_request(msg)
        elif type(msg) is wire.ControlCancel:
            self._control_cancel(msg)
        # rate_limit_event: quotas, nothing for a card.

    def _hold(self, parent: str, msg: wire.Assistant | wire.User) -> None:
        # A subagent's line came before its Task tool_use: keep it until the card opens, within
        # a bound; past the bound it is shown now, under a parent card that does not exist yet.
        if self._held_count >= self.limits.held_lines:
            self._count("orphan_line")
            if isinstance(msg, wire.Assistant):
                self._assistant(msg)
            else:
                self._user(msg)
            return
        self._held_count += 1
        if isinstance(msg, wire.User):
            # Raw fields are views of the chunk they came in: a held line must not pin it.
            msg.tool_use_result = msg.tool_use_result.copy()
        self._held.setdefault(parent, []).append(msg)

    def _system(self, msg: wire.System) -> None:
        subtype = msg.subtype
        if subtype in _PASSIVE_SUBTYPES:
            return
        if subtype == "init":
            self._session(msg.session_id)
        elif subtype == "permission_denied":
            self._permission_denied(msg)
        elif subtype == "background_tasks_changed":
            self.channel.tasks(task_count(msg.tasks))
        elif subtype in _HANDLED_SUBTYPES:
            self._task(subtype, msg)
        else:
            self._count("unknown_type")

    # --- cards --------------------------------------------------------------------------------

    # --- frames -------------------------------------------------------------------------------

    def _invocation_frame(
        self,
        status: InvocationStatus,
        *,
        current: str | None = None,
        result: str | None = None,
        error: str | None = None,
    ) -> None:
        if self._invocation is None:
            return
        self._revision += 1
        self._frame(
            ProviderInvocation,
            status=status,
            stateRevision=self._revision,
            permissionMode=self._permission,
            sessionId=self.session_id,
            elapsedMs=max(int((self._now - self.ctx.started_at) * 1000), 0),
            taskTitle="Complete the requested task",
            currentSummary=current,
            resultSummary=result,
            errorSummary=error,
        )

    def _said(self, text: str, limit: int = _SAID_CHARS) -> str:
        """A short string the CLI or the model chose (a tool name, a path, a session id), as a
        frame may carry it: every such string goes through here."""
        said = self._said_cache.get(text)
        if said is not None:
            return said
        said = self.redactor.clean_chars(text, limit)
        # Tool names repeat on every call: remember the short ones, which no bound cuts (so the
        # answer is the same whatever the limit).
        if len(said) <= NAME_CHARS and len(text) <= NAME_CHARS and len(self._said_cache) < 1024:
            self._said_cache[text] = said
        return said

    def _tool_id(self, use_id: str) -> str:
        """The frame id of the CLI's tool call ``use_id``: redacted like any string it chose, and
        still one id per call (two masked ids must not name the same card)."""
        tool_id = self._tool_ids.get(use_id)
        if tool_id is not None:  # a parent, asked for by each line of its subagent
            return tool_id
        if len(use_id) <= NAME_CHARS and not self.redactor.screen(use_id.lower()):
            said = use_id  # the common case: nothing to mask, nothing to cut
        else:
            said = self.redactor.clean_chars(use_id, _SAID_CHARS)
            if said != use_id:
                said += f".{len(self._tool_ids) + 1}"
        # Like _seen, one entry per tool call of the run.
        self._tool_ids[use_id] = tool_id = TOOL_PREFIX + said
        return tool_id

    def _session(self, session_id: str | None) -> None:
        session_id = self._said(session_id) if session_id else None
        if not session_id or session_id == self._cli_session:
            return
        self._cli_session = session_id
        if session_id != self.session_id:
            self.session_id = session_id
            self._invocation_frame("running", current="Working in the selected workspace")

    def _count(self, code: DiagnosticCode) -> None:
        # Sent at counts 1, 2, 4, 8 …, and the total at the end: a flood of bad lines costs a
        # few frames, whatever the chunking.
        count = self._diag.get(code, 0) + 1
        self._diag[code] = count
        if count & (count - 1) == 0:
            self._diagnostic(code, count)

    def _diagnostic(self, code: DiagnosticCode, count: int) -> None:
        self._diag_sent[code] = count
        self._frame(Diagnostic, code=code, count=count)

    def _emit_result(self, result: FinalResult) -> None:
        self._frame(RunResult, result=result)

    def _frame(self, frame_type: type[Frame], /, **fields: object) -> None:
        self.seq = seq = self.seq + 1
        run_id = self._run_id
        self._out.append(
            frame_type(
                id=frame_id(run_id, seq),
                run_id=run_id,
                seq=seq,
                ts=self._now,
                provider=PROVIDER,
                child_session_id=self.session_id,
                invocationId=self._invocation,
                parentToolCallId=self._parent,
                **fields,  # type: ignore[arg-type]
            )
        )

    def _take(self) -> list[Frame]:
        out, self._out = self._out, []
        return out
