"""Frames on Redis Streams: one backend follows a fleet of daemons (DESIGN "Beyond one host").

Keys. Every frame of a run goes to the stream ``<prefix>:run:<run_id>`` under the entry id
``<seq>-0`` with one field, ``frame`` = the frame's JSON (the bytes of the NDJSON replay). So
``XREAD … STREAMS <key> <after>-0`` is exactly ``after=``. The XADDs run inside Redis, in
``APPEND_SCRIPT`` (``daemon/fanout_redis.py``), which adds a frame only if it follows on from
the stream's top: the entries are gapless by construction (but where a capped run's store kept
nothing and Redis missed it live), and a frame published twice is skipped (publishing is
idempotent). A run's first and last frames, once added, also add an
entry to ``<prefix>:runs``, the fleet's index, trimmed to about ``maxlen_runs`` runs, each entry
once as well (``daemon/fanout_index.py``).

Theory of operation. The :class:`Publisher` follows every run through the hub like a subscriber
whose sink always takes what it is handed (so the hub never waits for it nor drops it): each
write-out appends the frames, already encoded, to one bounded backlog, in a few list operations
and without awaiting. One worker task drains the backlog in pipelines of up to :data:`CHUNK`
frames (one script call per run) over redis-py's asyncio client. A run never waits for Redis,
and Redis never holds up a subscriber: the only cost on the hot path is that append.

The store is the source of truth. When the backlog is full, when Redis is stopped, slow (a
socket timeout) or gone, or when a run's frames do not follow on from what was queued, the run
is marked *behind* and its live frames are no longer queued. Once Redis answers again, the
worker catches each behind run up: it asks Redis for the stream's last id (``XREVRANGE … COUNT
1``) and publishes what follows out of the store, a page at a time and each frame under its
own seq (``RunStore.frames_page`` also sees frames not yet written), until the store has
nothing more; in that same step, with no await in between,
the run's live frames are queued again. Nothing is lost, and a frame sent twice (a pipeline cut
short, a frame both read from the store and handed out live) is skipped by Redis, not doubled.
At start-up the worker compares the newest ``maxlen_runs`` runs of the store with their streams
and catches up those that are behind (a daemon that stopped before Redis had everything). At
shutdown it catches up what it can within a short grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from codelegate.daemon.deliveries import Batch, Delivery, Item, frames
from codelegate.daemon.fanout_index import FleetIndex, IndexEntry, ends_run
from codelegate.daemon.fanout_keys import seq_of, stream_key
from codelegate.daemon.fanout_redis import APPEND_SCRIPT, APPEND_SHA, append_blob, connect
from codelegate.daemon.hub import Hub
from codelegate.daemon.store.store import RunStore, StoreError
from codelegate.daemon.subscriber import Subscriber
from codelegate.daemon.tasks import spawn
from codelegate.policy.config import FanoutConfig, fanout_host_id, redacted_url

_log = structlog.get_logger("codelegate.fanout")

BACKLOG_MAX: Final = 200_000  # frames queued for Redis; beyond it runs are filled from the store
CHUNK: Final = 256  # frames per pipeline: packing them holds the event loop (~5 us a frame)
CATCH_UP_PAGE: Final = 16 * CHUNK  # frames read from the store at once when catching up
GATHER_S: Final = 0.01  # frames wait this long for more to share their pipeline
RETRY_MIN_S: Final = 0.05  # backoff between attempts while Redis is unreachable
RETRY_MAX_S: Final = 2.0
CLOSE_GRACE_S: Final = 5.0
STOP_S: Final = 2.0  # then how long stopping the worker and disconnecting may take


class FanoutStats:
    """Counters for ``/metrics``."""

    def __init__(self) -> None:
        self.published = 0  # frame entries Redis added
        self.duplicates = 0  # frames sent again and skipped by Redis as already there
        self.failed = 0  # frame entries not published (Redis gone or erring): filled in later
        self.deferred = 0  # frames not queued (backlog full or run behind): sent from the store
        self.index_entries = 0
        self.inflight = 0
        self.backlog = 0

    @property
    def pending(self) -> int:
        """Frames queued or being sent."""
        return self.backlog + self.inflight


class _Lost(Exception):
    """Redis answered a script call with an error (NOSCRIPT after a restart, out of memory…)."""


class Publisher:
    """Publishes every frame the hub hands out to Redis Streams; see the module docstring."""

    def __init__(
        self,
        client: Redis,
        store: RunStore,
        *,
        prefix: str,
        host_id: str,
        maxlen_runs: int,
        max_backlog: int | None = None,
    ) -> None:
        self._client = client
        self._store = store
        self.prefix = prefix
        self._maxlen_runs = maxlen_runs
        self._max_backlog = BACKLOG_MAX if max_backlog is None else max_backlog
        self._index = FleetIndex(prefix, host_id, maxlen_runs)  # the host_id's owner
        self.stats = FanoutStats()
        self.connected = False
        # The hub's view of us: a follower of every run whose sink takes everything at once.
        self.subscriber = Subscriber(max_queue=1 << 62, name="fanout")
        self.subscriber.sink = self
        self._backlog: deque[Delivery] = deque()
        # Per run: the highest seq queued or published (live frames must follow on from it).
        self._queued: dict[str, int] = {}
        # Runs whose stream may lack frames the store has (insertion-ordered set).
        self._behind: dict[str, None] = {}
        self._scanned = False
        self._script_loaded = False
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def runs_behind(self) -> int:
        """Runs whose stream is being (or waits to be) filled from the store."""
        return len(self._behind)

    # -- the hub's side (never awaits) -----------------------------------------------------

    def ready(self) -> bool:
        """Always: taking frames is an append to the backlog."""
        return True

    def write(self, items: list[Item]) -> None:
        """Frames the hub queued for us (not expected: we take every batch at once)."""
        self._take(frames(items))

    def write_batch(self, batch: Batch) -> bool:
        """Take one write-out's frames of a run."""
        self._take(batch.frames)
        return True

    def _take(self, deliveries: Iterable[Delivery]) -> None:
        backlog, queued, behind = self._backlog, self._queued, self._behind
        taken = False
        for d in deliveries:
            run_id = d.run_id
            if run_id in behind:
                self.stats.deferred += 1
                continue
            last = queued.get(run_id, 0)
            if d.seq <= last:
                continue  # queued already (handed out again after a catch-up read it)
            if d.seq != last + 1 or len(backlog) >= self._max_backlog:
                self._mark_behind(run_id)
                self.stats.deferred += 1
                continue
            backlog.append(d)
            queued[run_id] = d.seq
            taken = True
        if taken:
            self.stats.backlog = len(backlog)
            self._idle.clear()
            self._wake.set()

    def _mark_behind(self, run_id: str) -> None:
        self._behind[run_id] = None
        self._idle.clear()
        self._wake.set()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, hub: Hub) -> None:
        """Follow every run through ``hub`` and start the worker."""
        hub.join_all(self.subscriber, (), 0)
        self._task = spawn(self._work(), name="fanout")

    async def settled(self) -> None:
        """Wait until Redis holds every frame seen so far (for tests and shutdown)."""
        await self._idle.wait()

    async def close(self, grace_s: float | None = None) -> None:
        """Publish what can be published within ``grace_s`` (default :data:`CLOSE_GRACE_S`),
        then stop and disconnect.

        The hub closed our subscriber before the runs were wound down, so each run not yet
        complete in Redis is caught up from the store (when Redis answers at all).
        """
        grace = CLOSE_GRACE_S if grace_s is None else grace_s
        for run_id in list(self._queued):
            self._mark_behind(run_id)
        if self.connected and grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.settled()
        # Bounded: a stopped Redis must not hold up the daemon's exit.
        with contextlib.suppress(TimeoutError, RedisError, OSError):
            async with asyncio.timeout(STOP_S):
                if self._task is not None:
                    self._task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._task
                await self._client.aclose()

    # -- the worker ------------------------------------------------------------------------

    async def _work(self) -> None:
        delay = RETRY_MIN_S
        while True:
            try:
                if not self._scanned:
                    await self._scan()
                    self._scanned = True
                elif self._backlog or self._index.pending:
                    if len(self._backlog) < CHUNK:
                        # Gather a little first: each pipeline costs the event loop ~100 us
                        # of redis-py whatever it holds (bench/RESULTS.md).
                        await asyncio.sleep(GATHER_S)
                    await self._send_backlog()
                elif self._behind:
                    await self._catch_up(next(iter(self._behind)))
                else:
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
            except (RedisError, OSError, _Lost) as exc:
                if self.connected or delay == RETRY_MIN_S:
                    _log.warning("fanout_unavailable", error=str(exc)[:200])
                self.connected = False
                self._lost()
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)
                continue
            except StoreError as exc:
                _log.error("fanout_store_read_failed", error=str(exc))
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)
                continue
            except Exception as exc:  # a bug here must not end publishing for good
                _log.exception("fanout_failed", error=repr(exc))
                self._lost()
                await asyncio.sleep(RETRY_MAX_S)
                continue
            if not self.connected:
                self.connected = True
                _log.info("fanout_connected")
            delay = RETRY_MIN_S

    def _lost(self) -> None:
        """Redis is unreachable: what is queued is left to the store, its runs marked behind."""
        for d in self._backlog:
            self._behind[d.run_id] = None
        self.stats.failed += len(self._backlog)
        self._backlog.clear()
        self._index.lost()
        self._script_loaded = False  # Redis may come back another (restarted) one
        self.stats.backlog = 0

    async def _send_backlog(self) -> None:
        backlog = self._backlog
        n = min(CHUNK, len(backlog))
        chunk = [backlog.popleft() for _ in range(n)]
        self.stats.backlog = len(backlog)
        try:
            await self._send(chunk)
        except (RedisError, OSError):
            for d in chunk:
                self._behind[d.run_id] = None
            raise

    async def _send(self, chunk: Sequence[Delivery], stored_after: int | None = None) -> None:
        """Append ``chunk`` (one script call per run) and the index entries owed, in one
        pipeline; account for each answer. ``stored_after``: ``chunk`` is one run's frames the
        store gave for the seqs after that one (see :func:`append_blob`).

        A run's index entries go out only once Redis has added its first (or last) frame, in
        the next pipeline: a frame sent twice is skipped, and so adds no second entry.
        """
        self.stats.inflight = len(chunk)
        index = self._index
        owed: list[IndexEntry] = []
        try:
            await index.resolve_unsure(self._client)
            if not self._script_loaded:
                await self._client.script_load(APPEND_SCRIPT)
                self._script_loaded = True
            groups: dict[str, list[Delivery]] = {}
            for d in chunk:
                groups.setdefault(d.run_id, []).append(d)
            pipe = self._client.pipeline(transaction=False)
            owed = index.take()
            for entry in owed:
                pipe.execute_command(*entry.args)
            prefix = self.prefix
            for run_id, group in groups.items():
                blob = append_blob(group, stored_after)
                pipe.execute_command("EVALSHA", APPEND_SHA, 1, stream_key(prefix, run_id), blob)
            answers = await pipe.execute(raise_on_error=False)
        except BaseException:
            self.stats.failed += len(chunk)
            index.failed(chunk, owed)
            raise
        finally:
            self.stats.inflight = 0
        self.stats.index_entries += index.answered(owed, answers)
        lost = None
        for (run_id, group), answer in zip(groups.items(), answers[len(owed) :], strict=True):
            if isinstance(answer, Exception):
                if "NOSCRIPT" in str(answer):
                    self._script_loaded = False  # Redis restarted (its script cache is empty)
                self.stats.failed += len(group)
                self._behind[run_id] = None
                lost = answer
                continue
            before, top = int(answer[0]), int(answer[1])
            for d in group:
                if before < d.seq <= top:
                    self.stats.published += 1
                    index.frame_added(d)
                elif d.seq <= before:
                    self.stats.duplicates += 1
                if d.last and d.seq <= top:
                    self._forget(run_id, d.seq)
            if group[-1].seq > top:
                # The stream lacks frames before these (Redis came back without them): the
                # script refused to leave a gap, the store fills it.
                self.stats.deferred += group[-1].seq - top
                self._behind[run_id] = None
        if lost is not None:
            raise _Lost(str(lost))

    def _forget(self, run_id: str, seq: int) -> None:
        """The run's last frame is in Redis: nothing more will come for it."""
        if self._queued.get(run_id) == seq and run_id not in self._behind:
            del self._queued[run_id]

    async def _top(self, run_id: str) -> tuple[int, bool]:
        """The last seq Redis holds for the run, and whether it is the run's last frame."""
        entries = await self._client.xrevrange(stream_key(self.prefix, run_id), "+", "-", count=1)
        if not entries:
            return 0, False
        entry_id, fields = entries[0]
        frame = (fields or {}).get(b"frame") or b"{}"
        return seq_of(entry_id or b"0"), ends_run(frame)

    async def _catch_up(self, run_id: str) -> None:
        """Fill the run's stream from the store, from the last id Redis holds."""
        top, ended = await self._top(run_id)
        while True:
            # A page at a time: a run far behind (a flood while Redis was away) is not read
            # into memory whole.
            stored = await self._store.frames_page(run_id, top, CATCH_UP_PAGE)
            if not stored:
                # No await since the store answered: from here on live frames follow on.
                del self._behind[run_id]
                if ended:
                    self._queued.pop(run_id, None)
                else:
                    self._queued[run_id] = top
                return
            for start in range(0, len(stored), CHUNK):
                # Each frame with its own seq: a capped run's stored seqs jump where it kept
                # nothing ([limits] max_stored_frames).
                chunk = [Delivery(run_id, seq, data) for seq, data in stored[start : start + CHUNK]]
                final = chunk[-1]
                ended = ends_run(final.data)
                if ended:
                    chunk[-1] = Delivery(run_id, final.seq, final.data, True)
                await self._send(chunk, stored_after=top)
                top = final.seq

    async def _scan(self) -> None:
        """At start-up: mark behind the newest runs of the store whose stream lacks frames, and
        owe the index entries a previous daemon did not get to write.

        A daemon that stops between a run's first (or last) frame and its index entry leaves
        the stream without that entry; the index (at most about ``2 * maxlen_runs`` entries) is
        read once to find out. Runs older than its oldest entry were trimmed from it, not lost;
        an empty (or deleted) index gets the entries of the runs whose streams are there.
        """
        # Their ids and progress only: maxlen_runs final results would be up to gigabytes.
        records = await self._store.list_runs(self._maxlen_runs, results=False)
        index = self._index
        have, oldest_ms = await index.read(self._client)
        starts: list[str] = []  # runs whose stream has frame 1 but the index no start
        for start in range(0, len(records), CHUNK):
            page = records[start : start + CHUNK]
            pipe = self._client.pipeline(transaction=False)
            for rec in page:
                pipe.xrevrange(stream_key(self.prefix, rec.run_id), "+", "-", count=1)
            answers = await pipe.execute()
            for rec, entries in zip(page, answers, strict=True):
                top = seq_of(entries[0][0]) if entries else 0
                if rec.last_seq > top:
                    self._behind[rec.run_id] = None
                if top == 0 or rec.created_at * 1000 < oldest_ms:
                    continue  # frame 1 (and its entry) will come with the catch-up, or trimmed
                if (rec.run_id, "running") not in have:
                    starts.append(rec.run_id)
                frame = entries[0][1].get(b"frame", b"")
                if top == rec.last_seq and ends_run(frame):
                    ends = index.entries(Delivery(rec.run_id, top, frame, True))
                    index.owe(
                        e
                        for e in ends
                        if e.status != "running" and (e.run_id, e.status) not in have
                    )
        for start in range(0, len(starts), CHUNK):
            batch = starts[start : start + CHUNK]
            pipe = self._client.pipeline(transaction=False)
            for run_id in batch:
                pipe.xrange(stream_key(self.prefix, run_id), "-", "+", count=1)
            for run_id, entries in zip(batch, await pipe.execute(), strict=True):
                if entries:
                    first = Delivery(run_id, 1, entries[0][1].get(b"frame", b"{}"))
                    index.owe(index.entries(first))
        if self._behind or index.owed:
            _log.info("fanout_catching_up", runs=len(self._behind), index_entries=len(index.owed))


def start_publisher(fanout: FanoutConfig | None, store: RunStore, hub: Hub) -> Publisher | None:
    """Start publishing when ``[fanout]`` is configured (the app's lifecycle calls this)."""
    if fanout is None:
        return None
    host_id = fanout_host_id(fanout, socket.gethostname())
    publisher = Publisher(
        connect(fanout),
        store,
        prefix=fanout.stream_prefix,
        host_id=host_id,
        maxlen_runs=fanout.maxlen_runs,
    )
    publisher.start(hub)
    _log.info("fanout_started", redis=redacted_url(fanout.redis_url), host_id=host_id)
    return publisher
