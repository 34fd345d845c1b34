"""Cards: every transition of a tool call's card lives here (open, progress, close).

A card opens on the first tool_use of an id and closes exactly once: on its tool_result, on a
background subagent's task_notification, or when the run ends (``Translator.close``). The rules
act on the run's :class:`~translator.state.RunState`, which they are given; the intake of lines
is :class:`~translator.core.Translator`'s.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Final

import msgspec

import codelegate.translator.wire as wire
from codelegate.translator.args import clean_args
from codelegate.translator.frames import (
    ActivityStatus,
    ErrorType,
    PermissionDenial,
    ProviderActivity,
    ToolCallUpdate,
    ToolProgress,
)
from codelegate.translator.patch import creation_diff, unified_diff
from codelegate.translator.records import Card
from codelegate.translator.state import TOOL_PREFIX, UNKNOWN_TOOL, RunState
from codelegate.translator.summary import activity_texts, changed_path, titled
from codelegate.translator.tools import Tool
from codelegate.translator.units import bound_units, clean_units

_TASK_END: Final = frozenset({"completed", "failed", "stopped", "killed"})
_UPDATE_EVERY: Final = 1.0  # seconds between two progress texts of one card


class Cards:
    """The card rules of one run: its state, and how to replay a held subagent line."""

    __slots__ = ("_replay", "s")

    def __init__(self, state: RunState, replay: Callable[[wire.Line], None]) -> None:
        self.s = state
        # A subagent's lines that came before its Task card are read again once it opens.
        self._replay = replay

    def open(self, use_id: str, tool: Tool, raw_args: object, parent: str | None) -> None:
        """A card for the CLI's tool call ``use_id`` of ``tool`` (:meth:`RunState.tool`)."""
        s = self.s
        # Its tool_id once the arguments are screened (the same screen may pass the id).
        card = Card(use_id, "", tool, s.tool_id(parent) if parent else None, s.now, None, None)
        if self._set_args(card, raw_args):
            # The same screen found nothing to mask in the id either: it is its own frame id.
            s.tool_ids[use_id] = card.tool_id = TOOL_PREFIX + use_id
        else:
            card.tool_id = s.tool_id(use_id)
        self._opened(card)
        self._call(card)
        self._replay_held(use_id)

    def start(self, use_id: str, tool: Tool, parent: str | None) -> None:
        """A card at its block's start, before any of its arguments (partial messages): the
        tool's name is all it shows until :meth:`fill`. With no arguments there is nothing to
        screen but the id, its title is the tool's bare one and the review has nothing to note
        (its full call will say)."""
        s = self.s
        parent_id = s.tool_id(parent) if parent else None
        card = Card(use_id, s.tool_id(use_id), tool, parent_id, s.now, {}, None, partial=True)
        self._opened(card)
        bare = tool.bare
        if bare is None:
            bare = titled(tool.tool, tool.title, {}, s.ctx.cwd)
            tool.bare = bare = bound_units(bare, s.limits.summary_chars)
        s.tool_call(card, bare)
        self._replay_held(use_id)

    def _opened(self, card: Card) -> None:
        s = self.s
        s.seen.add(card.use_id)
        s.cards[card.use_id] = card
        s.tools_started += 1
        if s.invocation is not None:
            # The row first: a tool_call before it would make O Chat show a raw row (the
            # command, an absolute path) until the typed row replaced it.
            s.sequence = card.sequence = s.sequence + 1
            self._activity(card, "running")

    def _replay_held(self, use_id: str) -> None:
        s = self.s
        if s.held:
            held = s.held.pop(use_id, None)
            if held:
                s.held_count -= len(held)
                for msg in held:
                    self._replay(msg)

    def fill(self, card: Card, raw_args: object) -> None:
        """The block of a card opened at its start is complete: a repeated tool_call carries
        the whole (bounded) arguments, and O Chat and the terminal update the card in place."""
        card.partial = False
        self._set_args(card, raw_args)
        if self.s.invocation is not None and card.changed is not None:
            self._activity(card, "running")  # the row learns its file
        self._call(card)

    def _set_args(self, card: Card, raw_args: object) -> bool:
        """The card's cleaned args (and changed file); True when the screen that passed them
        found nothing to mask in the card's id either."""
        s = self.s
        card.args, screened = clean_args(s.redactor, s.limits, raw_args, card.use_id)
        if card.facts.changes_files:
            tool = card.facts.tool
            changed = changed_path(tool, raw_args, s.ctx.cwd)
            # From the raw input (the cleaned args may be cut), so redacted here: it goes into
            # files_changed and the activity's files.
            card.changed = s.said(changed) if changed is not None else None
            if tool == "Write" and isinstance(raw_args, dict):
                content = raw_args.get("content")
                if isinstance(content, str):
                    card.content = content[: 2 * s.limits.result_bytes]
        return screened

    def _call(self, card: Card) -> None:
        s = self.s
        facts = card.facts
        # From the cleaned args: already redacted, so only cut here.
        title = titled(facts.tool, facts.title, card.args, s.ctx.cwd)
        frame = s.tool_call(card, bound_units(title, s.limits.summary_chars))
        if facts.review is not None:
            s.review.opened(frame.tool_id, facts.review, frame.args)

    def tool_result(self, block: wire.ResultBlock, extra: msgspec.Raw, parent: str | None) -> None:
        """A tool_result block: its card closes (one result per call)."""
        s = self.s
        use_id = block.tool_use_id or ""
        card = s.cards.get(use_id)
        if card is None:
            s.count("orphan_line")
            if use_id in s.seen:
                return  # its card is closed already: one result per call
            # A result for an id never seen: a synthetic card first, so no result is an orphan.
            self.open(use_id, s.tool(None), {}, parent)
            # Opening it may have replayed held subagent lines that closed it already.
            card = s.cards.get(use_id)
            if card is None:
                return
        content = block.content
        text = content if isinstance(content, str) else _result_text(content)
        if block.is_error:
            first = next((line for line in text.splitlines() if line.strip()), "tool error")
            self.close(
                card,
                ok=False,
                text=text,
                error=card.denied or first,
                error_type="permission_denied" if card.denied else "tool_error",
            )
            return
        diff = None
        facts = card.facts
        if facts.subagent:
            details = _tool_use_result(extra)
            if details is not None and details.status == "async_launched":
                # A background subagent: its card stays open until task_notification.
                card.background = True
                self.progress(card, self.elapsed(card), summary="Running in the background")
                self.update(card, "Running in the background")
                return
        elif facts.changes_files and card.changed is not None:
            details = _tool_use_result(extra)
            if details is not None:
                if details.structuredPatch:
                    diff = unified_diff(card.changed, details.structuredPatch)
                elif details.type == "create" and card.content is not None:
                    diff = creation_diff(card.changed, card.content)
        self.close(card, ok=True, text=text, diff=diff)

    def permission_denied(self, event: wire.System) -> None:
        """The CLI denied a tool call: its card says why when it closes, the result lists it."""
        s = self.s
        use_id = wire.text(event.tool_use_id)
        if not use_id:
            s.count("malformed_line")
            return
        # The CLI's message is a long fixed preamble, then what needed approval and why: keep
        # that part (the whole message is the tool_result's text anyway).
        message = wire.text(event.message) or ""
        specific = message.partition("What required approval:")[2].strip()
        reason = specific or wire.text(event.decision_reason) or message or "permission denied"
        self.mark_denied(use_id, reason, wire.text(event.tool_name))

    def mark_denied(self, use_id: str, reason: str, tool_name: str | None) -> None:
        """The call ``use_id`` was denied: its card closes ``permission_denied`` with ``reason``
        and the run's result lists it (also for a host deny, which has no system line)."""
        s = self.s
        card = s.cards.get(use_id)
        if card is not None:
            card.denied = reason
        tool_id = s.tool_id(use_id)
        if tool_id not in s.denials:
            s.denials[tool_id] = PermissionDenial(
                tool_id=tool_id,
                name=s.said(tool_name or (card.facts.tool if card else UNKNOWN_TOOL)),
                input=card.args if card else None,
            )

    def task(self, subtype: str, event: wire.System) -> None:
        """A task line (task_started, _progress, _updated, _notification) of a card's task."""
        s = self.s
        task_id = wire.text(event.task_id)
        use_id = wire.text(event.tool_use_id)
        if task_id and use_id:
            s.tasks[task_id] = use_id
        card = s.cards.get(use_id or s.tasks.get(task_id or "", ""))
        if card is None:
            return
        if subtype == "task_progress":
            usage = wire.task_usage(event.usage)
            description = wire.text(event.description)
            last_tool = wire.text(event.last_tool_name)
            last_tool = s.said(last_tool) if last_tool else None
            self.progress(
                card,
                usage.duration_ms if usage.duration_ms is not None else self.elapsed(card),
                summary=description,
                tool_uses=usage.tool_uses,
                total_tokens=usage.total_tokens,
                last_tool_name=last_tool,
            )
            if s.invocation is None:
                uses = usage.tool_uses
                done = f"{uses} tool use{'s' if uses != 1 else ''}" if uses else ""
                last = f"last: {last_tool}" if last_tool else ""
                self.update(card, " · ".join(filter(None, (description, done, last))))
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
            self.end_task(card, status, wire.text(event.summary) or "")

    def end_task(self, card: Card, status: str, summary: str) -> None:
        """A background subagent's card closes with its task's end."""
        ok = status == "completed"
        failed_as: ErrorType = "tool_error" if status == "failed" else "cancelled"
        self.close(
            card,
            ok=ok,
            text=summary,
            error=None if ok else f"subagent {status}",
            error_type=None if ok else failed_as,
        )

    def close(
        self,
        card: Card,
        *,
        ok: bool,
        text: str,
        error: str | None = None,
        error_type: ErrorType | None = None,
        diff: str | None = None,
    ) -> None:
        """The card's one tool_result."""
        s = self.s
        del s.cards[card.use_id]
        limits = s.limits
        redactor = s.redactor
        if ok:
            s.tools_completed += 1
            if card.changed is not None:
                s.files[card.changed] = None
        else:
            s.tools_failed += 1
            if error and not text.strip():
                text = error  # O Chat shows a card's result, never its error
        if s.invocation is not None:
            self._activity(card, "completed" if ok else "failed")
        frame = s.tool_result(
            card,
            ok,
            redactor.clean_text(text, limits.result_bytes),
            redactor.clean_chars(error, limits.error_chars) if error is not None else None,
            error_type,
            redactor.clean_text(diff, limits.result_bytes) if diff is not None else None,
        )
        if card.facts.review is not None:
            s.review.closed(frame)

    def progress(
        self, card: Card, elapsed_ms: int, summary: str | None = None, **counters: object
    ) -> None:
        """A tool_progress of an open card."""
        s = self.s
        s.frame(
            ToolProgress,
            tool_id=card.tool_id,
            name=card.facts.name,
            elapsed_ms=max(elapsed_ms, 0),
            summary=clean_units(summary, s.limits.summary_chars, s.redactor.clean_chars)
            if summary
            else None,
            **counters,
        )

    def update(self, card: Card, text: str) -> None:
        """A running tool_call_update: it replaces the card's text in O Chat, the only way it
        shows an open card moving. Inside a Work Room it is ignored (typed rows), so not sent
        there; at most one a second per card."""
        s = self.s
        if s.invocation is not None or not text or s.now - card.updated_at < _UPDATE_EVERY:
            return
        card.updated_at = s.now
        s.frame(
            ToolCallUpdate,
            tool_id=card.tool_id,
            name=card.facts.name,
            status="in_progress",
            result=s.redactor.clean_text(text, s.limits.result_bytes),
            parent_tool_id=card.parent_tool_id,
        )

    def elapsed(self, card: Card) -> int:
        return max(int((self.s.now - card.started) * 1000), 0)

    def _activity(self, card: Card, status: ActivityStatus) -> None:
        kind = card.facts.kind
        title, summary = activity_texts(kind, status)
        changed = card.changed
        self.s.frame(
            ProviderActivity,
            activityId=card.tool_id,
            sequence=card.sequence,
            kind=kind,
            status=status,
            title=title,
            summary=summary,
            # The only per-row detail O Chat shows: file names (it keeps at most 8 of 128 chars).
            files=_file_names(changed, self.s.redactor.clean_chars),
        )


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
