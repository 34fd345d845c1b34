"""The run store: runs, their results, issued session ids and every frame, in SQLite.

All database work happens on one dedicated worker thread (a single-thread executor): the event
loop never blocks on disk, and one thread owning the connection needs no locking. Frames and
final statuses are buffered and written in batches (on a short timer, when the buffer is large,
before any read, on finish and on close), one transaction per batch. WAL mode lets operators
read the file while the daemon writes it. The SQL lives in ``daemon/store_db.py``.

A failed write (disk full, read-only file) never raises into the run that produced the frames:
the batch goes back to the front of the buffer and is retried, the error is handed to
``on_error`` (the daemon logs it), and :meth:`RunStore.flush` / :meth:`RunStore.finish_run`
raise :class:`StoreError` while something remains unwritten. Readers see the unwritten frames
and final statuses merged from the buffer, so nothing already recorded is lost.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import msgspec

from daemon import store_db
from daemon.store_db import Finish, Frame

T = TypeVar("T")

RETRY_AFTER_S: Final = 1.0  # after a failed write: no hot loop against a full disk


class StoreError(Exception):
    """A store operation failed (the cause is chained); the daemon logs it and carries on."""


class RunRecord(msgspec.Struct, kw_only=True):
    """One row of ``runs``: what is known about a run, live or finished."""

    run_id: str
    status: str
    created_at: float
    finished_at: float | None = None
    cwd: str
    mode: str
    session_id: str | None = None
    resumed: bool = False
    parent_tool_call_id: str | None = None
    last_seq: int = 0
    result: bytes | None = None  # FinalResult JSON
    exit_code: int | None = None


def _record(row: tuple[Any, ...]) -> RunRecord:
    fields = dict(zip(RunRecord.__struct_fields__, row, strict=True))
    fields["resumed"] = bool(fields["resumed"])
    if fields["result"] is not None:
        fields["result"] = bytes(fields["result"])
    return RunRecord(**fields)


Batch = tuple[list[Frame], dict[str, Finish]]


class RunStore:
    """SQLite run store; open with :meth:`open`, always :meth:`close`."""

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        conn: sqlite3.Connection,
        *,
        flush_interval: float,
        flush_frames: int,
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        self._executor = executor
        self._conn = conn
        self._flush_interval = flush_interval
        self._flush_frames = flush_frames
        self._on_error = on_error
        self._frames: list[Frame] = []
        self._finishes: dict[str, Finish] = {}
        self._inflight: dict[asyncio.Future[None], Batch] = {}
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
        on_error: Callable[[BaseException], None] | None = None,
    ) -> RunStore:
        """Open (creating if needed) the database at ``path`` in WAL mode."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runstore")
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, store_db.connect, path)
        except (sqlite3.Error, OSError) as exc:
            executor.shutdown(wait=False)
            raise StoreError(f"cannot open the run store {path!r}: {exc}") from exc
        return cls(
            executor,
            conn,
            flush_interval=flush_interval,
            flush_frames=flush_frames,
            on_error=on_error,
        )

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the store thread, after every write queued before it."""
        if self._closed:
            raise StoreError("the run store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._conn, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"run store: {exc}") from exc

    # -- the write buffer ------------------------------------------------------------------

    def append_frame(self, run_id: str, seq: int, data: bytes) -> None:
        """Queue one encoded frame; it is written with the next batch. Never blocks."""
        if self._closed:
            raise StoreError("the run store is closed")
        self._frames.append((run_id, seq, data))
        if len(self._frames) >= self._flush_frames:
            self._submit()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_interval, self._submit)

    def _submit(self) -> None:
        """Hand everything buffered to the store thread as one batch (no await)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closed or not (self._frames or self._finishes):
            return
        batch: Batch = (self._frames, self._finishes)
        self._frames, self._finishes = [], {}
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, store_db.write_batch, self._conn, *batch)
        self._inflight[future] = batch
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[None]) -> None:
        frames, finishes = self._inflight.pop(future)
        exc = None if future.cancelled() else future.exception()
        if exc is None and not future.cancelled():
            self.batches_written += 1
            self.frames_written += len(frames)
            self._last_error = None
            return
        # Keep it all (primary keys make a retry idempotent) and try again later.
        self.write_errors += 1
        self._last_error = exc
        self._frames[:0] = frames
        for run_id, finish in finishes.items():
            self._finishes.setdefault(run_id, finish)  # a newer finish of that run wins
        if exc is not None and self._on_error is not None:
            self._on_error(exc)
        if not self._closed and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(RETRY_AFTER_S, self._submit)

    async def _settle(self) -> None:
        self._submit()
        if self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    async def flush(self) -> None:
        """Write everything buffered now; raise :class:`StoreError` if some could not be."""
        errors_before = self.write_errors
        await self._settle()
        # What other runs appended while we waited is not a failure: only a write that failed
        # during this flush is.
        if self.write_errors > errors_before and (self._frames or self._finishes):
            raise StoreError(
                f"{len(self._frames)} frames and {len(self._finishes)} final statuses not"
                f" written (retrying): {self._last_error}"
            ) from self._last_error

    @property
    def unwritten(self) -> int:
        """Frames and final statuses buffered or being written."""
        batches = [(self._frames, self._finishes), *self._inflight.values()]
        return sum(len(frames) + len(finishes) for frames, finishes in batches)

    def _unwritten(self) -> Batch:
        frames, finishes = list(self._frames), dict(self._finishes)
        for f, fin in self._inflight.values():
            frames.extend(f)
            for run_id, finish in fin.items():
                finishes.setdefault(run_id, finish)
        return frames, finishes

    def _overlay(self, rec: RunRecord) -> RunRecord:
        """``rec`` with its unwritten frames and final status applied."""
        frames, finishes = self._unwritten()
        seqs = [seq for run_id, seq, _ in frames if run_id == rec.run_id]
        if seqs:
            rec.last_seq = max(rec.last_seq, *seqs)
        if rec.run_id in finishes:
            rec.status, rec.result, rec.exit_code, rec.finished_at = finishes[rec.run_id]
        return rec

    # -- runs and sessions -----------------------------------------------------------------

    async def create_run(self, rec: RunRecord) -> None:
        """Insert a new run; a fresh (not resumed) session id is recorded as issued by it."""
        await self._call(store_db.create_run, msgspec.structs.astuple(rec))

    async def finish_run(
        self,
        run_id: str,
        status: str,
        result: bytes | None,
        exit_code: int | None,
        finished_at: float,
    ) -> None:
        """Record the final status and result, after the run's buffered frames.

        Durable like frames: if the write fails it stays queued and is retried (readers see it
        meanwhile), and :class:`StoreError` tells the caller to log it.
        """
        if self._closed:
            raise StoreError("the run store is closed")
        self._finishes[run_id] = (status, result, exit_code, finished_at)
        await self._settle()
        if run_id in self._finishes:
            raise StoreError(
                f"final status of {run_id} not written (retrying): {self._last_error}"
            ) from self._last_error

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or None."""
        self._submit()
        rows = await self._call(store_db.select, f"{store_db.SELECT_RUNS} WHERE run_id = ?", run_id)
        return self._overlay(_record(rows[0])) if rows else None

    async def list_runs(self, limit: int = 50) -> list[RunRecord]:
        """The most recent runs, newest first."""
        self._submit()
        sql = f"{store_db.SELECT_RUNS} ORDER BY created_at DESC, rowid DESC LIMIT ?"
        return [
            self._overlay(_record(r)) for r in await self._call(store_db.select, sql, max(0, limit))
        ]

    async def live_runs(self) -> list[RunRecord]:
        """Runs still marked running: at start-up, those a previous daemon left behind."""
        self._submit()
        sql = f"{store_db.SELECT_RUNS} WHERE status = 'running' ORDER BY created_at"
        records = [self._overlay(_record(r)) for r in await self._call(store_db.select, sql)]
        return [rec for rec in records if rec.status == "running"]

    async def frames_after(self, run_id: str, after: int) -> list[bytes]:
        """The run's frames with ``seq > after``, in order, including ones not yet written."""
        self._submit()
        sql = "SELECT seq, data FROM frames WHERE run_id = ? AND seq > ? ORDER BY seq"
        rows = await self._call(store_db.select, sql, run_id, after)
        by_seq = {seq: bytes(data) for seq, data in rows}
        for rid, seq, data in self._unwritten()[0]:
            if rid == run_id and seq > after:
                by_seq.setdefault(seq, data)
        return [by_seq[s] for s in sorted(by_seq)]

    async def session_owner(self, session_id: str) -> str | None:
        """The workspace cwd of the run that was issued ``session_id``, or None."""
        sql = "SELECT cwd FROM sessions WHERE session_id = ?"
        rows = await self._call(store_db.select, sql, session_id)
        return str(rows[0][0]) if rows else None

    async def invocation_marks(self, parent_tool_call_id: str) -> tuple[int, int]:
        """The last stateRevision and Work Room row number used under a parent tool call."""
        return await self._call(store_db.invocation_marks, parent_tool_call_id)

    async def advance_invocation(
        self, parent_tool_call_id: str, revision: int, sequence: int
    ) -> None:
        """Record the counters a run under a parent tool call reached (they only grow)."""
        await self._call(store_db.advance_invocation, parent_tool_call_id, revision, sequence)

    async def prune(self, retention_days: float, max_runs: int, *, now: float | None = None) -> int:
        """Delete finished runs older than ``retention_days`` or beyond the newest ``max_runs``.

        Running runs are neither pruned nor counted. A session id stays resumable while any run
        of it is kept. Returns the number of runs deleted.
        """
        await self._settle()  # a run whose finish is still buffered must not look prunable
        cutoff = (time.time() if now is None else now) - retention_days * 86400.0
        return await self._call(store_db.prune, cutoff, max(0, max_runs))

    async def close(self) -> None:
        """Flush what can be flushed, then close the database. Idempotent."""
        if self._closed:
            return
        try:
            await self.flush()
        except StoreError as exc:
            if self._on_error is not None:
                self._on_error(exc)
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._closed = True
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._conn.close)
            self._executor.shutdown(wait=False)
