"""What a subscriber's queue holds, each thing knowing its own wire bytes and its own weight.

Three items a writer sends — a live :class:`Batch`, a replayed :class:`Delivery`, a
:class:`Control` message of our own protocol — and one promise of items, a stored
:class:`Replay` read a page at a time. Every item answers the same questions: its bytes as
WebSocket frames (``ws``) and as NDJSON lines (``ndjson``), the frames it carries, the run and
seq a lagging close names (``run_id``/``seq``; a control message has none), the payload of each
WebSocket message it makes (``payloads``, for aiohttp's own frames), and how it counts
against the subscriber's bounds (``live`` frames, ``replayed`` frames and their bytes,
``controls``). A subscriber and a connection's writer ask those, never which item it is; they
only ask whether the next thing queued is a stored replay, to be read before it is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import ClassVar, Final

import msgspec

from codelegate.daemon.wsframe import text_frame, text_header

# Replay pacing (see daemon/hub.py): what a writer takes at a time.
REPLAY_PAGE: Final = 256
REPLAY_PAGE_BYTES: Final = 256 * 1024


class Delivery(msgspec.Struct, frozen=True, gc=False):
    """One encoded frame of one run (the run's log and replays hold these).

    Queued on its own it is a replayed frame; live frames travel in a :class:`Batch`.
    Untracked by the cyclic garbage collector (it holds no containers): a daemon keeps up to
    ``[limits] replay_frames`` of these per recent run, and tracked they made every full
    collection walk them all, pausing the fan-out for tens of milliseconds (bench/RESULTS.md).
    """

    run_id: str
    seq: int
    data: bytes
    last: bool = False  # the run_result frame: a per-run stream may end after it

    live: ClassVar[int] = 0
    replayed: ClassVar[int] = 1
    controls: ClassVar[int] = 0

    @property
    def replayed_bytes(self) -> int:
        """What the frame takes of a replay page."""
        return len(self.data)

    @property
    def ws(self) -> bytes:
        """The frame as one WebSocket text frame."""
        return text_frame(self.data)

    @property
    def ndjson(self) -> bytes:
        """The frame as one NDJSON line."""
        return self.data + b"\n"

    @property
    def frames(self) -> Sequence[Delivery]:
        """Itself."""
        return (self,)

    @property
    def payloads(self) -> Sequence[bytes]:
        """The payload of each WebSocket message it makes: its own."""
        return (self.data,)


class Batch:
    """Consecutive live frames of one run, published together and shared by every subscriber.

    The wire bytes are built on first use and then reused for every client: WebSocket frames
    (``ws``) and NDJSON lines (``ndjson``).
    """

    __slots__ = ("_ndjson", "_ws", "first_seq", "frames", "last", "live", "run_id", "seq")

    replayed: ClassVar[int] = 0
    replayed_bytes: ClassVar[int] = 0
    controls: ClassVar[int] = 0

    def __init__(self, run_id: str, frames: Sequence[Delivery]) -> None:
        self.run_id = run_id
        self.frames = frames
        self.live = len(frames)  # what the batch counts against the subscriber's bound
        self.first_seq = frames[0].seq
        self.seq = frames[-1].seq  # the last one, as for a Delivery
        self.last = frames[-1].last
        self._ws: bytes | None = None
        self._ndjson: bytes | None = None

    @property
    def ws(self) -> bytes:
        """The batch as WebSocket text frames, one per frame, back to back."""
        if self._ws is None:
            parts: list[bytes] = []
            for d in self.frames:  # headers and payloads, copied once, by the join
                parts.append(text_header(len(d.data)))
                parts.append(d.data)
            self._ws = b"".join(parts)
        return self._ws

    @property
    def ndjson(self) -> bytes:
        """The batch as NDJSON lines."""
        if self._ndjson is None:
            self._ndjson = b"".join([d.data + b"\n" for d in self.frames])
        return self._ndjson

    @property
    def payloads(self) -> Sequence[bytes]:
        """The payload of each WebSocket message it makes: one per frame."""
        return [d.data for d in self.frames]

    def after(self, seq: int) -> Batch | None:
        """The part of the batch after ``seq`` (``None`` if nothing is left)."""
        rest = [d for d in self.frames if d.seq > seq]
        return Batch(self.run_id, rest) if rest else None


class Control:
    """A message of our own WebSocket protocol (an error, an acknowledgement); no run's frame."""

    __slots__ = ("data",)

    run_id: ClassVar[None] = None
    seq: ClassVar[int] = 0
    last: ClassVar[bool] = False
    live: ClassVar[int] = 0
    replayed: ClassVar[int] = 0
    replayed_bytes: ClassVar[int] = 0
    controls: ClassVar[int] = 1
    ndjson: ClassVar[bytes] = b""  # an NDJSON stream carries frames only
    frames: ClassVar[Sequence[Delivery]] = ()

    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def ws(self) -> bytes:
        """The message as one WebSocket text frame."""
        return text_frame(self.data)

    @property
    def payloads(self) -> Sequence[bytes]:
        """The payload of each WebSocket message it makes: its own."""
        return (self.data,)


# What a writer sends.
Item = Batch | Delivery | Control


def frames(items: Iterable[Item]) -> Iterator[Delivery]:
    """The frames in ``items``, in order (control messages carry none)."""
    for item in items:
        yield from item.frames


# Up to ``limit`` frames of a run with seq > ``after``, in order (the store's, for a Replay).
Fetch = Callable[[int, int], Awaitable[list[Delivery]]]


class Replay:
    """Stored frames of one run, ``after`` < seq <= ``upto``, read a page at a time as the
    subscriber's writer gets to it (never all at once; see daemon/hub.py)."""

    __slots__ = ("after", "cancelled", "done", "fetch", "run_id", "upto")

    live: ClassVar[int] = 0
    replayed: ClassVar[int] = 1  # queued, it counts as one replayed thing until it is read
    controls: ClassVar[int] = 0

    def __init__(self, run_id: str, fetch: Fetch, after: int, upto: int | None = None) -> None:
        self.run_id = run_id
        self.fetch = fetch
        self.after = after
        self.upto = upto
        self.done = upto is not None and upto <= after
        self.cancelled = False  # dropped by a newer subscribe while a page was being read

    async def page(self, limit: int) -> list[Delivery]:
        """The next page (at most ``limit`` frames, about REPLAY_PAGE_BYTES); sets ``done``."""
        got = await self.fetch(self.after, limit)
        upto = self.upto
        kept: list[Delivery] = []
        room = REPLAY_PAGE_BYTES
        for d in got:
            if upto is not None and d.seq > upto:
                self.done = True  # the rest is in memory, queued after this replay
                break
            if kept and room <= 0:
                break  # the rest of this fetch comes with the next page
            kept.append(d)
            room -= len(d.data)
        if not kept or (len(got) < limit and len(kept) == len(got)):
            self.done = True
        else:
            self.after = kept[-1].seq
            if upto is not None and self.after >= upto:
                self.done = True
        return kept


# What a subscriber's queue holds.
Queued = Item | Replay
