"""The CLI's control channel on stdin: the lines the daemon writes, and when the run is over.

Every run speaks stream-json on stdin (``--input-format stream-json``): an ``initialize``
control request first, then the prompt as a user message, later control requests such as
``interrupt``. With stdin open the CLI does not exit after its ``result``, so somebody must say
when the run is over: :class:`Channel` follows the lines the translator reads and says so (the
last ``result`` with no background task open); the daemon closes stdin then. Pure: lines are
built here as bytes, the daemon writes them.

The CLI ends at a stdin line that is not JSON (measured on 2.1.332): every line is encoded here
whole, one JSON object and a newline, never assembled by hand.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

from codelegate.translator.lines import LineSplitter

# The request id of the ``initialize`` request; one per process, so it needs nothing unique.
INITIALIZE_ID: Final = "initialize"

_tasks_decoder: Final = msgspec.json.Decoder(list[msgspec.Raw] | None)


class _Envelope(msgspec.Struct, gc=False):
    type: str | None = None


_envelope_decoder: Final = msgspec.json.Decoder(_Envelope)


def _line(obj: dict[str, Any]) -> bytes:
    # ASCII escapes: a task may hold lone surrogates (a JSON escape of half a pair), which
    # UTF-8 cannot encode but a JSON reader takes back as they were.
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def control_request(request_id: str, subtype: str) -> bytes:
    """A control request of ours (``initialize``, ``interrupt``) as one stdin line."""
    return _line(
        {"type": "control_request", "request_id": request_id, "request": {"subtype": subtype}}
    )


def user_message(text: str) -> bytes:
    """A user message (the prompt) as one stdin line."""
    return _line(
        {
            "type": "user",
            "message": {"role": "user", "content": text},
            "parent_tool_use_id": None,
            "session_id": "",
        }
    )


def opening(prompt: str) -> bytes:
    """What a run writes first: ``initialize``, then the prompt."""
    return control_request(INITIALIZE_ID, "initialize") + user_message(prompt)


def task_count(raw: msgspec.Raw) -> int | None:
    """How many tasks a ``background_tasks_changed`` line lists; None when it lists none."""
    try:
        tasks = _tasks_decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    return None if tasks is None else len(tasks)


class Channel:
    """When the run is over, from what the CLI printed.

    ``over`` is true from a ``result`` line printed while no background task is open, until
    the CLI says more (a background task that finishes starts a turn of its own, and its
    ``result`` is then the last one). Background tasks are counted from
    ``background_tasks_changed``, which lists every open one (a foreground task is not listed).
    """

    __slots__ = ("background", "over")

    def __init__(self) -> None:
        self.background = 0
        self.over = False

    def result(self) -> None:
        self.over = self.background == 0

    def tasks(self, count: int | None) -> None:
        if count is not None:
            self.background = count
        if self.background:
            self.over = False


class ResultWatch:
    """Whether a ``result`` line came in the bytes fed so far.

    For the interrupt of a cancelled run: its output is no longer translated (nothing of the
    process reaches a client after a stop but the closing frames), yet the daemon must see the
    turn's ``result`` to know that the CLI honoured the interrupt.
    """

    __slots__ = ("_splitter", "seen")

    def __init__(self, line_bytes: int) -> None:
        self._splitter = LineSplitter(line_bytes)
        self.seen = False

    def feed(self, data: bytes) -> bool:
        """True once a ``result`` line has come (``data`` in any chunking)."""
        if not self.seen:
            for line in self._splitter.feed(data):
                try:
                    kind = _envelope_decoder.decode(line).type
                except msgspec.DecodeError:
                    continue
                if kind == "result":
                    self.seen = True
                    break
        return self.seen
