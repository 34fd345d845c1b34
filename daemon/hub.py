"""Fan-out of encoded frames to subscribers (WebSocket and NDJSON clients).

The run publishes the frames of each stdout chunk once, already encoded, as one :class:`Batch`;
the hub hands that same object to every subscriber of the run, and the batch builds its
WebSocket bytes (and NDJSON bytes) once, for all of them. The publisher never awaits a client:
each subscriber owns a bounded queue and its own writer task (see ``daemon/streams.py``). A
subscriber whose queue is full is closed with :data:`CLOSE_LAGGING` and reconnects with
``after=<last seq it got>``; the run and the other subscribers never wait for it.

Writing: a subscriber with a :class:`Sink` (a WebSocket whose transport takes bytes now) is
written by the hub itself, once per event-loop tick for everything published in that tick, with
one ``transport.write`` — no task wake-up and no syscall per frame. Only a client whose
transport is paused (it reads slower than we write) or one without a sink is left to its own
writer task, which takes everything queued at once and waits for that client alone.

Snapshot + live is atomic because both happen in one synchronous step: the caller reads the
replay from the run's in-memory frame log and registers the subscriber without awaiting in
between, and the run appends to that log and publishes in one synchronous step as well.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final, NamedTuple, Protocol

CLOSE_LAGGING: Final = 4008
CLOSE_GOING_AWAY: Final = 1001
CLOSE_INTERNAL_ERROR: Final = 1011

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


class Delivery(NamedTuple):
    """One encoded frame of one run (the run's log and replays hold these)."""

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


# What a subscriber's queue holds: live batches, replayed frames, and our own control messages.
Item = Batch | Delivery | bytes


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
        self.flush_pending = False  # in the hub's list of subscribers to write out this tick
        self._queue: deque[Item] = deque()
        self._live = 0  # live frames queued (replay and control messages do not count)
        self._wake = asyncio.Event()

    @property
    def backlog(self) -> int:
        """Live frames queued and not yet taken by the writer."""
        return self._live

    def offer(self, batch: Batch) -> bool:
        """Queue live frames without waiting (the hub decides when a subscriber lags).

        True when something was queued. With a sink, the hub writes it out at the end of the
        tick; without one, the writer task is woken now.
        """
        if self.closed:
            return False
        floor = self.floor.get(batch.run_id, self.floor_all)
        if batch.first_seq <= floor:  # the client said it has (some of) these already
            rest = batch.after(floor)
            if rest is None:
                return False
            batch = rest
        self._queue.append(batch)
        self._live += len(batch.deliveries)
        if self.sink is None:
            self._wake.set()
        return True

    def replay(self, deliveries: Iterable[Delivery]) -> None:
        """Queue a snapshot; not bounded by ``max_queue`` (it is already in memory)."""
        if self.closed:
            return
        self._queue.extend(deliveries)
        self._wake.set()

    def control(self, data: bytes) -> None:
        """Queue a message of our own protocol (errors, acknowledgements) for the writer."""
        if self.closed:
            return
        self._queue.append(data)
        self._wake.set()

    def close(self, code: int, reason: str) -> None:
        """Stop delivering; the writer sees ``closed`` and ends the connection with ``code``."""
        if self.closed:
            return
        self.closed = True
        self.close_code = code
        self.close_reason = reason
        self._queue.clear()
        self._live = 0
        self._wake.set()
        if self.on_close is not None:
            self.on_close()

    async def wait(self) -> bool:
        """Wait while nothing is queued; False once closed."""
        while not self._queue and not self.closed:
            self._wake.clear()
            await self._wake.wait()
        return not self.closed

    async def get(self) -> list[Item]:
        """Everything queued so far, waiting while empty; ``[]`` once closed."""
        await self.wait()
        return self.take()

    def take(self) -> list[Item]:
        """Everything queued so far, without waiting (``[]`` when empty or closed)."""
        if self.closed:
            return []
        items = list(self._queue)
        self._queue.clear()
        self._live = 0
        return items

    def flush(self) -> None:
        """Write out what is queued through the sink if it is ready, else wake the writer."""
        if not self._queue or self.closed:
            return
        sink = self.sink
        if sink is not None and sink.ready():
            self.write_to(sink)
        else:
            self._wake.set()

    def write_to(self, sink: Sink) -> None:
        """Take everything queued and write it with one call (the caller checked ``ready``)."""
        queue = self._queue
        if len(queue) == 1:  # the usual case: this tick's one batch
            item = queue.pop()
            self._live = 0
            sink.write([item])
            if not isinstance(item, bytes):
                self.last_seq[item.run_id] = item.seq
            return
        items = list(queue)
        queue.clear()
        self._live = 0
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
        self._pending: list[Subscriber] = []  # offered something this tick, to write out
        self._flush_scheduled = False

    @property
    def subscriber_count(self) -> int:
        """Subscribers currently attached."""
        return len(self._every)

    def attach(self, sub: Subscriber) -> None:
        """Register a client (before it subscribes to anything)."""
        self._every.add(sub)

    def subscribe(
        self, sub: Subscriber, run_id: str, snapshot: Iterable[Delivery], after: int = 0
    ) -> None:
        """Queue ``snapshot`` and register for live frames of ``run_id`` after ``after``."""
        self._every.add(sub)
        sub.replay(snapshot)
        sub.floor[run_id] = after
        sub.runs.add(run_id)
        self._by_run.setdefault(run_id, set()).add(sub)

    def follow_all(self, sub: Subscriber, snapshot: Iterable[Delivery], after: int = 0) -> None:
        """Queue ``snapshot`` and register for live frames of every run, new ones too."""
        self._every.add(sub)
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
        """Hand the frames of one stdout chunk to every interested subscriber; never waits.

        The frames become one :class:`Batch`, queued as one item by every subscriber and
        encoded for the wire once. A subscriber lags when its queue is still full as the next
        batch arrives: one chunk can yield hundreds of frames at once, which no client could
        drain in between.
        """
        if not batch:
            return
        shared = Batch(run_id, batch)
        n = len(batch)
        self.stats.frames_published += n
        targets = list(self._by_run.get(run_id, ()))
        if self._all:
            targets.extend(sub for sub in self._all if run_id not in sub.runs)
        pending = self._pending
        for sub in targets:
            if sub.closed:
                continue
            if sub.backlog >= sub.max_queue:
                self._drop(sub)
                continue
            if sub.offer(shared):
                self.stats.frames_queued += n
                if sub.sink is not None and not sub.flush_pending:
                    sub.flush_pending = True
                    pending.append(sub)
        if pending and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Write out every subscriber that was offered frames this tick (one write each)."""
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        for sub in pending:
            sub.flush_pending = False
            try:
                sub.flush()
            except Exception:  # one broken connection must not stop the others' writes
                sub.close(CLOSE_INTERNAL_ERROR, "write failed")
                self.detach(sub)

    def _drop(self, sub: Subscriber) -> None:
        self.stats.subscribers_dropped += 1
        sub.close(CLOSE_LAGGING, sub.lag_reason())
        self.detach(sub)

    def close_all(self, code: int, reason: str) -> None:
        """Close every subscriber (shutdown: GOING_AWAY)."""
        for sub in list(self._every):
            sub.close(code, reason)
            self.detach(sub)
