"""The run store: runs, their results, issued session ids and every frame, in SQLite.

All database work happens on one dedicated worker thread (a single-thread executor): the event
loop never blocks on disk, and one thread owning the connection needs no locking. Frames are
buffered and written in batches (on a short timer, when the buffer is large, before any read or
finish, and on close), in one transaction per batch. WAL mode lets operators read the file while
the daemon writes it.

A failed write (disk full, read-only file) never raises into the run that produced the frames:
the batch goes back to the front of the buffer to be retried, the error is handed to
``on_error`` (the daemon logs it), and :meth:`RunStore.flush` raises :class:`StoreError` while
frames remain unwritten. Reads still see those frames, merged from the buffer.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import msgspec

T = TypeVar("T")

SCHEMA_VERSION: Final = 1
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    cwd TEXT NOT NULL,
    mode TEXT NOT NULL,
    session_id TEXT,
    resumed INTEGER NOT NULL DEFAULT 0,
    parent_tool_call_id TEXT,
    result BLOB,
    exit_code INTEGER,
    last_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status);
CREATE INDEX IF NOT EXISTS runs_session ON runs (session_id);
CREATE TABLE IF NOT EXISTS frames (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    cwd TEXT NOT NULL,
    run_id TEXT NOT NULL,
    issued_at REAL NOT NULL
);
"""
_COLUMNS: Final = (
    "run_id, status, created_at, finished_at, cwd, mode, session_id, resumed,"
    " parent_tool_call_id, last_seq, result, exit_code"
)
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
    fields = dict(zip(_FIELDS, row, strict=True))
    fields["resumed"] = bool(fields["resumed"])
    if fields["result"] is not None:
        fields["result"] = bytes(fields["result"])
    return RunRecord(**fields)


_FIELDS: Final = RunRecord.__struct_fields__  # the same order as _COLUMNS (checked by a test)


Frame = tuple[str, int, bytes]  # (run_id, seq, encoded frame)


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
        self._pending: list[Frame] = []
        self._inflight: dict[asyncio.Future[None], list[Frame]] = {}
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
            conn = await loop.run_in_executor(executor, _connect, path)
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

    # -- frames: buffered, batched -------------------------------------------------------

    def append_frame(self, run_id: str, seq: int, data: bytes) -> None:
        """Queue one encoded frame; it is written with the next batch. Never blocks."""
        if self._closed:
            raise StoreError("the run store is closed")
        self._pending.append((run_id, seq, data))
        if len(self._pending) >= self._flush_frames:
            self._submit()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_interval, self._submit)

    def _submit(self) -> None:
        """Hand the buffered frames to the store thread as one batch (no await)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending or self._closed:
            return
        batch, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, _write_frames, self._conn, batch)
        self._inflight[future] = batch
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[None]) -> None:
        batch = self._inflight.pop(future)
        exc = None if future.cancelled() else future.exception()
        if exc is None and not future.cancelled():
            self.batches_written += 1
            self.frames_written += len(batch)
            self._last_error = None
            return
        # Keep the frames (primary keys make a retry idempotent) and try again later.
        self.write_errors += 1
        self._last_error = exc
        self._pending[:0] = batch
        if exc is not None and self._on_error is not None:
            self._on_error(exc)
        if not self._closed and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(RETRY_AFTER_S, self._submit)

    async def flush(self) -> None:
        """Write every buffered frame now; raise :class:`StoreError` if some could not be."""
        self._submit()
        if self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
        if self._pending:
            raise StoreError(
                f"{len(self._pending)} frames not written: {self._last_error}"
            ) from self._last_error

    @property
    def unwritten(self) -> int:
        """Frames buffered or being written."""
        return len(self._pending) + sum(len(b) for b in self._inflight.values())

    # -- runs and sessions ---------------------------------------------------------------

    async def create_run(self, rec: RunRecord) -> None:
        """Insert a new run; a fresh (not resumed) session id is recorded as issued by it."""
        await self._call(_create_run, rec)

    async def finish_run(
        self,
        run_id: str,
        status: str,
        result: bytes | None,
        exit_code: int | None,
        finished_at: float,
    ) -> None:
        """Record the final status and result, after the run's buffered frames."""
        self._submit()
        await self._call(_finish_run, run_id, status, result, exit_code, finished_at)

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or None."""
        self._submit()
        sql = f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?"  # noqa: S608 - constant columns
        rows = await self._call(_select, sql, run_id)
        return _record(rows[0]) if rows else None

    async def list_runs(self, limit: int = 50) -> list[RunRecord]:
        """The most recent runs, newest first."""
        self._submit()
        sql = f"SELECT {_COLUMNS} FROM runs ORDER BY created_at DESC, rowid DESC LIMIT ?"  # noqa: S608
        return [_record(r) for r in await self._call(_select, sql, max(0, limit))]

    async def live_runs(self) -> list[RunRecord]:
        """Runs still marked running: at start-up, those a previous daemon left behind."""
        sql = f"SELECT {_COLUMNS} FROM runs WHERE status = 'running' ORDER BY created_at"  # noqa: S608
        return [_record(r) for r in await self._call(_select, sql)]

    async def frames_after(self, run_id: str, after: int) -> list[bytes]:
        """The run's frames with ``seq > after``, in order, including ones not yet written."""
        self._submit()
        sql = "SELECT seq, data FROM frames WHERE run_id = ? AND seq > ? ORDER BY seq"
        rows = await self._call(_select, sql, run_id, after)
        by_seq = {seq: bytes(data) for seq, data in rows}
        for rid, seq, data in self._unwritten_frames():
            if rid == run_id and seq > after:
                by_seq.setdefault(seq, data)
        return [by_seq[s] for s in sorted(by_seq)]

    def _unwritten_frames(self) -> list[Frame]:
        out = list(self._pending)
        for batch in self._inflight.values():
            out.extend(batch)
        return out

    async def session_owner(self, session_id: str) -> str | None:
        """The workspace cwd of the run that was issued ``session_id``, or None."""
        sql = "SELECT cwd FROM sessions WHERE session_id = ?"
        rows = await self._call(_select, sql, session_id)
        return str(rows[0][0]) if rows else None

    async def prune(self, retention_days: float, max_runs: int, *, now: float | None = None) -> int:
        """Delete finished runs older than ``retention_days`` or beyond the newest ``max_runs``.

        Running runs are neither pruned nor counted. A session id stays resumable while any run
        of it is kept. Returns the number of runs deleted.
        """
        self._submit()
        cutoff = (time.time() if now is None else now) - retention_days * 86400.0
        return await self._call(_prune, cutoff, max(0, max_runs))

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


# -- the functions below run on the store thread only ----------------------------------------


def _connect(path: str) -> sqlite3.Connection:
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    # The connection is made, used and closed on the store thread only.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal" and path != ":memory:":
            raise sqlite3.OperationalError(f"cannot switch to WAL (journal_mode={mode})")
        # WAL + NORMAL: a power cut may lose the last batches, never corrupt the file.
        conn.execute("PRAGMA synchronous = NORMAL")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.OperationalError(f"schema version {version} is newer than this daemon")
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn


def _transaction(conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        out = fn()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return out


def _write_frames(conn: sqlite3.Connection, batch: list[Frame]) -> None:
    last: dict[str, int] = {}
    for run_id, seq, _ in batch:
        last[run_id] = max(seq, last.get(run_id, 0))

    def write() -> None:
        # OR IGNORE: a batch retried after an ambiguous failure must not fail on its own rows.
        conn.executemany("INSERT OR IGNORE INTO frames (run_id, seq, data) VALUES (?, ?, ?)", batch)
        conn.executemany(
            "UPDATE runs SET last_seq = MAX(last_seq, ?) WHERE run_id = ?",
            [(seq, run_id) for run_id, seq in last.items()],
        )

    _transaction(conn, write)


def _create_run(conn: sqlite3.Connection, rec: RunRecord) -> None:
    def write() -> None:
        conn.execute(
            f"INSERT INTO runs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
            msgspec.structs.astuple(rec),
        )
        if rec.session_id is not None and not rec.resumed:
            conn.execute(
                "INSERT OR IGNORE INTO sessions (session_id, cwd, run_id, issued_at)"
                " VALUES (?, ?, ?, ?)",
                (rec.session_id, rec.cwd, rec.run_id, rec.created_at),
            )

    _transaction(conn, write)


def _finish_run(
    conn: sqlite3.Connection,
    run_id: str,
    status: str,
    result: bytes | None,
    exit_code: int | None,
    finished_at: float,
) -> None:
    conn.execute(
        "UPDATE runs SET status = ?, result = ?, exit_code = ?, finished_at = ? WHERE run_id = ?",
        (status, result, exit_code, finished_at, run_id),
    )


def _select(conn: sqlite3.Connection, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return conn.execute(sql, params).fetchall()


def _prune(conn: sqlite3.Connection, cutoff: float, max_runs: int) -> int:
    def delete() -> int:
        doomed = [
            row[0]
            for row in conn.execute(
                "SELECT run_id FROM runs WHERE status != 'running' AND ("
                " (finished_at IS NOT NULL AND finished_at < ?)"
                " OR run_id NOT IN"
                "  (SELECT run_id FROM runs WHERE status != 'running'"
                "   ORDER BY created_at DESC, rowid DESC LIMIT ?))",
                (cutoff, max_runs),
            )
        ]
        params = [(run_id,) for run_id in doomed]
        conn.executemany("DELETE FROM frames WHERE run_id = ?", params)
        conn.executemany("DELETE FROM runs WHERE run_id = ?", params)
        conn.execute(
            "DELETE FROM sessions WHERE session_id NOT IN"
            " (SELECT session_id FROM runs WHERE session_id IS NOT NULL)"
        )
        return len(doomed)

    return _transaction(conn, delete)
