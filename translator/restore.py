"""Rebuilding a translator from a run's stored frames (after a daemon restart)."""

from __future__ import annotations

from collections.abc import Iterable

from codelegate.translator.frames import (
    Diagnostic,
    Frame,
    PermissionDenial,
    ProviderActivity,
    ProviderInvocation,
    ProviderMessage,
    RunResult,
    ToolCall,
    ToolResult,
)
from codelegate.translator.records import Card, StreamedText
from codelegate.translator.state import TOOL_PREFIX, RunState
from codelegate.translator.summary import changed_path
from codelegate.translator.tools import NAME_PREFIX


def restore_into(s: RunState, frames: Iterable[Frame]) -> None:
    """Replay stored frames into a fresh run state: seq, open cards, counters, revision."""
    s.started = True
    sequences: dict[str, int] = {}
    streaming: dict[str, ProviderMessage] = {}  # messages whose last frame is still partial
    message_ids: set[str] = set()
    for frame in frames:
        s.seq = max(s.seq, frame.seq)
        s.review.observe(frame)
        if frame.child_session_id:
            s.session_id = frame.child_session_id
        if isinstance(frame, ToolCall):
            use_id = frame.tool_id.removeprefix(TOOL_PREFIX)
            tool = s.tool(frame.name.removeprefix(NAME_PREFIX))
            changed = changed_path(tool.tool, frame.args, s.ctx.cwd)
            card = s.cards.get(use_id)
            if card is not None:  # a card opened at its block's start, then filled
                card.args, card.changed = frame.args, changed
                continue
            card = Card(
                use_id,
                TOOL_PREFIX + use_id,
                tool,
                frame.parent_tool_id,
                frame.ts,
                frame.args,
                changed,
            )
            s.seen.add(use_id)
            s.cards[use_id] = card
            s.tools_started += 1
        elif isinstance(frame, ToolResult):
            use_id = frame.tool_id.removeprefix(TOOL_PREFIX)
            closed = s.cards.pop(use_id, None)
            if frame.status == "completed":
                s.tools_completed += 1
                if closed is not None and closed.changed is not None:
                    s.files[closed.changed] = None
            else:
                s.tools_failed += 1
            if frame.error_type == "permission_denied":
                s.denials[frame.tool_id] = PermissionDenial(
                    tool_id=frame.tool_id,
                    name=frame.name.removeprefix(NAME_PREFIX),
                    input=closed.args if closed else None,
                )
        elif isinstance(frame, ProviderActivity):
            sequences[frame.activityId.removeprefix(TOOL_PREFIX)] = frame.sequence
            s.sequence = max(s.sequence, frame.sequence)
        elif isinstance(frame, ProviderMessage):
            message_ids.add(frame.messageId)
            if frame.partial:
                streaming[frame.messageId] = frame
            else:
                streaming.pop(frame.messageId, None)
        elif isinstance(frame, ProviderInvocation):
            s.revision = max(s.revision, frame.stateRevision)
        elif isinstance(frame, Diagnostic):
            s.diag[frame.code] = s.diag_sent[frame.code] = frame.count
        elif isinstance(frame, RunResult):
            s.result = frame.result
            s.closed = True
    s.messages = len(message_ids)
    # A card's rows keep their number (sent before its tool_call, or after it by older daemons).
    for use_id, card in s.cards.items():
        card.sequence = sequences.get(use_id, 0)
    # A message cut off mid-stream ends, at close, with the text it had reached.
    for message in streaming.values():
        parent = (
            message.parent_tool_id.removeprefix(TOOL_PREFIX) if message.parent_tool_id else None
        )
        streamed = StreamedText(message.messageId, parent, -1)
        streamed.chunks.append(message.text)
        s.streaming[parent] = streamed
