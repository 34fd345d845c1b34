"""Fan-out of encoded frames to subscribers (WebSocket and NDJSON clients).

The run publishes the frames of each stdout chunk, already encoded; the hub gathers what a run
publishes until its next write-out and hands it to every subscriber of the run as one shared
:class:`Batch`, which builds its WebSocket bytes (and NDJSON bytes) once, for all of them. The
publisher never awaits a client: each subscriber owns a bounded queue and its own writer task
(see ``daemon/serving/streams.py``). A subscriber whose queue is full is closed with
:data:`CLOSE_LAGGING` and reconnects with ``after=<last seq it got>``; the run and the other
subscribers never wait for it.

Writing out: a subscriber with a :class:`Sink` (a WebSocket whose transport takes bytes now)
and nothing queued is written by the hub itself, one ``transport.write`` per write-out, with no
task wake-up; anything else is queued for the subscriber's own writer task, which takes
everything queued at once and waits for that client alone.

When: at the end of the loop tick in which frames were published, so a quiet run's frames go
out at once. When many subscribers follow a run, the next write-out waits until a short window
has passed since the last one (:data:`WINDOW_PER_SUBSCRIBER` for each subscriber the last one
reached, at most :data:`WINDOW_MAX`): a run printing thousands of lines a second then costs each
client one write per window rather than one per line, which is what keeps latency flat on a
busy machine (bench/RESULTS.md).

Snapshot + live is atomic: the caller reads the replay from the run's in-memory frame log and
registers the subscriber without awaiting in between, the run appends to that log and publishes
in one synchronous step as well, and the hub hands out whatever it has gathered before it
registers a new subscriber (those frames are in the snapshot already).

Replay is paced by the client, under the same bound as live frames: a writer takes at most one
page (:data:`REPLAY_PAGE` frames, about :data:`REPLAY_PAGE_BYTES`) at a time and writes it only
when the client's transport takes bytes again, so a client that stops reading holds one page and
the transport's buffer, never a whole run. Frames in memory are queued as references; older
frames are a :class:`Replay`, read from the store one page at a time as the queue drains. A new
subscribe for a run first drops whatever is still queued for that run (:meth:`Subscriber.forget`):
repeating ``subscribe`` replaces a replay, it never stacks them.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Final, Protocol

import msgspec

CLOSE_LAGGING: Final = 4008
CLOSE_GOING_AWAY: Final = 1001
CLOSE_INTERNAL_ERROR: Final = 1011

# Write-out pacing (see the module docstring). Below WINDOW_MIN_SUBSCRIBERS there is no window.
WINDOW_MIN_SUBSCRIBERS: Final = 16
WINDOW_PER_SUBSCRIBER: Final = 20e-6
WINDOW_MAX: Final = 0.002

# Replay pacing (see the module docstring): what a writer takes at a time.
REPLAY_PAGE: Final = 256
REPLAY_PAGE_BYTES: Final = 256 * 1024

_PACK_LEN2: Final = struct.Struct("!BBH").pack
_PACK_LEN3: Final = struct.Struct("!BBQ").pack


_SHORT_HEADERS: Final = tuple(bytes((0x81, n)) for n in range(126))


def _ws_header(n: int) -> bytes:
    """The header of an unfragmented text frame from a server (RFC 6455 5.2: never masked)."""
    if n < 126:
        return _SHORT_HEADERS[n]
    if n < 65536:
        return _PACK_LEN2(0x81, 126, n)
    return _PACK_LEN3(0x81, 127, n)


def ws_text_frame(payload: bytes) -> bytes:
    """One unfragmented WebSocket text frame from a server."""
    return _ws_header(len(payload)) + payload


class Delivery(msgspec.Struct, frozen=True, gc=False):
    """One encoded frame of one run (the run's log and replays hold these).

    Untracked by the cyclic garbage collector (it holds no containers): a daemon keeps up to
    ``[limits] replay_frames`` of these per recent run, and tracked they made every full
    collection walk them all, pausing the fan-out for tens of milliseconds (bench/RESULTS.md).
    """

    run_id: str
    seq: int
    data: bytes
    last: bool = False  # the run_result frame: a per-run stream may end after it


class Batch:
    """Consecutive live frames of one run, published together and shared by every subscriber.

    The wire bytes are built on first use and then reused for every client: WebSocket frames
    (``ws``) and NDJSON lines (``ndjson``).
    """

    __slots__ = ("_ndjson", "_ws", "deliveries", "first_seq", "last", "run_id", "seq")

    def __init__(self, run_id: str, deliveries: Sequence[Delivery]) -> None:
        self.run_id = run_id
        self.deliveries = deliveries
        self.first_seq = deliveries[0].seq
        self.seq = deliveries[-1].seq  # the last one, as for a Delivery
        self.last = deliveries[-1].last
        self._ws: bytes | None = None
        self._ndjson: bytes | None = None

    @property
    def ws(self) -> bytes:
        """The batch as WebSocket text frames, one per frame, back to back."""
        if self._ws is None:
            parts: list[bytes] = []
            for d in self.deliveries:  # headers and payloads, copied once, by the join
                parts.append(_ws_header(len(d.data)))
                parts.append(d.data)
            self._ws = b"".join(parts)
        return self._ws

    @property
    def ndjson(self) -> bytes:
        """The batch as NDJSON lines."""
        if self._ndjson is None:
            self._ndjson = b"".join([d.data + b"\n" for d in self.deliveries])
        return self._ndjson

    def after(self, seq: int) -> Batch | None:
        """The part of the batch after ``seq`` (``None`` if nothing is left)."""
        rest = [d for d in self.deliveries if d.seq > seq]
        return Batch(self.run_id, rest) if rest else None


# Up to ``limit`` frames of a run with seq > ``after``, in order (the store's, for a Replay).
Fetch = Callable[[int, int], Awaitable[list[Delivery]]]


class Replay:
    """Stored frames of one run, ``after`` < seq <= ``upto``, read a page at a time as the
    subscriber's writer gets to it (never all at once; see the module docstring)."""

    __slots__ = ("after", "cancelled", "done", "fetch", "run_id", "upto")

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


# What a subscriber's queue holds: live batches, replayed frames (in memory, or a Replay of
# stored ones), and our own control messages.
Item = Batch | Delivery | bytes
Queued = Item | Replay


def frames(items: Iterable[Item]) -> Iterator[Delivery]:
    """The frames in ``items``, in order (control messages left out)."""
    for item in items:
        if isinstance(item, Batch):
            yield from item.deliveries
        elif isinstance(item, Delivery):
            yield item


class Sink(Protocol):
    """A client connection the hub may write to directly (see the module docstring)."""

    def ready(self) -> bool:
        """True when bytes written now go out without waiting (open and not paused)."""

    def write(self, items: list[Item]) -> None:
        """Write ``items`` at once, without waiting."""

    def write_batch(self, batch: Batch) -> bool:
        """Write ``batch`` if it goes out without waiting (as ``ready``); False: nothing written."""


class HubStats:
    """Counters the hub keeps for ``/metrics``."""

    def __init__(self) -> None:
        self.frames_published = 0
        self.frames_queued = 0
        self.subscribers_dropped = 0


class Subscriber:
    """One client's queue. The hub fills it (and writes it out, given a ready sink); otherwise
    the client's own writer task drains it."""

    def __init__(self, *, max_queue: int, name: str = "subscriber") -> None:
        self.name = name
        self.max_queue = max_queue
        self.runs: set[str] = set()
        self.follows_all = False
        self.closed = False
        self.close_code: int | None = None
        self.close_reason = ""
        # The last seq the writer sent, per run: what a lagging client resumes after.
        self.last_seq: dict[str, int] = {}
        # Per run: live frames at or below this seq were asked not to be sent (``after``).
        self.floor: dict[str, int] = {}
        self.floor_all = 0
        # Called once when the subscriber is closed: the connection's owner ends the
        # connection from there, since its writer may be blocked on a client that stopped reading.
        self.on_close: Callable[[], None] | None = None
        # Set by the connection once it can take bytes: the hub then writes it out directly.
        self.sink: Sink | None = None
        # What a writer takes at a time: the live bound applies to replay too.
        self.page = min(max_queue, REPLAY_PAGE)
        self.replay_pages = 0  # pages read from the store for this subscriber
        self._queue: deque[Queued] = deque()
        self._live = 0  # live frames queued (replay and control messages do not count)
        self._replayed = 0  # replayed frames and stored replays queued
        self._controls = 0  # control messages queued
        self._wake = asyncio.Event()

    @property
    def backlog(self) -> int:
        """Live frames queued and not yet taken by the writer."""
        return self._live

    def push(self, batch: Batch) -> int:
        """Take live frames without waiting (the hub decides when a subscriber lags).

        Written at once through a ready sink when nothing is queued before them; queued for the
        writer task otherwise. Returns how many frames were taken (the part of the batch after
        the subscriber's floor).
        """
        if self.closed:
            return 0
        floor = self.floor.get(batch.run_id, self.floor_all)
        if batch.first_seq <= floor:  # the client said it has (some of) these already
            rest = batch.after(floor)
            if rest is None:
                return 0
            batch = rest
        sink = self.sink
        if sink is not None and not self._queue and sink.write_batch(batch):
            self.last_seq[batch.run_id] = batch.seq
        else:
            self._queue.append(batch)
            self._live += len(batch.deliveries)
            self._wake.set()
        return len(batch.deliveries)

    def replay(self, deliveries: Iterable[Delivery], *, stored: Replay | None = None) -> None:
        """Queue a replay: ``stored`` frames (read later, page by page), then ``deliveries``.

        The deliveries are references to frames already in memory; writers take them a page at
        a time (see the module docstring).
        """
        if self.closed:
            return
        queue = self._queue
        before = len(queue)
        if stored is not None and not stored.done:
            queue.append(stored)
        queue.extend(deliveries)
        self._replayed += len(queue) - before
        self._wake.set()

    def forget(self, run_id: str) -> None:
        """Drop what is still queued for ``run_id`` (a newer subscribe replays it anew)."""
        if not self._queue:
            return
        kept: deque[Queued] = deque()
        for item in self._queue:
            if isinstance(item, bytes) or item.run_id != run_id:
                kept.append(item)
            elif isinstance(item, Replay):
                item.cancelled = True
                self._replayed -= 1
            elif isinstance(item, Batch):
                self._live -= len(item.deliveries)
            else:
                self._replayed -= 1
        self._queue = kept

    @property
    def idle(self) -> bool:
        """Nothing queued."""
        return not self._queue

    @property
    def replaying(self) -> bool:
        """A stored replay is next: the writer reads a page of it (an await) before writing."""
        return bool(self._queue) and isinstance(self._queue[0], Replay)

    def control(self, data: bytes) -> None:
        """Queue a message of our own protocol (errors, acknowledgements) for the writer.

        Bounded like live frames: a client that keeps sending messages without reading the
        answers is closed as lagging once ``max_queue`` of them wait.
        """
        if self.closed:
            return
        if self._controls >= self.max_queue:
            self.close(CLOSE_LAGGING, self.lag_reason())
            return
        self._queue.append(data)
        self._controls += 1
        self._wake.set()

    def close(self, code: int, reason: str) -> None:
        """Stop delivering; the writer sees ``closed`` and ends the connection with ``code``."""
        if self.closed:
            return
        self.closed = True
        self.close_code = code
        self.close_reason = reason
        self._queue.clear()
        self._live = self._replayed = self._controls = 0
        self._wake.set()
        if self.on_close is not None:
            self.on_close()

    async def wait(self) -> bool:
        """Wait while nothing is queued; False once closed."""
        while not self._queue and not self.closed:
            self._wake.clear()
            await self._wake.wait()
        return not self.closed

    async def get(self, limit: int = sys.maxsize) -> list[Item]:
        """What to write next, waiting while nothing is queued: the items queued before the
        next stored replay (up to ``limit`` frames, see :meth:`take`), or that replay's next
        page. ``[]`` once closed, or when a stored replay had nothing left."""
        if not await self.wait():
            return []
        head = self._queue[0]
        if not isinstance(head, Replay):
            return self.take(limit)
        page = await head.page(min(limit, self.page))
        self.replay_pages += 1
        if head.cancelled or self.closed:
            return []
        if head.done:
            self._queue.popleft()  # still the head: only writers take from the front
            self._replayed -= 1
        return list(page)

    def take(self, limit: int = sys.maxsize) -> list[Item]:
        """Queued items up to the next stored replay, without waiting (``[]`` when empty or
        closed): at least one, then while fewer than ``limit`` replayed frames and about
        REPLAY_PAGE_BYTES of them are taken. Live batches do not count: ``max_queue`` bounds
        them, and a writer behind on them takes them all at once."""
        if self.closed:
            return []
        queue = self._queue
        items: list[Item]
        if limit == sys.maxsize and not any(isinstance(item, Replay) for item in queue):
            items = list(queue)  # type: ignore[arg-type]
            queue.clear()
            self._live = self._replayed = self._controls = 0
            return items
        if not self._replayed:  # live batches and control messages only: bounded already
            items = list(queue)  # type: ignore[arg-type]
            queue.clear()
            self._live = self._controls = 0
            return items
        items = []
        count, room = 0, REPLAY_PAGE_BYTES
        while queue and count < limit and room > 0:
            item = queue[0]
            if isinstance(item, Replay):
                break
            queue.popleft()
            items.append(item)
            if isinstance(item, Batch):
                self._live -= len(item.deliveries)
            elif isinstance(item, Delivery):
                self._replayed -= 1
                count += 1
                room -= len(item.data)
            else:
                self._controls -= 1
        return items

    def write_to(self, sink: Sink, limit: int = sys.maxsize) -> None:
        """Take what is queued (as :meth:`take`) and write it with one call (the caller checked
        ``ready``)."""
        queue = self._queue
        if len(queue) == 1:  # the usual case: this tick's one batch
            head = queue[0]
            if not isinstance(head, Replay):
                queue.pop()
                self._live = self._replayed = self._controls = 0
                sink.write([head])
                if not isinstance(head, bytes):
                    self.last_seq[head.run_id] = head.seq
                return
        items = self.take(limit)
        if not items:
            return
        sink.write(items)
        last_seq = self.last_seq
        for item in items:
            if not isinstance(item, bytes):
                last_seq[item.run_id] = item.seq

    def sent(self, item: Item) -> None:
        """The writer delivered ``item``: a lagging close names the last frame sent."""
        if not isinstance(item, bytes):
            self.last_seq[item.run_id] = item.seq

    def lag_reason(self) -> str:
        """The close reason for a lagging subscriber: where to resume (fits 123 bytes).

        The seq is a safe lower bound (a frame may still be in flight to the client): a client
        resumes after the last seq it actually received.
        """
        if len(self.last_seq) == 1:
            ((_, seq),) = self.last_seq.items()
            return f"lagging, reconnect with after={seq}"
        return "lagging, reconnect with after=<last seq received>"


class Hub:
    """Routes published frames to the subscribers of their run and to followers of all runs."""

    def __init__(self) -> None:
        self._by_run: dict[str, set[Subscriber]] = {}
        self._all: set[Subscriber] = set()
        self._every: set[Subscriber] = set()
        self.stats = HubStats()
        # Frames published since the last write-out, per run, in order.
        self._gathered: dict[str, list[Delivery]] = {}
        self._scheduled: asyncio.Handle | None = None
        self._last_write_out = 0.0  # loop time
        self._window = 0.0

    @property
    def subscriber_count(self) -> int:
        """Subscribers currently attached."""
        return len(self._every)

    def attach(self, sub: Subscriber) -> None:
        """Register a client (before it subscribes to anything)."""
        self._every.add(sub)

    def subscribe(
        self,
        sub: Subscriber,
        run_id: str,
        snapshot: Iterable[Delivery],
        after: int = 0,
        *,
        stored: Replay | None = None,
    ) -> None:
        """Queue ``stored`` then ``snapshot``, and register for live frames of ``run_id`` after
        ``after``."""
        self.hand_out()  # what is gathered is in the snapshot already: not for this one
        self._every.add(sub)
        sub.forget(run_id)  # a repeated subscribe replaces what is still queued for the run
        sub.replay(snapshot, stored=stored)
        sub.floor[run_id] = after
        sub.runs.add(run_id)
        self._by_run.setdefault(run_id, set()).add(sub)

    def follow_all(self, sub: Subscriber, snapshot: Iterable[Delivery], after: int = 0) -> None:
        """Queue ``snapshot`` and register for live frames of every run, new ones too."""
        self.hand_out()
        self._every.add(sub)
        snapshot = list(snapshot)
        for run_id in {d.run_id for d in snapshot}:
            sub.forget(run_id)  # a repeated follow replaces what is still queued for those runs
        sub.replay(snapshot)
        sub.floor_all = after
        sub.follows_all = True
        self._all.add(sub)

    def unsubscribe(self, sub: Subscriber, run_id: str) -> None:
        """Stop live frames of ``run_id`` (``"*"`` stops following all runs)."""
        if run_id == "*":
            sub.follows_all = False
            self._all.discard(sub)
            return
        sub.runs.discard(run_id)
        sub.floor.pop(run_id, None)
        subs = self._by_run.get(run_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._by_run[run_id]

    def detach(self, sub: Subscriber) -> None:
        """Forget a client entirely (its connection ended)."""
        for run_id in list(sub.runs):
            self.unsubscribe(sub, run_id)
        self.unsubscribe(sub, "*")
        self._every.discard(sub)

    def publish(self, run_id: str, seq: int, data: bytes, *, last: bool = False) -> None:
        """Hand one encoded frame to every interested subscriber; never waits."""
        self.publish_batch(run_id, [Delivery(run_id, seq, data, last)])

    def publish_batch(self, run_id: str, batch: Sequence[Delivery]) -> None:
        """Gather the frames of one stdout chunk for the next write-out; never waits."""
        if not batch:
            return
        self.stats.frames_published += len(batch)
        gathered = self._gathered.get(run_id)
        if gathered is None:
            self._gathered[run_id] = list(batch)
        else:
            gathered.extend(batch)
        if self._scheduled is None:
            loop = asyncio.get_running_loop()
            due = self._last_write_out + self._window
            if due > loop.time():
                self._scheduled = loop.call_at(due, self._write_out)
            else:
                self._scheduled = loop.call_soon(self._write_out)

    def _write_out(self) -> None:
        self._scheduled = None
        self._last_write_out = asyncio.get_running_loop().time()
        written = self.hand_out()
        if written < WINDOW_MIN_SUBSCRIBERS:
            self._window = 0.0
        else:
            self._window = min(WINDOW_MAX, written * WINDOW_PER_SUBSCRIBER)

    def hand_out(self) -> int:
        """Hand everything gathered to the subscribers now; returns the subscribers reached.

        Each run's gathered frames become one :class:`Batch`, taken by every subscriber as one
        item and encoded for the wire once. A subscriber lags when its queue is still full as
        the next batch arrives: one batch can hold hundreds of frames, which no client could
        drain in between.
        """
        if not self._gathered:
            return 0
        gathered, self._gathered = self._gathered, {}
        reached = 0
        for run_id, deliveries in gathered.items():
            reached += self._hand_out(Batch(run_id, deliveries))
        return reached

    def _hand_out(self, batch: Batch) -> int:
        run_id = batch.run_id
        targets = list(self._by_run.get(run_id, ()))
        if self._all:
            targets.extend(sub for sub in self._all if run_id not in sub.runs)
        taken = 0
        for sub in targets:
            if sub.closed:
                continue
            if sub.backlog >= sub.max_queue:
                self._drop(sub)
                continue
            try:
                taken += sub.push(batch)
            except Exception:  # one broken connection must not stop the others' writes
                sub.close(CLOSE_INTERNAL_ERROR, "write failed")
                self.detach(sub)
        self.stats.frames_queued += taken
        return len(targets)

    def _drop(self, sub: Subscriber) -> None:
        self.stats.subscribers_dropped += 1
        sub.close(CLOSE_LAGGING, sub.lag_reason())
        self.detach(sub)

    def close_all(self, code: int, reason: str) -> None:
        """Hand out what is gathered, then close every subscriber (shutdown: GOING_AWAY)."""
        self.hand_out()
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        for sub in list(self._every):
            sub.close(code, reason)
            self.detach(sub)
