"""The records a run makes per tool call and per streamed text block.

Plain slotted classes, so that the compiled build makes them native (setup.py): the card rules
read a card's fields on every line of its call, and a native class's field is a load where a
Struct's (an interpreted class to compiled code) is a lookup by name. Neither is in a cycle.
"""

from __future__ import annotations

from typing import Any

from codelegate.translator.tools import Tool


class Card:
    """An open tool call: created by its tool_use, gone once its tool_result frame is out."""

    __slots__ = (
        "args",
        "background",
        "changed",
        "content",
        "denied",
        "facts",
        "parent_tool_id",
        "partial",
        "sequence",
        "started",
        "task_status",
        "tool_id",
        "updated_at",
        "use_id",
    )

    def __init__(
        self,
        use_id: str,
        tool_id: str,
        facts: Tool,
        parent_tool_id: str | None,
        started: float,
        args: Any,
        changed: str | None,
        partial: bool = False,
    ) -> None:
        self.use_id = use_id
        self.tool_id = tool_id
        self.facts = facts  # what its tool's name says (its name as frames carry it: facts.name)
        self.parent_tool_id = parent_tool_id
        self.started = started
        self.args = args
        self.changed = changed
        self.partial = partial  # opened at its block's start: the arguments are still coming
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
