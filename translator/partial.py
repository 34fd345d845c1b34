"""Input Structs for partial messages: the event of a ``stream_event`` line.

With ``--include-partial-messages`` the CLI passes on the Messages API's stream events as they
come: a block starts, a text or a tool call's input grows, a block or a message ends. An event is
a tagged union on its ``type``, and so is a block's delta: the events that never carry anything
for cards (a block's end, a message's delta and end, a thinking or tool input delta …) are Structs
without fields, decoded without building a string, and told apart by their class. An event or
delta of another type fails the union: ``wire.decode_line`` then reads its line as a
:class:`LooseStreamEvent`, which carries nothing (a new type costs its block the line-by-line
path, never the line).
"""

from __future__ import annotations

import msgspec


class StreamBlock(msgspec.Struct, gc=False):
    """The block a ``content_block_start`` opens (``tool_use`` with its id and name, ``text``)."""

    type: str = ""
    id: str | None = None
    name: str | None = None


class _Event(msgspec.Struct, tag_field="type", gc=False):
    pass


class _Delta(msgspec.Struct, tag_field="type", gc=False):
    pass


class TextDelta(_Delta, tag="text_delta"):
    """The one delta shown: a text grows."""

    text: str | None = None


# Deltas and events that carry nothing for cards: one empty Struct a type (a tag needs a class).
class InputJsonDelta(_Delta, tag="input_json_delta"): ...


class ThinkingDelta(_Delta, tag="thinking_delta"): ...


class SignatureDelta(_Delta, tag="signature_delta"): ...


class CitationsDelta(_Delta, tag="citations_delta"): ...


class BlockStart(_Event, tag="content_block_start"):
    """A block starts: a tool call's card, or a text that will stream."""

    index: int = 0
    content_block: StreamBlock | None = None


Delta = TextDelta | InputJsonDelta | ThinkingDelta | SignatureDelta | CitationsDelta


class BlockDelta(_Event, tag="content_block_delta"):
    index: int = 0
    delta: Delta | None = None


class MessageStart(_Event, tag="message_start"):
    """A message starts: a text of its agent still streaming was cut off."""


class BlockStop(_Event, tag="content_block_stop"): ...


class MessageDelta(_Event, tag="message_delta"): ...


class MessageStop(_Event, tag="message_stop"): ...


class Ping(_Event, tag="ping"): ...


class StreamError(_Event, tag="error"): ...


Event = (
    BlockStart
    | BlockDelta
    | MessageStart
    | BlockStop
    | MessageDelta
    | MessageStop
    | Ping
    | StreamError
)


class _LooseDelta(msgspec.Struct, gc=False):
    type: str = ""
    text: str | None = None


class _LooseEvent(msgspec.Struct, gc=False):
    type: str = ""
    index: int = 0
    content_block: StreamBlock | None = None
    delta: _LooseDelta | None = None


class LooseStreamEvent(msgspec.Struct, gc=False):
    """A stream_event as read before the union: any event or delta type, the same fields."""

    event: _LooseEvent | None = None
    parent_tool_use_id: str | None = None
