"""Rebuilding a translator from a run's stored frames (after a daemon restart)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from translator.cards import NAME_PREFIX, TOOL_PREFIX, Card
from translator.frames import (
    Diagnostic,
    Frame,
    PermissionDenial,
    ProviderActivity,
    ProviderInvocation,
    RunResult,
    ToolCall,
    ToolResult,
)

if TYPE_CHECKING:
    from translator.core import Translator


def restore_into(t: Translator, frames: Iterable[Frame]) -> None:
    """Replay stored frames into a fresh translator: seq, open cards, counters, revision."""
    t._started = True
    changed: dict[str, str | None] = {}
    for frame in frames:
        t.seq = max(t.seq, frame.seq)
        t.review.observe(frame)
        if frame.child_session_id:
            t.session_id = frame.child_session_id
        if isinstance(frame, ToolCall):
            use_id = frame.tool_id.removeprefix(TOOL_PREFIX)
            tool = frame.name.removeprefix(NAME_PREFIX)
            path = frame.args.get("file_path") if isinstance(frame.args, dict) else None
            card = Card(use_id, tool, frame.parent_tool_id, frame.ts, frame.args, None)
            changed[use_id] = path if isinstance(path, str) else None
            t._seen.add(use_id)
            t._cards[use_id] = card
            t.tools_started += 1
        elif isinstance(frame, ToolResult):
            use_id = frame.tool_id.removeprefix(TOOL_PREFIX)
            closed = t._cards.pop(use_id, None)
            if frame.status == "completed":
                t.tools_completed += 1
                path = changed.get(use_id)
                if path is not None and closed is not None and closed.kind == "file_change":
                    from translator.summary import relative_path

                    t._files[relative_path(path, t.ctx.cwd)] = None
            else:
                t.tools_failed += 1
            if frame.error_type == "permission_denied":
                t._denials[frame.tool_id] = PermissionDenial(
                    tool_id=frame.tool_id,
                    name=frame.name.removeprefix(NAME_PREFIX),
                    input=closed.args if closed else None,
                )
        elif isinstance(frame, ProviderActivity):
            open_card = t._cards.get(frame.activityId.removeprefix(TOOL_PREFIX))
            if open_card is not None:
                open_card.activity_seq = max(open_card.activity_seq, frame.sequence)
        elif isinstance(frame, ProviderInvocation):
            t._revision = max(t._revision, frame.stateRevision)
        elif isinstance(frame, Diagnostic):
            t._diag[frame.code] = t._diag_sent[frame.code] = frame.count
        elif isinstance(frame, RunResult):
            t.result = frame.result
            t._closed = True
