"""The translator: Claude Code ``stream-json`` bytes in, Agent IO frames out.

Sans-IO in the manner of h11: bytes come in through :meth:`Translator.receive_data` in any
chunking, time comes in as an argument, and frames come back as lists. Every fact of the run is
kept by one owner, :class:`~translator.state.RunState`; this module reads the lines and hands
each to its rules (the cards in :mod:`translator.cards`, assistant text in
:mod:`translator.messages`), and owns the Work Room lifecycle, the diagnostics and the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

import codelegate.translator.partial as partial
import codelegate.translator.wire as wire
from codelegate.policy.approvals import ApprovalsConfig
from codelegate.translator.approvals import ApprovalRules
from codelegate.translator.cards import Cards
from codelegate.translator.control import Channel
from codelegate.translator.frames import (
    ErrorType,
    FinalResult,
    Frame,
    InvocationStatus,
    ProviderInvocation,
    RunResult,
)
from codelegate.translator.inputs import Limits, Outcome, RunContext
from codelegate.translator.lines import LineSplitter
from codelegate.translator.messages import Messages
from codelegate.translator.outcome import final_result, invocation_end
from codelegate.translator.redact import PLAIN, Redactor
from codelegate.translator.restore import restore_into
from codelegate.translator.state import RunState

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
# Which field of a provider_invocation carries its text, by its status (the rest: an error).
_SUMMARY_FIELDS: Final[dict[InvocationStatus, str]] = {
    "starting": "currentSummary",
    "running": "currentSummary",
    "awaiting_approval": "currentSummary",
    "completed": "resultSummary",
}
# Known subtypes that carry nothing for cards: most system lines, dismissed with one lookup.
_PASSIVE_SUBTYPES: Final = wire.KNOWN_SUBTYPES - _HANDLED_SUBTYPES


class Translator:
    """The state machine of one run: its state, its rules, and the intake of its lines."""

    def __init__(
        self,
        ctx: RunContext,
        limits: Limits | None = None,
        redactor: Redactor | None = None,
        approvals: ApprovalsConfig | None = None,
    ) -> None:
        limits = limits or Limits()
        self.state = state = RunState(ctx, limits, redactor or PLAIN)
        self._splitter = LineSplitter(limits.line_bytes)
        self.cards = cards = Cards(state, self._dispatch)
        self.messages = Messages(state, cards)
        # Permission prompts and questions (off without a config: prompts denied, no frame).
        self.approvals = ApprovalRules(state, cards, self._invocation_frame, approvals)
        # When the run is over (the daemon closes the CLI's stdin then): see translator.control.
        self.channel = Channel()
        self._handlers = self._line_handlers()

    # --- the public API ---------------------------------------------------------------------

    def start(self, now: float) -> list[Frame]:
        """Frames of the run's start: the ``provider_invocation`` when a parent was named."""
        s = self._at(now)
        if s is None or s.started:
            return []
        s.started = True
        self._invocation_frame("running", "Working in the selected workspace")
        return s.take()

    def receive_data(self, data: bytes, now: float) -> list[Frame]:
        """Frames for the stdout bytes ``data`` (any chunking; ``b""`` = end of output)."""
        s = self._at(now)
        if s is None:
            return []
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
            s.count("oversized_line")
        return s.take()

    def stderr_seen(self, count: int, now: float) -> list[Frame]:
        """A ``stderr`` diagnostic for ``count`` stderr lines so far (sent at powers of two)."""
        s = self._at(now)
        if s is None:
            return []
        seen = s.diag.get("stderr", 0)
        if count > seen:
            s.diag["stderr"] = count
            if count.bit_length() > s.diag_sent.get("stderr", 0).bit_length():
                s.diagnostic("stderr", count)
        return s.take()

    def frames_not_stored(self, count: int, now: float) -> list[Frame]:
        """A ``frames_not_stored`` diagnostic when the run store stops keeping this run's frames
        (its cap): sent at the first one, and the total at the end (``close``)."""
        s = self._at(now)
        if s is None:
            return []
        first = "frames_not_stored" not in s.diag
        s.diag["frames_not_stored"] = count
        if first:
            s.diagnostic("frames_not_stored", count)
        return s.take()

    def close(self, outcome: Outcome, now: float) -> list[Frame]:
        """Close every open card, then ``run_result`` (always the last frame of a run)."""
        s = self._at(now)
        if s is None:
            return []
        for line in self._splitter.feed(b""):
            self._line(line)
        for agent in list(s.streaming):
            self.messages.end_stream(agent)
        self.approvals.end()  # nobody can answer what is pending any more: interrupted
        # Subagent lines still waiting for their Task card are not dropped: shown as they are.
        while s.held:
            _, held = s.held.popitem()
            s.count("orphan_line")
            for msg in held:
                self._dispatch(msg)
        error_type = _END_ERROR_TYPES.get(outcome.reason, "interrupted")
        cards = self.cards
        for card in list(s.cards.values()):
            if card.task_status is not None:
                cards.end_task(card, card.task_status, "")
                continue
            cards.close(
                card,
                ok=False,
                text="",
                error=card.denied or "the run ended before the tool finished",
                error_type="permission_denied" if card.denied else error_type,
            )
        for code, count in s.diag.items():
            if s.diag_sent.get(code) != count:
                s.diagnostic(code, count)
        result = final_result(s, outcome, now)
        s.result = result
        if s.invocation is not None:
            self._invocation_frame(*invocation_end(result.status))
        s.frame(RunResult, result=result)
        s.closed = True
        return s.take()

    def _at(self, now: float) -> RunState | None:
        """The run's state with its clock at ``now``; None once closed (it takes nothing more)."""
        s = self.state
        if s.closed:
            return None
        s.now = now
        return s

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
        translator = cls(ctx, limits, redactor, approvals)
        frames = list(frames)
        restore_into(translator.state, frames)
        translator.approvals.restore(frames)
        return translator

    # --- facts of the run, for the daemon ----------------------------------------------------

    @property
    def redactor(self) -> Redactor:
        """The run's redactor: the daemon cleans its own texts of the run with it."""
        return self.state.redactor

    @property
    def result(self) -> FinalResult | None:
        """The run's final result, once closed."""
        return self.state.result

    @property
    def last_result(self) -> wire.Result | None:
        """The CLI's last ``result`` line so far, if any (several may come: the last wins)."""
        return self.state.last_result

    @property
    def revision(self) -> int:
        """The last ``stateRevision`` used under this run's invocation id (kept by the daemon)."""
        return self.state.revision

    @property
    def activity_sequence(self) -> int:
        """The last Work Room row number used under this run's invocation id."""
        return self.state.sequence

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
        handlers = self._handlers
        stream = self.messages.stream
        streaming = self.state.streaming  # the text blocks streaming now (one dict, kept)
        stream_event, system, passive = wire.StreamEvent, wire.System, _PASSIVE_SUBTYPES
        block_start, message_start = partial.BlockStart, partial.MessageStart
        block_delta, text_delta = partial.BlockDelta, partial.TextDelta
        for msg in messages:
            kind = type(msg)
            # The commonest lines that carry nothing are dismissed here, without a call:
            # partial events other than a block's start while no text streams, and passive
            # system subtypes. The test is Messages.stream's, by the event's class.
            if kind is stream_event:
                event = msg.event  # type: ignore[union-attr]
                what = type(event)
                # A block's start may open a card or a text; the rest matter only while a
                # text streams: its delta grows it, a message's start ends it if cut off.
                if what is block_start or (
                    streaming
                    and (
                        what is message_start
                        or (what is block_delta and type(event.delta) is text_delta)  # type: ignore[union-attr]
                    )
                ):
                    stream(msg)  # type: ignore[arg-type]
                continue
            if kind is system and msg.subtype in passive:  # type: ignore[union-attr]
                continue
            handlers[kind](msg)

    def _line(self, raw: bytes) -> None:
        try:
            msg = wire.decode_line(raw)
        except wire.UnknownType:
            self.state.count("unknown_type")
            return
        except msgspec.MsgspecError:
            self.state.count("malformed_line")
            return
        self._dispatch(msg)

    def _dispatch(self, msg: wire.Line) -> None:
        self._handlers[type(msg)](msg)

    def _line_handlers(self) -> dict[type[wire.Line], Callable[[Any], None]]:
        # One lookup a line instead of a chain of type tests (this runs once per line).
        approvals = self.approvals
        return {
            wire.Assistant: self._assistant,
            wire.User: self._user,
            wire.System: self._system,
            wire.ToolProgressLine: self._progress,
            wire.Result: self._result,
            wire.StreamEvent: self.messages.stream,
            wire.ControlRequest: approvals.control_request,
            wire.ControlCancel: approvals.control_cancel,
            **dict.fromkeys(wire.QUIET_LINES, _ignore),
        }

    def _progress(self, msg: wire.ToolProgressLine) -> None:
        open_cards = self.state.cards
        card = open_cards.get(msg.tool_use_id) or open_cards.get(msg.parent_tool_use_id or "")
        if card is not None:
            elapsed = int(msg.elapsed_time_seconds * 1000)
            self.cards.progress(card, elapsed)
            self.cards.update(card, f"Still running after {elapsed // 1000} s")

    def _result(self, msg: wire.Result) -> None:
        # Several result lines may come (after a background task): the last one wins.
        self.state.last_result = msg
        self._session(msg.session_id)
        self.channel.result(msg.num_turns)

    def _assistant(self, msg: wire.Assistant) -> None:
        parent = msg.parent_tool_use_id
        if parent is None:
            self.channel.turn()  # the main agent speaks: a turn runs
        elif parent not in self.state.seen and self._hold(parent, msg):
            return
        content = msg.message.content
        if isinstance(content, str):
            if content:
                self.messages.message(content, parent)
            return
        cards = self.cards
        s = self.state
        seen = s.seen
        for block in content:
            kind = block.type
            if kind == "tool_use":
                use_id = block.id
                if use_id and use_id not in seen:
                    # The model chooses the name: it goes into every frame of the card.
                    cards.open(use_id, s.tool(block.name), block.input, parent)
                elif use_id:
                    card = s.cards.get(use_id)
                    if card is not None and card.partial:
                        cards.fill(card, block.input)
            elif kind == "text" and block.text:
                self.messages.message(block.text, parent)

    def _user(self, msg: wire.User) -> None:
        if msg.isReplay:
            self.channel.replayed(msg.message.content)  # what we wrote, taken in: no frame
            return
        parent = msg.parent_tool_use_id
        if parent is not None and parent not in self.state.seen and self._hold(parent, msg):
            return
        content = msg.message.content
        if isinstance(content, str):
            return  # a prompt, not a tool result
        for block in content:
            if block.type == "tool_result" and block.tool_use_id:
                self.cards.tool_result(block, msg.tool_use_result, parent)

    def _hold(self, parent: str, msg: wire.Assistant | wire.User) -> bool:
        # A subagent's line came before its Task tool_use: keep it until the card opens, within
        # a bound; past the bound it is shown now (False), under a parent card that does not
        # exist yet.
        s = self.state
        if s.held_count >= s.limits.held_lines:
            s.count("orphan_line")
            return False
        s.held_count += 1
        if isinstance(msg, wire.User):
            # Raw fields are views of the chunk they came in: a held line must not pin it.
            msg.tool_use_result = msg.tool_use_result.copy()
        s.held.setdefault(parent, []).append(msg)
        return True

    def _system(self, msg: wire.System) -> None:
        subtype = msg.subtype
        if subtype in _PASSIVE_SUBTYPES:
            return
        if subtype == "init":
            self.channel.turn()  # every turn opens with init, a background task's own too
            self._session(msg.session_id)
        elif subtype == "permission_denied":
            self.cards.permission_denied(msg)
        elif subtype == "background_tasks_changed":
            self.channel.tasks(wire.task_ids(msg.tasks))
        elif subtype in _HANDLED_SUBTYPES:
            self.cards.task(subtype, msg)
        else:
            self.state.count("unknown_type")

    # --- the Work Room lifecycle ---------------------------------------------------------------

    def _session(self, session_id: str | None) -> None:
        s = self.state
        session_id = s.said(session_id) if session_id else None
        if not session_id or session_id == s.cli_session:
            return
        s.cli_session = session_id
        if session_id != s.session_id:
            s.session_id = session_id
            self._invocation_frame("running", "Working in the selected workspace")

    def _invocation_frame(self, status: InvocationStatus, summary: str) -> None:
        # The Work Room's status, with its one (allowlisted) text in the field the status says.
        s = self.state
        if s.invocation is None:
            return
        s.revision += 1
        s.frame(
            ProviderInvocation,
            status=status,
            stateRevision=s.revision,
            permissionMode=s.permission,
            sessionId=s.session_id,
            elapsedMs=max(int((s.now - s.ctx.started_at) * 1000), 0),
            taskTitle="Complete the requested task",
            **{_SUMMARY_FIELDS.get(status, "errorSummary"): summary},
        )


def _ignore(msg: wire.Line) -> None:
    pass
