"""What a tool's name alone says of its cards, worked out once per name of a run.

The same few names come back on every call, so :class:`~translator.state.RunState` keeps one
:class:`Tool` per name, and every card of that name points at it (``Card.facts``).
"""

from __future__ import annotations

from typing import Final

from codelegate.policy.approvals import FILE_CHANGE_TOOLS
from codelegate.translator.frames import ActivityKind
from codelegate.translator.review import reviewed_tool
from codelegate.translator.summary import SUBAGENT_TOOLS, activity_kind, title_of

NAME_PREFIX: Final = "Claude Code › "  # of a card's frame name, before the tool's


class Tool:
    """The facts of one tool name: see the module docstring."""

    __slots__ = ("bare", "changes_files", "kind", "name", "review", "subagent", "title", "tool")

    def __init__(self, tool: str) -> None:
        self.tool = tool  # the name as the frames carry it (already said)
        self.name = NAME_PREFIX + tool  # the cards' frame name
        self.kind: ActivityKind = activity_kind(tool)
        self.title = title_of(tool)
        self.changes_files = tool in FILE_CHANGE_TOOLS
        self.subagent = tool in SUBAGENT_TOOLS
        # What the review evidence takes a card of this name for (None: it takes no note).
        self.review = reviewed_tool(self.name)
        # The title of a card with no arguments yet, bounded (set by the first such card).
        self.bare: str | None = None
