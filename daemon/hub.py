"""Fan-out of encoded frames to subscribers (WebSocket and NDJSON clients).

The run publishes the frames of each stdout chunk, already encoded; the hub gathers what a run
publishes until its next write-out and hands it to every subscriber of the run as one shared
:class:`~codelegate.daemon.deliveries.Batch`, which builds its WebSocket bytes (and NDJSON
bytes) once, for all of them. The publisher never awaits a client: each subscriber
(``daemon/subscriber.py``) owns a bounded queue and its own writer task (see
``daemon/serving/streams.py``). A subscriber whose queue is full is closed with
``CLOSE_LAGGING`` and reconnects with ``after=<last seq it got>``; the run and the other
subscribers never wait for it.

Writing out: a subscriber with a ``Sink`` (a WebSocket whose transport takes bytes now) and
nothing queued is written by the hub itself, one ``transport.write`` per write-out, with no
task wake-up; anything else is queued for the subscriber's own writer task, which takes
everything queued at once and waits for that client alone.

When: at the end of the loop tick in which frames were published, so a quiet run's frames go
out at once. When many subscribers follow a run, the next write-out waits until a short window
has passed since the last one (:data:`WINDOW_PER_SUBSCRIBER` for each subscriber the last one
reached, at most :data:`WINDOW_MAX`): a run printing thousands of lines a second then costs each
client one write per window rather than one per line, which is what keeps latency flat on a
busy machine (bench/RESULTS.md).

Snapshot + live is atomic: a run's frames in memory have one owner, its
:class:`~codelegate.daemon.runlog.RunLog`, which appends, trims and publishes them in one
synchronous step; clients come in through one door, ``daemon/subscriptions.py``, which reads
the replay from that log and joins the subscriber here without awaiting in between; and the
hub hands out whatever it has gathered before it joins a new subscriber (those frames are in
the snapshot already).

Replay is paced by the client, under the same bound as live frames: a writer takes at most one
page (``REPLAY_PAGE`` frames, about ``REPLAY_PAGE_BYTES``) at a time and writes it only when
the client's transport takes bytes again, so a client that stops reading holds one page and the
transport's buffer, never a whole run. Frames in memory are queued as references; older frames
are a ``Replay``, read from the store one page at a time as the queue drains. A new join for a
run first drops whatever is still queued for that run (``Subscriber.forget``): repeating
``subscribe`` replaces a replay, it never stacks them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Final

from codelegate.daemon.deliveries import Batch, Delivery, Replay
from codelegate.daemon.subscriber import CLOSE_INTERNAL_ERROR, CLOSE_LAGGING, Subscriber

# Write-out pacing (see the module docstring). Below WINDOW_MIN_SUBSCRIBERS there is no window.
WINDOW_MIN_SUBSCRIBERS: Final = 16
WINDOW_PER_SUBSCRIBER: Final = 20e-6
WINDOW_MAX: Final = 0.002


class HubStats:
    """Counters the hub keeps for ``/metrics``."""

    def __init__(self) -> None:
        self.frames_published = 0
        self.frames_queued = 0
        self.subscribers_dropped = 0


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
        """Register a client (before it joins any run)."""
        self._every.add(sub)

    def join(
        self,
        sub: Subscriber,
        run_id: str,
        snapshot: Iterable[Delivery],
        after: int = 0,
        *,
        stored: Replay | None = None,
    ) -> None:
        """Queue ``stored`` then ``snapshot``, and register for live frames of ``run_id`` after
        ``after`` (the caller read ``snapshot`` from the run's log without awaiting since)."""
        self.hand_out()  # what is gathered is in the snapshot already: not for this one
        self._every.add(sub)
        sub.forget(run_id)  # a repeated join replaces what is still queued for the run
        sub.replay(snapshot, stored=stored)
        sub.floor[run_id] = after
        sub.runs.add(run_id)
        self._by_run.setdefault(run_id, set()).add(sub)

    def join_all(self, sub: Subscriber, snapshot: Iterable[Delivery], after: int = 0) -> None:
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

    def leave(self, sub: Subscriber, run_id: str) -> None:
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
            self.leave(sub, run_id)
        self.leave(sub, "*")
        self._every.discard(sub)

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
