"""The run store: runs, their results, issued session ids and every frame, in SQLite.

All database work happens on one dedicated worker thread (a single-thread executor): the event
loop never blocks on disk, and one thread owning the connection needs no locking. The SQL lives
in ``daemon/store/queries.py``, the write buffers in ``daemon/store/buffers.py``. WAL mode lets
operators read the file while the daemon writes it.

Writing. Frames and final statuses wait in a buffer of their own per run and are written by one
writer task, one batch (one transaction) at a time, at most ``flush_frames`` frames and about
``flush_bytes`` bytes each. A batch takes up to ``QUANTUM`` frames from each waiting run in
turn (round-robin), so a run that floods its output never makes another run's frames, its
record or a read wait behind more than one bounded batch: the executor holds at most one batch
ahead of any other call. The live fan-out never waits for the store at all (``append_frames``
only buffers). A batch is written when ``flush_frames`` are waiting, on a short timer, and at
once for :meth:`RunStore.finish_run`, :meth:`RunStore.flush` and :meth:`RunStore.close`.

Order. A run's final status goes into a batch only once every earlier frame of that run is in
the same batch or already written, and only one batch is ever in flight: a finish can never land
before its frames, and the stored frames of a run are always a gapless prefix of what it
produced (plus, past the cap, its closing frames).

Caps. A run stores at most ``max_frames`` frames and ``max_bytes`` bytes of frames; frames past
the cap are still delivered live, but not stored (``append_frames`` says how many; they are
counted in :meth:`RunStore.not_stored`), except the frames the caller marks ``always`` (a run's
closing frames and the diagnostic saying what was not stored), so that replay and recovery still
see how the run ended. A run's buffer never holds more than its cap either: the store's memory stays
bounded per run even while the disk is full.

Failures. A failed write (disk full, read-only file) never raises into the run that produced the
frames: the batch goes back to the front of its runs' buffers and is retried after
:data:`RETRY_AFTER_S`, the error is logged (``store_write_failed``, once until a write succeeds
again: ``store_write_recovered``) and handed to ``on_error``, and :meth:`RunStore.flush` /
:meth:`RunStore.finish_run` raise :class:`StoreError` while something remains unwritten. Readers
see the unwritten frames and final statuses merged from the buffers. :meth:`RunStore.close`
never raises: what it could not write is logged with its counts (``store_unflushed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import structlog

from codelegate.daemon.store import approvals, queries
from codelegate.daemon.store.approvals import ApprovalRow
from codelegate.daemon.store.buffers import UNCAPPED, Batch, Buffers
from codelegate.daemon.store.queries import Frame, RunRecord, record

T = TypeVar("T")

_log = structlog.get_logger("codelegate.store")

RETRY_AFTER_S: Final = 1.0  # after a failed write: no hot loop against a full disk


class StoreError(Exception):
    """A store operation failed (the cause is chained); the daemon logs it and carries on."""


class RunStore:
    """SQLite run store; open with :meth:`open`, always :meth:`close`."""

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        conn: sqlite3.Connection,
        buffers: Buffers,
        flush_interval: float,
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        self._executor = executor
        self._conn = conn
        self._buffers = buffers
        self._flush_frames = buffers.batch_frames  # this many waiting: a batch is written now
        self._flush_interval = flush_interval
        self._on_error = on_error
        self._writer: asyncio.Task[None] | None = None
        self._urgent = False  # write until the buffers are empty (flush, finish, close)
        self._finish_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._last_error: BaseException | None = None
        self._closed = False
        self.batches_written = 0
        self.frames_written = 0
        self.write_errors = 0

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        flush_interval: float = 0.05,
        flush_frames: int = 256,
        flush_bytes: int = 1 << 20,
        max_frames: int = UNCAPPED,
        max_bytes: int = UNCAPPED,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> RunStore:
        """Open (creating if needed) the database at ``path`` in WAL mode.

        ``max_frames`` / ``max_bytes``: what one run may store (``[limits]``; see the module
        docstring).
        """
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runstore")
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, queries.connect, path)
        except (sqlite3.Error, OSError) as exc:
            executor.shutdown(wait=False)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise StoreError(f"cannot open the run store {path}: {why}") from exc
        buffers = Buffers(
            batch_frames=flush_frames,
            batch_bytes=flush_bytes,
            max_frames=max_frames,
            max_bytes=max_bytes,
        )
        return cls(executor, conn, buffers, flush_interval, on_error)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the store thread (behind at most one batch)."""
        if self._closed:
            raise StoreError("the run store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._conn, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"run store: {exc}") from exc

    # -- the write buffers -----------------------------------------------------------------

    def append_frame(self, run_id: str, seq: int, data: bytes, *, always: bool = False) -> bool:
        """Queue one encoded frame for the next batch; never blocks.

        Returns False when the run is past its cap and the frame is not stored (``always``:
        store it anyway, for a run's closing frames).
        """
        return not self.append_frames(run_id, [(run_id, seq, data)], always)

    def append_frames(
        self, run_id: str, frames: Sequence[Frame], always: bool | Sequence[bool] = False
    ) -> int:
        """Queue encoded frames of ``run_id`` (``(run_id, seq, data)``, in order) for the next
        batches; never blocks. Returns how many were past the run's cap and not stored
        (``always``, for all or for each: stored anyway)."""
        if self._closed:
            raise StoreError("the run store is closed")
        not_stored = self._buffers.extend(run_id, frames, always)
        if not_stored == len(frames):
            return not_stored
        if self._buffers.buffered >= self._flush_frames and self._last_error is None:
            # (After a failed write only the retry timer, a flush or a finish writes again.)
            self._start_writer()
        elif self._timer is None and self._writer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self._flush_interval, self._start_writer
            )
        return not_stored

    def not_stored(self, run_id: str) -> int:
        """Frames of ``run_id`` past its cap, delivered live but not stored."""
        return self._buffers.not_stored(run_id)

    def _start_writer(self) -> None:
        """Start the writer task unless it runs already (it then picks up what is new)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writer is None and self._buffers.waiting and not self._closed:
            self._writer = asyncio.get_running_loop().create_task(
                self._write_loop(), name="runstore-writer"
            )

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        failed = False
        try:
            buffers = self._buffers
            while buffers.waiting:
                batch = buffers.take()
                buffers.inflight = batch
                try:
                    await loop.run_in_executor(
                        self._executor, queries.write_batch, self._conn, *batch
                    )
                except Exception as exc:  # kept and retried, never lost
                    buffers.inflight = None
                    self._failed(batch, exc)
                    failed = True
                    return
                buffers.inflight = None
                self._written(batch)
                if not self._urgent and buffers.buffered < self._flush_frames:
                    break
            if not buffers.waiting:
                self._urgent = False
        finally:
            self._writer = None
            if not self._closed and self._buffers.waiting and self._timer is None:
                delay = RETRY_AFTER_S if failed else self._flush_interval
                self._timer = loop.call_later(delay, self._start_writer)

    def _written(self, batch: Batch) -> None:
        frames, finishes = batch
        self.batches_written += 1
        self.frames_written += len(frames)
        if self._last_error is not None:
            _log.info("store_write_recovered", failed_writes=self.write_errors)
            self._last_error = None
        self._buffers.forget_finished(finishes)
        for run_id in finishes:
            for waiter in self._finish_waiters.pop(run_id, ()):
                if not waiter.done():
                    waiter.set_result(None)

    def _failed(self, batch: Batch, exc: BaseException) -> None:
        # Keep it all (primary keys make a retry idempotent) and try again later.
        self.write_errors += 1
        first = self._last_error is None
        self._last_error = exc
        self._buffers.restore(batch)
        if first:  # once per failing streak, not once a second while the disk stays full
            frames, finishes = self._buffers.counts()
            _log.error("store_write_failed", error=str(exc), frames=frames, final_statuses=finishes)
        # A final status waiting behind this batch is not written either: tell its caller.
        waiters, self._finish_waiters = self._finish_waiters, {}
        for futures in waiters.values():
            for waiter in futures:
                if not waiter.done():
                    waiter.set_exception(exc)
        if self._on_error is not None:
            self._on_error(exc)

    async def _write_now(self) -> None:
        """Write until the buffers are empty or a write fails (the retry then waits)."""
        self._urgent = True
        self._start_writer()
        if self._writer is not None:  # urgent: it ends once empty, or on a failure
            await asyncio.shield(self._writer)

    async def flush(self) -> None:
        """Write everything buffered now; raise :class:`StoreError` if some could not be."""
        errors_before = self.write_errors
        if self._writer is not None:  # a write in progress first: it may fail
            await asyncio.shield(self._writer)
        if self.write_errors == errors_before:
            await self._write_now()
        # What other runs appended while we waited is not a failure: only a write that failed
        # during this flush is.
        if self.write_errors > errors_before and self.unwritten:
            frames, finishes = self._buffers.counts()
            raise StoreError(
                f"{frames} frames and {finishes} final statuses not written (retrying):"
                f" {self._last_error}"
            ) from self._last_error

    @property
    def unwritten(self) -> int:
        """Frames and final statuses buffered or being written."""
        return sum(self._buffers.counts())

    def _overlay(self, rec: RunRecord) -> RunRecord:
        """``rec`` with its unwritten frames and final status applied."""
        frames, finish = self._buffers.unwritten_of(rec.run_id)
        if frames:
            rec.last_seq = max(rec.last_seq, *(seq for _, seq, _ in frames))
        if finish is not None:
            rec.status, rec.result, rec.exit_code, rec.finished_at = finish
        return rec

    # -- runs and sessions -----------------------------------------------------------------

    async def create_run(self, rec: RunRecord) -> None:
        """Insert a new run; a fresh (not resumed) session id is recorded as issued by it."""
        await self._call(queries.create_run, rec)

    async def finish_run(self, rec: RunRecord) -> None:
        """Record the run's final status, result, exit code and end, after its buffered frames.

        Waits for this run's batch only (never for the whole backlog of a run that floods).
        Durable like frames: if the write fails it stays queued and is retried (readers see it
        meanwhile), and :class:`StoreError` tells the caller to log it.
        """
        if self._closed:
            raise StoreError("the run store is closed")
        run_id = rec.run_id
        self._buffers.finish(run_id, (rec.status, rec.result, rec.exit_code, rec.finished_at))
        waiter = asyncio.get_running_loop().create_future()
        self._finish_waiters.setdefault(run_id, []).append(waiter)
        self._start_writer()
        try:
            await waiter
        except Exception as exc:  # the write failed; it stays queued
            raise StoreError(f"final status of {run_id} not written (retrying): {exc}") from exc

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or None."""
        rows = await self._call(queries.select, f"{queries.SELECT_RUNS} WHERE run_id = ?", run_id)
        return self._overlay(record(rows[0])) if rows else None

    async def list_runs(self, limit: int = 50, *, results: bool = True) -> list[RunRecord]:
        """The most recent runs, newest first; without the final results the store holds of
        them unless ``results`` (those not written yet are in memory anyway)."""
        return (await self.runs_page(limit, results=results))[0]

    async def runs_page(
        self,
        limit: int,
        *,
        before: queries.Cursor | None = None,
        max_bytes: int | None = None,
        results: bool = True,
    ) -> tuple[list[RunRecord], bool]:
        """Up to ``limit`` runs newest first, after the run whose (created_at, run_id) is
        ``before``, and whether more follow; ``max_bytes`` bounds their cwds and results (the
        first is always there, see :func:`queries.runs_page`)."""
        rows, more = await self._call(queries.runs_page, max(0, limit), before, max_bytes, results)
        return [self._overlay(record(r)) for r in rows], more

    async def live_runs(self) -> list[RunRecord]:
        """Runs still marked running: at start-up, those a previous daemon left behind."""
        sql = f"{queries.SELECT_RUNS} WHERE status = 'running' ORDER BY created_at"
        records = [self._overlay(record(r)) for r in await self._call(queries.select, sql)]
        return [rec for rec in records if rec.status == "running"]

    async def frames_page(self, run_id: str, after: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` of the run's ``(seq, frame)`` with ``seq > after``, in order,
        including ones not written yet. Seqs may jump where a capped run stored nothing."""
        sql = "SELECT seq, data FROM frames WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        rows = await self._call(queries.select, sql, run_id, after, limit)
        by_seq = {seq: bytes(data) for seq, data in rows}
        for _, seq, data in self._buffers.unwritten_of(run_id)[0]:
            if seq > after:
                by_seq.setdefault(seq, data)
        seqs = sorted(by_seq)
        return [(s, by_seq[s]) for s in (seqs[:limit] if limit >= 0 else seqs)]

    async def frames_after(self, run_id: str, after: int) -> list[bytes]:
        """All the run's frames with ``seq > after``, in order, including ones not yet written."""
        return [data for _, data in await self.frames_page(run_id, after, -1)]

    async def session_owner(self, session_id: str) -> str | None:
        """The workspace cwd of the run that was issued ``session_id``, or None."""
        sql = "SELECT cwd FROM sessions WHERE session_id = ?"
        rows = await self._call(queries.select, sql, session_id)
        return str(rows[0][0]) if rows else None

    async def invocation_marks(self, parent_tool_call_id: str) -> tuple[int, int]:
        """The last stateRevision and Work Room row number used under a parent tool call."""
        return await self._call(queries.invocation_marks, parent_tool_call_id)

    async def advance_invocation(
        self, parent_tool_call_id: str, revision: int, sequence: int
    ) -> None:
        """Record the counters a run under a parent tool call reached (they only grow)."""
        await self._call(queries.advance_invocation, parent_tool_call_id, revision, sequence)

    def put_approval(self, row: ApprovalRow) -> None:
        """Write an approvals row whole, in the background; never blocks, never raises.

        The store's one thread takes calls in order, so a later version of a row always lands
        after an earlier one; a failed write is logged (the run's frames, retried by the
        store, still tell what was asked and answered).
        """
        if self._closed:
            _log.error("store_approval_failed", error="the run store is closed")
            return
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._executor, approvals.put, self._conn, row)
        done.add_done_callback(_log_approval_failure)

    async def approvals(self, run_id: str) -> list[ApprovalRow]:
        """The run's approvals rows, in the order asked (after every write queued before)."""
        return await self._call(approvals.of_run, run_id)

    async def interrupt_approvals(self, run_id: str, now: float) -> int:
        """Close a dead daemon's unanswered rows of ``run_id`` as ``by: interrupted``."""
        return await self._call(approvals.interrupt, run_id, now)

    async def prune(self, retention_days: float, max_runs: int, *, now: float | None = None) -> int:
        """Delete finished runs older than ``retention_days`` or beyond the newest ``max_runs``.

        Running runs are neither pruned nor counted (a run whose final status is still buffered
        is ``running`` in the file). A session id stays resumable while any run of it is kept.
        Returns the number of runs deleted.
        """
        # Buffered frames of a run about to be pruned must not land after its rows are gone.
        await self._write_now()
        cutoff = (time.time() if now is None else now) - retention_days * 86400.0
        return await self._call(queries.prune, cutoff, max(0, max_runs))

    async def close(self) -> None:
        """Flush what can be flushed, then close the database. Idempotent; never raises.

        What could not be written (a full disk at shutdown) is logged with its counts.
        """
        if self._closed:
            return
        try:
            await self.flush()
        except StoreError as exc:
            if self._on_error is not None:
                self._on_error(exc)
        finally:
            frames, finishes = self._buffers.counts()
            if frames or finishes:
                runs = self._buffers.unwritten_runs()
                _log.error(
                    "store_unflushed",
                    frames=frames,
                    final_statuses=finishes,
                    runs=runs[:20],
                    error=str(self._last_error) if self._last_error is not None else None,
                )
            if self._timer is not None:
                self._timer.cancel()
            self._closed = True
            loop = asyncio.get_running_loop()
            with contextlib.suppress(sqlite3.Error):
                await loop.run_in_executor(self._executor, self._conn.close)
            self._executor.shutdown(wait=False)


def _log_approval_failure(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and (exc := done.exception()) is not None:
        _log.error("store_approval_failed", error=str(exc))
