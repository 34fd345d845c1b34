"""The translator: Claude Code ``stream-json`` bytes in, Agent IO frames out.

Sans-IO in the manner of h11: one object owns all the state of a run, bytes come in through
:meth:`Translator.receive_data` in any chunking, time comes in as an argument, and frames come
back as lists. Every state transition of a card lives in this module (open, progress, close).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, Literal, cast

import msgspec

from translator import wire
from translator.frames import (
    PROVIDER,
    ActivityKind,
    ActivityStatus,
    Diagnostic,
    DiagnosticCode,
    ErrorType,
    FinalResult,
    Frame,
    InvocationStatus,
    PermissionDenial,
    ProviderActivity,
    ProviderInvocation,
    ProviderMessage,
    RunResult,
    ToolCall,
    ToolProgress,
    ToolResult,
    frame_id,
)
from translator.lines import LineSplitter
from translator.outcome import Limits, Outcome, RunContext, final_result, invocation_end
from translator.patch import creation_diff, unified_diff
from translator.redact import bound_chars, bound_text, clean_chars, clean_text, clean_value
from translator.summary import (
    FILE_CHANGE_TOOLS,
    SUBAGENT_TOOLS,
    activity_kind,
    activity_texts,
    changed_path,
    tool_title,
)

TOOL_PREFIX: Final = "claude:"
NAME_PREFIX: Final = "Claude Code › "
# O Chat drops invocation frames whose ids do not match this (chat-item-mapper.ts).
_AGENT_IO_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,512}")
_UNKNOWN_TOOL: Final = "unknown"
_END_ERROR_TYPES: Final[dict[str, ErrorType]] = {
    "cancelled": "cancelled",
    "timeout": "timeout",
    "interrupted": "interrupted",
}
_TASK_END: Final = frozenset({"completed", "failed", "stopped", "killed"})
_HANDLED_SUBTYPES: Final = frozenset(
    {
        "init",
        "permission_denied",
        "task_started",
        "task_progress",
        "task_updated",
        "task_notification",
    }
)
# Known subtypes that carry nothing for cards: most system lines, dismissed with one lookup.
_PASSIVE_SUBTYPES: Final = wire.KNOWN_SUBTYPES - _HANDLED_SUBTYPES
_args_encoder: Final = msgspec.json.Encoder()


class Card:
    """An open tool call: created by its tool_use, gone once its tool_result frame is out."""

    # A plain slotted class: one is made per tool call, on the hot path.
    __slots__ = (
        "activity_seq",
        "args",
        "background",
        "changed",
        "content",
        "denied",
        "kind",
        "name",
        "parent_tool_id",
        "started",
        "task_status",
        "tool",
        "tool_id",
        "use_id",
    )

    def __init__(
        self,
        use_id: str,
        tool: str,
        parent_tool_id: str | None,
        started: float,
        args: object,
        changed: str | None,
    ) -> None:
        self.use_id = use_id
        self.tool = tool
        self.tool_id = TOOL_PREFIX + use_id
        self.name = NAME_PREFIX + tool
        self.parent_tool_id = parent_tool_id
        self.kind: ActivityKind = activity_kind(tool)
        self.started = started
        self.args = args
        self.changed = changed
        self.activity_seq = 0
        self.background = False  # an async subagent: ends on task_notification, not its result
        self.denied: str | None = None  # the CLI's reason when permission was denied
        self.content: str | None = None  # a Write's text, for a creation diff
        self.task_status: str | None = None  # a background task's end, from task_updated


class Translator:
    """The state machine of one run. See the module docstring and PLAN's interface."""

    def __init__(self, ctx: RunContext, limits: Limits | None = None) -> None:
        self.ctx = ctx
        self._run_id = ctx.run_id
        self.limits = limits = limits or Limits()
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
        self.tools_started = self.tools_completed = self.tools_failed = 0
        self._revision = 0
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

    def close(self, outcome: Outcome, now: float) -> list[Frame]:
        """Close every open card, then ``run_result`` (always the last frame of a run)."""
        if self._closed:
            return []
        self._now = now
        for line in self._splitter.feed(b""):
            self._line(line)
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
        cls, ctx: RunContext, frames: Iterable[Frame], limits: Limits | None = None
    ) -> Translator:
        """A translator in the state the stored ``frames`` of a run leave (daemon restart)."""
        from translator.restore import restore_into

        translator = cls(ctx, limits)
        restore_into(translator, frames)
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
        stream_event = wire.StreamEvent
        for msg in messages:
            if type(msg) is not stream_event:  # partial deltas: the full line follows
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
        # ``type(...) is`` rather than isinstance: this runs once per line.
        kind = type(msg)
        if kind is wire.Assistant or kind is wire.User:
            talk = cast(wire.Assistant | wire.User, msg)
            parent = talk.parent_tool_use_id
            if parent is not None and parent not in self._seen:
                self._hold(parent, talk)
            elif kind is wire.Assistant:
                self._assistant(cast(wire.Assistant, talk))
            else:
                self._user(cast(wire.User, talk))
        elif kind is wire.System:
            self._system(cast(wire.System, msg))
        elif kind is wire.ToolProgressLine:
            progress = cast(wire.ToolProgressLine, msg)
            cards = self._cards
            card = cards.get(progress.tool_use_id) or cards.get(progress.parent_tool_use_id or "")
            if card is not None:
                self._progress(card, int(progress.elapsed_time_seconds * 1000))
        elif kind is wire.Result:
            # Several result lines may come (after a background task): the last one wins.
            result = cast(wire.Result, msg)
            self._last_result = result
            self._session(result.session_id)
        # stream_event and rate_limit_event: partial deltas and quotas, nothing for a card.

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
        self._held.setdefault(parent, []).append(msg)

    def _assistant(self, msg: wire.Assistant) -> None:
        parent = msg.parent_tool_use_id
        content = msg.message.content
        if isinstance(content, str):
            if content:
                self._message(content, parent)
            return
        for block in content:
            kind = block.type
            if kind == "tool_use":
                if block.id and block.id not in self._seen:
                    self._open(block.id, block.name or _UNKNOWN_TOOL, block.input, parent)
            elif kind == "text" and block.text:
                self._message(block.text, parent)

    def _user(self, msg: wire.User) -> None:
        content = msg.message.content
        if isinstance(content, str):
            return  # a prompt, not a tool result
        for block in content:
            if block.type == "tool_result" and block.tool_use_id:
                self._tool_result(block, msg.tool_use_result, msg.parent_tool_use_id)

    def _system(self, msg: wire.System) -> None:
        subtype = msg.subtype
        if subtype in _PASSIVE_SUBTYPES:
            return
        if subtype == "init":
            self._session(msg.session_id)
        elif subtype == "permission_denied":
            self._permission_denied(msg)
        elif subtype in _HANDLED_SUBTYPES:
            self._task(subtype, msg)
        else:
            self._count("unknown_type")

    # --- cards --------------------------------------------------------------------------------

    def _open(self, use_id: str, tool: str, raw_args: object, parent: str | None) -> None:
        self._seen.add(use_id)
        limits = self.limits
        args = clean_value(raw_args, string_bytes=limits.arg_bytes, items=limits.items)
        encoded = _args_encoder.encode(args)
        if len(encoded) > limits.arg_bytes:
            args = _shrink_args(args, limits.arg_bytes)
        card = Card(
            use_id,
            tool,
            TOOL_PREFIX + parent if parent else None,
            self._now,
            args,
            changed_path(tool, raw_args, self.ctx.cwd),
        )
        if tool == "Write" and isinstance(raw_args, dict):
            content = raw_args.get("content")
            if isinstance(content, str):
                card.content = content[: 2 * limits.result_bytes]
        self._cards[use_id] = card
        self.tools_started += 1
        # Built here rather than through _frame: keyword splatting cost a microsecond a frame.
        self.seq = seq = self.seq + 1
        self._out.append(
            ToolCall(
                id=frame_id(self._run_id, seq),
                run_id=self._run_id,
                seq=seq,
                ts=self._now,
                provider=PROVIDER,
                child_session_id=self.session_id,
                invocationId=self._invocation,
                parentToolCallId=self._parent,
                tool_id=card.tool_id,
                name=card.name,
                args=args,
                status="in_progress",
                parent_tool_id=card.parent_tool_id,
                # From the cleaned args: already redacted, so only cut here.
                summary=bound_chars(tool_title(tool, args, self.ctx.cwd), limits.summary_chars),
            )
        )
        if self._invocation is not None:
            self._activity(card, "running")
        held = self._held.pop(use_id, None) if self._held else None
        if held:
            self._held_count -= len(held)
            for msg in held:
                self._dispatch(msg)

    def _tool_result(self, block: wire.ResultBlock, extra: msgspec.Raw, parent: str | None) -> None:
        use_id = block.tool_use_id or ""
        card = self._cards.get(use_id)
        if card is None:
            self._count("orphan_line")
            if use_id in self._seen:
                return  # its card is closed already: one result per call
            # A result for an id never seen: a synthetic card first, so no result is an orphan.
            self._open(use_id, _UNKNOWN_TOOL, {}, parent)
            # Opening it may have replayed held subagent lines that closed it already.
            card = self._cards.get(use_id)
            if card is None:
                return
        text = _result_text(block.content)
        if block.is_error:
            first = next((line for line in text.splitlines() if line.strip()), "tool error")
            self._close_card(
                card,
                ok=False,
                text=text,
                error=card.denied or first,
                error_type="permission_denied" if card.denied else "tool_error",
            )
            return
        diff = None
        if card.tool in SUBAGENT_TOOLS or card.tool in FILE_CHANGE_TOOLS:
            details = _tool_use_result(extra)
            if card.tool in SUBAGENT_TOOLS:
                if details is not None and details.status == "async_launched":
                    # A background subagent: its card stays open until task_notification.
                    card.background = True
                    self._progress(card, self._elapsed(card), summary="Running in the background")
                    return
            elif card.changed is not None and details is not None:
                if details.structuredPatch:
                    diff = unified_diff(card.changed, details.structuredPatch)
                elif details.type == "create" and card.content is not None:
                    diff = creation_diff(card.changed, card.content)
        self._close_card(card, ok=True, text=text, diff=diff)

    def _permission_denied(self, event: wire.System) -> None:
        use_id = wire.text(event.tool_use_id)
        if not use_id:
            self._count("malformed_line")
            return
        # The CLI's message is a long fixed preamble, then what needed approval and why: keep
        # that part (the whole message is the tool_result's text anyway).
        message = wire.text(event.message) or ""
        specific = message.partition("What required approval:")[2].strip()
        reason = specific or wire.text(event.decision_reason) or message or "permission denied"
        card = self._cards.get(use_id)
        if card is not None:
            card.denied = reason
        tool_id = TOOL_PREFIX + use_id
        if tool_id not in self._denials:
            self._denials[tool_id] = PermissionDenial(
                tool_id=tool_id,
                name=wire.text(event.tool_name) or (card.tool if card else _UNKNOWN_TOOL),
                input=card.args if card else None,
            )

    def _task(self, subtype: str, event: wire.System) -> None:
        task_id = wire.text(event.task_id)
        use_id = wire.text(event.tool_use_id)
        if task_id and use_id:
            self._tasks[task_id] = use_id
        card = self._cards.get(use_id or self._tasks.get(task_id or "", ""))
        if card is None:
            return
        if subtype == "task_progress":
            usage = wire.task_usage(event.usage)
            self._progress(
                card,
                usage.duration_ms if usage.duration_ms is not None else self._elapsed(card),
                summary=wire.text(event.description),
                tool_uses=usage.tool_uses,
                total_tokens=usage.total_tokens,
                last_tool_name=wire.text(event.last_tool_name),
            )
            return
        if not card.background:
            # A Bash task (local_bash) or a foreground subagent closes on its tool_result, and
            # must not close a second time.
            return
        if subtype == "task_updated":
            # The patch may come before the notification that carries the summary: remember
            # the end, and use it if the notification never comes.
            status = wire.patch_status(event.patch)
            if status in _TASK_END:
                card.task_status = status
            return
        status = wire.text(event.status)
        if subtype == "task_notification" and status in _TASK_END:
            self._end_task(card, status, wire.text(event.summary) or "")

    def _end_task(self, card: Card, status: str, summary: str) -> None:
        ok = status == "completed"
        failed_as: ErrorType = "tool_error" if status == "failed" else "cancelled"
        self._close_card(
            card,
            ok=ok,
            text=summary,
            error=None if ok else f"subagent {status}",
            error_type=None if ok else failed_as,
        )

    def _close_card(
        self,
        card: Card,
        *,
        ok: bool,
        text: str,
        error: str | None = None,
        error_type: ErrorType | None = None,
        diff: str | None = None,
    ) -> None:
        del self._cards[card.use_id]
        limits = self.limits
        if ok:
            self.tools_completed += 1
            if card.changed is not None:
                self._files[card.changed] = None
        else:
            self.tools_failed += 1
        self.seq = seq = self.seq + 1
        self._out.append(
            ToolResult(
                id=frame_id(self._run_id, seq),
                run_id=self._run_id,
                seq=seq,
                ts=self._now,
                provider=PROVIDER,
                child_session_id=self.session_id,
                invocationId=self._invocation,
                parentToolCallId=self._parent,
                tool_id=card.tool_id,
                name=card.name,
                status="completed" if ok else "failed",
                result=clean_text(text, limits.result_bytes),
                timing_ms=self._elapsed(card),
                error=clean_chars(error, limits.error_chars) if error is not None else None,
                error_type=error_type,
                diff=clean_text(diff, limits.result_bytes) if diff is not None else None,
                parent_tool_id=card.parent_tool_id,
            )
        )
        if self._invocation is not None:
            self._activity(card, "completed" if ok else "failed")

    def _progress(
        self, card: Card, elapsed_ms: int, summary: str | None = None, **counters: object
    ) -> None:
        self._frame(
            ToolProgress,
            tool_id=card.tool_id,
            name=card.name,
            elapsed_ms=max(elapsed_ms, 0),
            summary=clean_chars(summary, self.limits.summary_chars) if summary else None,
            **counters,
        )

    def _elapsed(self, card: Card) -> int:
        return max(int((self._now - card.started) * 1000), 0)

    # --- frames -------------------------------------------------------------------------------

    def _message(self, text: str, parent: str | None) -> None:
        self.seq = seq = self.seq + 1
        self._out.append(
            ProviderMessage(
                id=frame_id(self._run_id, seq),
                run_id=self._run_id,
                seq=seq,
                ts=self._now,
                provider=PROVIDER,
                child_session_id=self.session_id,
                invocationId=self._invocation,
                parentToolCallId=self._parent,
                role="assistant",
                text=clean_chars(text, self.limits.text_chars),
                parent_tool_id=TOOL_PREFIX + parent if parent else None,
            )
        )

    def _activity(self, card: Card, status: ActivityStatus) -> None:
        card.activity_seq += 1
        title, summary = activity_texts(card.kind, status)
        self._frame(
            ProviderActivity,
            activityId=card.tool_id,
            sequence=card.activity_seq,
            kind=card.kind,
            status=status,
            title=title,
            summary=summary,
            files=[card.changed] if card.changed is not None else None,
        )

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

    def _session(self, session_id: str | None) -> None:
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


def _result_text(content: str | list[wire.Part] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text if part.text is not None else f"[{part.type}]" for part in content)


def _tool_use_result(raw: msgspec.Raw) -> wire.ToolUseResult | None:
    try:
        return wire.tool_use_result_decoder.decode(raw)
    except msgspec.MsgspecError:
        return None  # a string, or a shape of another tool: no details


def _shrink_args(args: object, limit: int) -> object:
    # Too big even with each string bounded: shorter strings first, then the JSON text itself.
    for cap in (limit // 4, limit // 16, 64):
        smaller = clean_value(args, string_bytes=cap, depth=4, items=16)
        if len(_args_encoder.encode(smaller)) <= limit:
            return smaller
    # Then the JSON text itself, as a string (escaping makes its encoding longer: shrink to fit).
    text = _args_encoder.encode(args).decode()
    cap = limit
    while True:
        cut = bound_text(text, cap)
        if len(_args_encoder.encode(cut)) <= limit:
            return cut
        cap = cap * 3 // 4
