"""Cards: every transition of a tool call's card lives here (open, progress, close).

A card opens on the first tool_use of an id and closes exactly once: on its tool_result, on a
background subagent's task_notification, or when the run ends (``Translator.close``). The
:class:`CardRules` mixin holds these transitions; :class:`~translator.core.Translator` owns the
state they act on and the intake of lines.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Final

import msgspec

from codelegate.translator import wire
from codelegate.translator.frames import (
    PROVIDER,
    ActivityKind,
    ActivityStatus,
    ErrorType,
    Frame,
    PermissionDenial,
    ProviderActivity,
    ProviderMessage,
    ToolCall,
    ToolCallUpdate,
    ToolProgress,
    ToolResult,
    frame_id,
)
from codelegate.translator.outcome import NAME_CHARS, Limits, RunContext
from codelegate.translator.patch import creation_diff, unified_diff
from codelegate.translator.redact import (
    Redactor,
    bound_text,
)
from codelegate.translator.review import Review
from codelegate.translator.summary import (
    FILE_CHANGE_TOOLS,
    SUBAGENT_TOOLS,
    activity_kind,
    activity_texts,
    changed_path,
    tool_title,
)
from codelegate.translator.units import bound_units, clean_units

TOOL_PREFIX: Final = "claude:"
NAME_PREFIX: Final = "Claude Code › "
_UNKNOWN_TOOL: Final = "unknown"
_TASK_END: Final = frozenset({"completed", "failed", "stopped", "killed"})
_args_encoder: Final = msgspec.json.Encoder()
_STREAM_EVERY: Final = 0.1  # seconds between two updates of a streamed message (≈ 10 a second)
_UPDATE_EVERY: Final = 1.0  # seconds between two progress texts of one card
_SPACES: Final = (" ", "\n", "\t")


class Card:
    """An open tool call: created by its tool_use, gone once its tool_result frame is out."""

    # A plain slotted class: one is made per tool call, on the hot path.
    __slots__ = (
        "args",
        "background",
        "changed",
        "content",
        "denied",
        "kind",
        "name",
        "parent_tool_id",
        "partial",
        "sequence",
        "started",
        "task_status",
        "tool",
        "tool_id",
        "updated_at",
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
        tool_id: str | None = None,
    ) -> None:
        self.use_id = use_id
        self.tool = tool
        self.tool_id = tool_id or TOOL_PREFIX + use_id
        self.name = NAME_PREFIX + tool
        self.parent_tool_id = parent_tool_id
        self.kind: ActivityKind = activity_kind(tool)
        self.started = started
        self.args = args
        self.changed = changed
        self.partial = False  # opened at its block's start: the arguments are still coming
        self.sequence = 0  # its row's place in the Work Room (first-seen ordinal), 0 = none
        self.background = False  # an async subagent: ends on task_notification, not its result
        self.denied: str | None = None  # the CLI's reason when permission was denied
        self.content: str | None = None  # a Write's text, for a creation diff
        self.task_status: str | None = None  # a background task's end, from task_updated
        self.updated_at = float("-inf")  # when its last progress text went out


class StreamedText:
    """An assistant text block as it streams (``--include-partial-messages``)."""

    __slots__ = ("chunks", "index", "message_id", "parent", "sent", "sent_at", "size")

    def __init__(self, message_id: str, parent: str | None, index: int) -> None:
        self.message_id = message_id
        self.parent = parent
        self.index = index  # the block's index in its message (deltas name it)
        self.chunks: list[str] = []
        self.size = 0
        self.sent = ""
        self.sent_at = float("-inf")


class CardRules:
    """The card transitions, mixed into :class:`~translator.core.Translator` (its state)."""

    # State and helpers of the Translator these rules act on.
    ctx: RunContext
    limits: Limits
    seq: int
    session_id: str | None
    tools_started: int
    tools_completed: int
    tools_failed: int
    _run_id: str
    redactor: Redactor
    _now: float
    _out: list[Frame]
    _cards: dict[str, Card]
    _seen: set[str]
    _tasks: dict[str, str]
    _held: dict[str, list[wire.Assistant | wire.User]]
    _held_count: int
    _denials: dict[str, PermissionDenial]
    _files: dict[str, None]
    review: Review
    _invocation: str | None
    _parent: str | None
    _sequence: int
    _message_ids: dict[str, None]
    _streaming: dict[str | None, StreamedText]
    _count: Callable[..., None]
    _said: Callable[..., str]
    _tool_id: Callable[[str], str]
    _tool_ids: dict[str, str]
    _dispatch: Callable[[wire.Line], None]
    _frame: Callable[..., None]

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
                use_id = block.id
                if use_id and use_id not in self._seen:
                    # The model chooses the name: it goes into every frame of the card.
                    tool = self._said(block.name or _UNKNOWN_TOOL, NAME_CHARS)
                    self._open(use_id, tool, block.input, parent)
                elif use_id:
                    card = self._cards.get(use_id)
                    if card is not None and card.partial:
                        self._fill(card, block.input)
            elif kind == "text" and block.text:
                self._message(block.text, parent)

    def _user(self, msg: wire.User) -> None:
        content = msg.message.content
        if isinstance(content, str):
            return  # a prompt, not a tool result
        for block in content:
            if block.type == "tool_result" and block.tool_use_id:
                self._tool_result(block, msg.tool_use_result, msg.parent_tool_use_id)

    def _open(
        self, use_id: str, tool: str, raw_args: object, parent: str | None, partial: bool = False
    ) -> None:
        self._seen.add(use_id)
        card = Card(use_id, tool, self._tool_id(parent) if parent else None, self._now, None, None)
        card.partial = partial
        if self._set_args(card, raw_args):
            # The same screen found nothing to mask in the id either: it is its own frame id.
            self._tool_ids[use_id] = TOOL_PREFIX + use_id
        card.tool_id = self._tool_id(use_id)
        self._cards[use_id] = card
        self.tools_started += 1
        if self._invocation is not None:
            # The row first: a tool_call before it would make O Chat show a raw row (the
            # command, an absolute path) until the typed row replaced it.
            self._sequence = card.sequence = self._sequence + 1
            self._activity(card, "running")
        self._call(card)
        held = self._held.pop(use_id, None) if self._held else None
        if held:
            self._held_count -= len(held)
            for msg in held:
                self._dispatch(msg)

    def _fill(self, card: Card, raw_args: object) -> None:
        # The block of a card opened at its start is complete: a repeated tool_call carries
        # the whole (bounded) arguments, and O Chat and the terminal update the card in place.
        card.partial = False
        self._set_args(card, raw_args)
        if self._invocation is not None and card.changed is not None:
            self._activity(card, "running")  # the row learns its file
        self._call(card)

    def _set_args(self, card: Card, raw_args: object) -> bool:
        """The card's cleaned args (and changed file); True when the screen that passed them
        found nothing to mask in the card's id either."""
        limits = self.limits
        redactor = self.redactor
        use_id = card.use_id
        args: object = (
            redactor.clean_flat(raw_args, limits.arg_bytes, limits.items, use_id)
            if type(raw_args) is dict and len(use_id) <= NAME_CHARS
            else None
        )
        screened = args is not None
        if args is None:
            args = redactor.clean_value(raw_args, string_bytes=limits.arg_bytes, items=limits.items)
        encoded = _args_encoder.encode(args)
        if len(encoded) > limits.arg_bytes:
            args = _shrink_args(redactor, args, limits.arg_bytes)
        card.args = args
        tool = card.tool
        changed = changed_path(tool, raw_args, self.ctx.cwd)
        # From the raw input (the cleaned args may be cut), so redacted here: it goes into
        # files_changed and the activity's files.
        card.changed = self._said(changed) if changed is not None else None
        if tool == "Write" and isinstance(raw_args, dict):
            content = raw_args.get("content")
            if isinstance(content, str):
                card.content = content[: 2 * limits.result_bytes]
        return screened

    def _call(self, card: Card) -> None:
        limits = self.limits
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
                args=card.args,
                status="in_progress",
                parent_tool_id=card.parent_tool_id,
                # From the cleaned args: already redacted, so only cut here.
                summary=bound_units(
                    tool_title(card.tool, card.args, self.ctx.cwd), limits.summary_chars
                ),
            )
        )
        self.review.observe(self._out[-1])

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
        content = block.content
        text = content if isinstance(content, str) else _result_text(content)
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
                    self._update(card, "Running in the background")
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
        self._mark_denied(use_id, reason, wire.text(event.tool_name))

    def _mark_denied(self, use_id: str, reason: str, tool_name: str | None) -> None:
        """The call ``use_id`` was denied: its card closes ``permission_denied`` with ``reason``
        and the run's result lists it (also for a host deny, which has no system line)."""
        card = self._cards.get(use_id)
        if card is not None:
            card.denied = reason
        tool_id = self._tool_id(use_id)
        if tool_id not in self._denials:
            self._denials[tool_id] = PermissionDenial(
                tool_id=tool_id,
                name=self._said(tool_name or (card.tool if card else _UNKNOWN_TOOL)),
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
            description = wire.text(event.description)
            last_tool = wire.text(event.last_tool_name)
            last_tool = self._said(last_tool) if last_tool else None
            self._progress(
                card,
                usage.duration_ms if usage.duration_ms is not None else self._elapsed(card),
                summary=description,
                tool_uses=usage.tool_uses,
                total_tokens=usage.total_tokens,
                last_tool_name=last_tool,
            )
            if self._invocation is None:
                uses = usage.tool_uses
                done = f"{uses} tool use{'s' if uses != 1 else ''}" if uses else ""
                last = f"last: {last_tool}" if last_tool else ""
                self._update(card, " · ".join(filter(None, (description, done, last))))
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
        redactor = self.redactor
        if ok:
            self.tools_completed += 1
            if card.changed is not None:
                self._files[card.changed] = None
        else:
            self.tools_failed += 1
            if error and not text.strip():
                text = error  # O Chat shows a card's result, never its error
        if self._invocation is not None:
            self._activity(card, "completed" if ok else "failed")
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
                result=redactor.clean_text(text, limits.result_bytes),
                timing_ms=max(int((self._now - card.started) * 1000), 0),
                error=redactor.clean_chars(error, limits.error_chars)
                if error is not None
                else None,
                error_type=error_type,
                diff=redactor.clean_text(diff, limits.result_bytes) if diff is not None else None,
                parent_tool_id=card.parent_tool_id,
            )
        )
        self.review.observe(self._out[-1])

    def _progress(
        self, card: Card, elapsed_ms: int, summary: str | None = None, **counters: object
    ) -> None:
        self._frame(
            ToolProgress,
            tool_id=card.tool_id,
            name=card.name,
            elapsed_ms=max(elapsed_ms, 0),
            summary=clean_units(summary, self.limits.summary_chars, self.redactor.clean_chars)
            if summary
            else None,
            **counters,
        )

    def _update(self, card: Card, text: str) -> None:
        # A running tool_call_update replaces the card's text in O Chat: the only way it shows
        # an open card moving. Inside a Work Room it is ignored (typed rows), so not sent there;
        # at most one a second per card.
        if self._invocation is not None or not text or self._now - card.updated_at < _UPDATE_EVERY:
            return
        card.updated_at = self._now
        self._frame(
            ToolCallUpdate,
            tool_id=card.tool_id,
            name=card.name,
            status="in_progress",
            result=self.redactor.clean_text(text, self.limits.result_bytes),
            parent_tool_id=card.parent_tool_id,
        )

    def _elapsed(self, card: Card) -> int:
        return max(int((self._now - card.started) * 1000), 0)

    def _message(self, text: str, parent: str | None) -> None:
        # A text block whose start streamed already keeps that message's id; the full text
        # replaces what was streamed.
        streamed = self._streaming.pop(parent, None) if self._streaming else None
        message_id = streamed.message_id if streamed is not None else self._message_id()
        text = clean_units(text, self.limits.text_chars, self.redactor.clean_chars)
        self._message_frame(message_id, text, parent)
        task = self._cards.get(parent) if parent is not None else None
        if task is not None:
            self._update(task, text)  # a subagent's words, on its Task card

    def _message_id(self) -> str:
        # O Chat keeps a message by its id (and drops one without): the run's n-th message.
        message_id = f"{self._run_id}:message:{len(self._message_ids) + 1}"
        self._message_ids[message_id] = None
        return message_id

    def _stream(self, msg: wire.StreamEvent) -> None:
        event = msg.event
        parent = msg.parent_tool_use_id
        if event is None or (parent is not None and parent not in self._seen):
            return  # a subagent's partial before its Task card: its full lines are held
        kind = event.type
        if kind == "content_block_delta":
            streamed = self._streaming.get(parent)
            delta = event.delta
            if streamed is not None and streamed.index == event.index and delta and delta.text:
                self._grow(streamed, delta.text)
            return
        # A block's full line comes before the next block of its agent starts (a stream fact):
        # a text still streaming then never got one (a stream cut off) and ends as far as it
        # got, so that nothing stays half-shown and the next full line is not taken for it.
        if parent in self._streaming:
            self._end_stream(parent)
        block = event.content_block
        if kind != "content_block_start" or block is None:
            return
        if block.type == "tool_use":
            if block.id and block.id not in self._seen:
                tool = self._said(block.name or _UNKNOWN_TOOL, NAME_CHARS)
                self._open(block.id, tool, {}, parent, partial=True)
        elif block.type == "text":
            self._streaming[parent] = StreamedText(self._message_id(), parent, event.index)

    def _grow(self, streamed: StreamedText, text: str) -> None:
        if streamed.size <= 2 * self.limits.text_chars:  # the full line has the rest anyway
            streamed.chunks.append(text)
            streamed.size += len(text)
        if self._now - streamed.sent_at < _STREAM_EVERY:
            return  # coalesced: the next delta (or the full text) carries this one
        so_far = "".join(streamed.chunks)
        streamed.chunks = [so_far]
        # Up to the last space: a credential-shaped word is masked only once it is whole.
        settled = so_far[: max(0, *(so_far.rfind(space) for space in _SPACES))].rstrip()
        if not settled:
            return
        redactor = self.redactor
        settled = _close_quotes(settled, redactor.text)
        text = clean_units(settled, self.limits.text_chars, redactor.clean_chars)
        if text != streamed.sent:
            streamed.sent, streamed.sent_at = text, self._now
            self._message_frame(streamed.message_id, text, streamed.parent, partial=True)

    def _end_stream(self, parent: str | None) -> None:
        """The streamed text of ``parent`` whose full line never came: ends with what streamed."""
        streamed = self._streaming.pop(parent)
        text = "".join(streamed.chunks)
        if text.strip():
            text = clean_units(text, self.limits.text_chars, self.redactor.clean_chars)
            self._message_frame(streamed.message_id, text, streamed.parent)

    def _message_frame(
        self, message_id: str, text: str, parent: str | None, partial: bool = False
    ) -> None:
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
                messageId=message_id,
                text=text,
                parent_tool_id=self._tool_id(parent) if parent else None,
                partial=partial,
            )
        )

    def _activity(self, card: Card, status: ActivityStatus) -> None:
        title, summary = activity_texts(card.kind, status)
        changed = card.changed
        self._frame(
            ProviderActivity,
            activityId=card.tool_id,
            sequence=card.sequence,
            kind=card.kind,
            status=status,
            title=title,
            summary=summary,
            # The only per-row detail O Chat shows: file names (it keeps at most 8 of 128 chars).
            files=_file_names(changed, self.redactor.clean_chars),
        )


def _close_quotes(text: str, redact: Callable[[str], str]) -> str:
    """``text`` redacted as if its last line's open quotes were closed.

    A quoted secret (``password = "two words"``) is masked whole only once its closing quote
    has come: while it streams, the words after the first would show. Redacting with the quote
    closed masks them; the added quote is taken off again.
    """
    line = text[text.rfind("\n") + 1 :]
    closer = ('"' if line.count('"') % 2 else "") + ("'" if line.count("'") % 2 else "")
    if not closer:
        return text
    red = redact(text + closer)
    return red.removesuffix(closer)


def _file_names(changed: str | None, clean: Callable[[str, int], str]) -> list[str] | None:
    # Basenames: a row is no place for the workspace's layout, nor for an absolute path.
    name = posixpath.basename(changed.rstrip("/")) if changed else ""
    return [clean(name, 128)] if name else None


def _result_text(content: list[wire.Part] | None) -> str:
    if content is None:
        return ""
    return "\n".join(part.text if part.text is not None else f"[{part.type}]" for part in content)


def _tool_use_result(raw: msgspec.Raw) -> wire.ToolUseResult | None:
    try:
        return wire.tool_use_result_decoder.decode(raw)
    except msgspec.MsgspecError:
        return None  # a string, or a shape of another tool: no details


def _shrink_args(redactor: Redactor, args: object, limit: int) -> object:
    # Too big even with each string bounded: shorter strings first, then the JSON text itself.
    for cap in (limit // 4, limit // 16, 64):
        smaller = redactor.clean_value(args, string_bytes=cap, depth=4, items=16)
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
