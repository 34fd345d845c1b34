"""Fan-out of encoded frames to subscribers (WebSocket and NDJSON clients).

The run publishes each frame once, already encoded; the hub hands the same bytes to every
subscriber of that run. The publisher never awaits a client: each subscriber owns a bounded
queue and its own writer task (see ``daemon/app.py``). A subscriber whose queue is full is
closed with :data:`CLOSE_LAGGING` and reconnects with ``after=<last seq it got>``; the run and
the other subscribers never wait for it.

Snapshot + live is atomic because both happen in one synchronous step: the caller reads the
replay from the run's in-memory frame log and registers the subscriber without awaiting in
between, and the run appends to that log and publishes in one synchronous step as well.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple

CLOSE_LAGGING: Final = 4008
CLOSE_GOING_AWAY: Final = 1001


class Delivery(NamedTuple):
    """One encoded frame of one run, as queued for a subscriber."""

    run_id: str
    seq: int
    data: bytes
    last: bool = False  # the run_result frame: a per-run stream may end after it


class HubStats:
    """Counters the hub keeps for ``/metrics``."""

    def __init__(self) -> None:
        self.frames_published = 0
        self.frames_queued = 0
        self.subscribers_dropped = 0


class Subscriber:
    """One client's queue. The hub fills it; the client's own writer task drains it."""

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
        self._queue: deque[Delivery | bytes] = deque()
        self._live = 0  # live frames queued (replay and control messages do not count)
        self._wake = asyncio.Event()

    @property
    def backlog(self) -> int:
        """Live frames queued and not yet taken by the writer."""
        return self._live

    def offer(self, delivery: Delivery) -> None:
        """Queue a live frame without waiting (the hub decides when a subscriber lags)."""
        if self.closed:
            return
        if delivery.seq <= self.floor.get(delivery.run_id, self.floor_all):
            return  # the client said it has this one already
        self._queue.append(delivery)
        self._live += 1
        self._wake.set()

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

    async def get(self) -> list[Delivery | bytes]:
        """Everything queued so far, waiting while empty; ``[]`` once closed."""
        while not self._queue and not self.closed:
            self._wake.clear()
            await self._wake.wait()
        return self.take()

    def take(self) -> list[Delivery | bytes]:
        """Everything queued so far, without waiting (``[]`` when empty or closed)."""
        if self.closed:
            return []
        items = list(self._queue)
        self._queue.clear()
        self._live = 0
        return items

    def sent(self, delivery: Delivery) -> None:
        """The writer delivered ``delivery``: a lagging close names the last one sent."""
        self.last_seq[delivery.run_id] = delivery.seq

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

    def publish_batch(self, run_id: str, batch: list[Delivery]) -> None:
        """Hand the frames of one stdout chunk to every interested subscriber; never waits.

        A subscriber lags when its queue is still full as the next batch arrives: one chunk
        can yield hundreds of frames at once, which no client could drain in between.
        """
        if not batch:
            return
        self.stats.frames_published += len(batch)
        targets = list(self._by_run.get(run_id, ()))
        targets.extend(sub for sub in self._all if run_id not in sub.runs)
        for sub in targets:
            if sub.closed:
                continue
            if sub.backlog >= sub.max_queue:
                self._drop(sub)
                continue
            for delivery in batch:
                sub.offer(delivery)
            self.stats.frames_queued += len(batch)

    def _drop(self, sub: Subscriber) -> None:
        self.stats.subscribers_dropped += 1
        sub.close(CLOSE_LAGGING, sub.lag_reason())
        self.detach(sub)

    def close_all(self, code: int, reason: str) -> None:
        """Close every subscriber (shutdown: GOING_AWAY)."""
        for sub in list(self._every):
            sub.close(code, reason)
            self.detach(sub)
