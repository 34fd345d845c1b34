"""The records a run makes per tool call and per streamed text block: msgspec Structs.

Structs rather than slotted classes: one is made per card or block, on the hot path, and a Struct
is built in C and never tracked by the garbage collector. They live apart from the run state
(:mod:`translator.state`) because mypyc cannot compile a module that defines a Struct, and the
state's methods run on every frame: this module stays interpreted, the state may be compiled.
"""

from __future__ import annotations

from typing import Any

import msgspec

from codelegate.translator.tools import Tool


class Card(msgspec.Struct, gc=False):
    """An open tool call: created by its tool_use, gone once its tool_result frame is out (no
    card is in a cycle)."""

    use_id: str
    tool_id: str
    facts: Tool  # what its tool's name says (its name as frames carry it: facts.name)
    parent_tool_id: str | None
    started: float
    args: Any
    changed: str | None
    partial: bool = False  # opened at its block's start: the arguments are still coming
    sequence: int = 0  # its row's place in the Work Room (first-seen ordinal), 0 = none
    background: bool = False  # an async subagent: ends on task_notification, not its result
    denied: str | None = None  # the CLI's reason when permission was denied
    content: str | None = None  # a Write's text, for a creation diff
    task_status: str | None = None  # a background task's end, from task_updated
    updated_at: float = float("-inf")  # when its last progress text went out


class StreamedText(msgspec.Struct, gc=False):
    """An assistant text block as it streams (``--include-partial-messages``).

    Built in C, a fifth of the slotted class's time, and left out of the collector (it holds
    strings only)."""

    message_id: str
    parent: str | None
    index: int  # the block's index in its message (deltas name it)
    chunks: list[str] = msgspec.field(default_factory=list)
    size: int = 0
    sent: str = ""
    sent_at: float = float("-inf")
