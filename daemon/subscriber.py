"""One client's side of the hub: a bounded queue, paged replays, and direct writes to a sink.

The hub (``daemon/hub.py``, whose docstring is the theory of operation) fills a subscriber; a
ready :class:`Sink` is written by the hub itself, anything else waits here for the client's own
writer task. Bounds: live frames (``max_queue``; the hub closes a subscriber that lags behind
them), control messages (as many again), and replays, which a writer takes a page at a time.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from codelegate.daemon.deliveries import (
    REPLAY_PAGE,
    REPLAY_PAGE_BYTES,
    Batch,
    Control,
    Delivery,
    Item,
    Queued,
    Replay,
)

CLOSE_LAGGING: Final = 4008
CLOSE_GOING_AWAY: Final = 1001
CLOSE_INTERNAL_ERROR: Final = 1011


class Sink(Protocol):
    """A client connection the hub may write to directly (see daemon/hub.py)."""

    def ready(self) -> bool:
        """True when bytes written now go out without waiting (open and not paused)."""

    def write(self, items: list[Item]) -> None:
        """Write ``items`` at once, without waiting."""

    def write_batch(self, batch: Batch) -> bool:
        """Write ``batch`` if it goes out without waiting (as ``ready``); False: nothing written."""


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

    def _counted_out(self, item: Queued) -> None:
        self._live -= item.live
        self._replayed -= item.replayed
        self._controls -= item.controls

    def _emptied(self) -> None:
        self._live = self._replayed = self._controls = 0

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
            self._live += batch.live
            self._wake.set()
        return batch.live

    def replay(self, deliveries: Iterable[Delivery], *, stored: Replay | None = None) -> None:
        """Queue a replay: ``stored`` frames (read later, page by page), then ``deliveries``.

        The deliveries are references to frames already in memory; writers take them a page at
        a time (see daemon/hub.py).
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
            if item.run_id != run_id:
                kept.append(item)
                continue
            self._counted_out(item)
            if isinstance(item, Replay):
                item.cancelled = True  # a page being read for it is dropped too
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
        self._queue.append(Control(data))
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
        self._emptied()
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
        if not self._replayed or (
            limit == sys.maxsize and not any(isinstance(item, Replay) for item in queue)
        ):  # live batches and control messages only (bounded already), or no limit asked
            items = list(queue)  # type: ignore[arg-type]  # no Replay among them
            queue.clear()
            self._emptied()
            return items
        items = []
        count, room = 0, REPLAY_PAGE_BYTES
        while queue and count < limit and room > 0:
            item = queue[0]
            if isinstance(item, Replay):
                break
            queue.popleft()
            items.append(item)
            self._counted_out(item)
            count += item.replayed
            room -= item.replayed_bytes
        return items

    def write_to(self, sink: Sink, limit: int = sys.maxsize) -> None:
        """Take what is queued (as :meth:`take`) and write it with one call (the caller checked
        ``ready``)."""
        queue = self._queue
        if len(queue) == 1:  # the usual case: this tick's one batch
            head = queue[0]
            if not isinstance(head, Replay):
                queue.pop()
                self._emptied()
                sink.write([head])
                self.sent(head)
                return
        items = self.take(limit)
        if not items:
            return
        sink.write(items)
        for item in items:
            self.sent(item)

    def sent(self, item: Item) -> None:
        """The writer delivered ``item``: a lagging close names the last frame sent."""
        if item.run_id is not None:
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
