"""Assistant text: whole messages, and text blocks as they stream (``--include-partial-messages``).

A streamed text block is shown as it grows, at most ten times a second and only up to its last
whole word; its full line replaces it. Stream events can also open a card at its block's start,
before its arguments have come (the card rules fill it in later).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import codelegate.translator.wire as wire
from codelegate.translator.cards import Cards
from codelegate.translator.partial import BlockDelta, BlockStart, MessageStart, TextDelta
from codelegate.translator.records import StreamedText
from codelegate.translator.state import RunState
from codelegate.translator.units import clean_units

_STREAM_EVERY: Final = 0.1  # seconds between two updates of a streamed message (≈ 10 a second)


class Messages:
    """The message rules of one run: its state, and its cards (a subagent speaks on its card)."""

    __slots__ = ("_cards", "s")

    def __init__(self, state: RunState, cards: Cards) -> None:
        self.s = state
        self._cards = cards

    def message(self, text: str, parent: str | None) -> None:
        """A whole text block of the agent ``parent`` (None: the main one)."""
        s = self.s
        # A text block whose start streamed already keeps that message's id; the full text
        # replaces what was streamed.
        streamed = s.streaming.pop(parent, None) if s.streaming else None
        message_id = streamed.message_id if streamed is not None else self._message_id()
        text = clean_units(text, s.limits.text_chars, s.redactor.clean_chars)
        s.message(message_id, text, parent, False)
        task = s.cards.get(parent) if parent is not None else None
        if task is not None:
            self._cards.update(task, text)  # a subagent's words, on its Task card

    def _message_id(self) -> str:
        # O Chat keeps a message by its id (and drops one without): the run's n-th message.
        s = self.s
        s.messages += 1
        return f"{s.run_id}:message:{s.messages}"

    def stream(self, msg: wire.StreamEvent) -> None:
        """A partial-message line: a block starts, or a text grows."""
        s = self.s
        event = msg.event
        parent = msg.parent_tool_use_id
        if parent is not None and parent not in s.seen:
            return  # a subagent's partial before its Task card: its full lines are held
        if isinstance(event, BlockDelta):
            streamed = s.streaming.get(parent)
            delta = event.delta
            if (
                streamed is not None
                and streamed.index == event.index
                and isinstance(delta, TextDelta)
                and delta.text
            ):
                self._grow(streamed, delta.text)
            return
        if not isinstance(event, BlockStart) and not isinstance(event, MessageStart):
            return  # a block's or a message's end, a thinking delta …: nothing to show
        # A block's full line comes before the next block of its agent starts (a stream fact):
        # a text still streaming then never got one (a stream cut off) and ends as far as it
        # got, so that nothing stays half-shown and the next full line is not taken for it.
        if parent in s.streaming:
            self.end_stream(parent)
        if isinstance(event, MessageStart) or event.content_block is None:
            return
        block = event.content_block
        if block.type == "tool_use":
            if block.id and block.id not in s.seen:
                self._cards.start(block.id, s.tool(block.name), parent)
        elif block.type == "text":
            s.streaming[parent] = StreamedText(self._message_id(), parent, event.index)

    def _grow(self, streamed: StreamedText, text: str) -> None:
        s = self.s
        if streamed.size <= 2 * s.limits.text_chars:  # the full line has the rest anyway
            streamed.chunks.append(text)
            streamed.size += len(text)
        if s.now - streamed.sent_at < _STREAM_EVERY:
            return  # coalesced: the next delta (or the full text) carries this one
        so_far = "".join(streamed.chunks)
        streamed.chunks = [so_far]
        # Up to the last space: a credential-shaped word is masked only once it is whole.
        cut = max(so_far.rfind(" "), so_far.rfind("\n"), so_far.rfind("\t"), 0)
        settled = so_far[:cut].rstrip()
        if not settled:
            return
        redactor = s.redactor
        settled = _close_quotes(settled, redactor.text)
        text = clean_units(settled, s.limits.text_chars, redactor.clean_chars)
        if text != streamed.sent:
            streamed.sent, streamed.sent_at = text, s.now
            s.message(streamed.message_id, text, streamed.parent, True)

    def end_stream(self, parent: str | None) -> None:
        """The streamed text of ``parent`` whose full line never came: ends with what streamed."""
        s = self.s
        streamed = s.streaming.pop(parent)
        text = "".join(streamed.chunks)
        if text.strip():
            text = clean_units(text, s.limits.text_chars, s.redactor.clean_chars)
            s.message(streamed.message_id, text, streamed.parent, False)


def _close_quotes(text: str, redact: Callable[[str], str]) -> str:
    """``text`` redacted as if its last line's open quotes were closed.

    A quoted secret (``password = "two words"``) is masked whole only once its closing quote
    has come: while it streams, the words after the first would show. Redacting with the quote
    closed masks them; the added quote is taken off again.
    """
    if '"' not in text and "'" not in text:
        return text  # no quote anywhere (most texts): two memchr, not a copy of its last line
    line = text[text.rfind("\n") + 1 :]
    closer = ('"' if line.count('"') % 2 else "") + ("'" if line.count("'") % 2 else "")
    if not closer:
        return text
    red = redact(text + closer)
    return red.removesuffix(closer)
