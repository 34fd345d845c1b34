"""The run store's SQL: schema and the statements, run on the store's own thread only.

Every function takes the connection first and is called through the store's single-thread
executor (``daemon/store/store.py``); nothing here touches the event loop.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, Final, TypeVar

import msgspec

from codelegate.daemon.store import approvals

T = TypeVar("T")


class RunRecord(msgspec.Struct, kw_only=True):
    """The one description of a run, live or finished: a row of ``runs``, the body of
    ``GET /v1/runs/{id}`` (README "HTTP API"), and what the run's translator context is made of
    (``daemon/record.py``)."""

    run_id: str
    status: str = "running"
    created_at: float
    finished_at: float | None = None
    cwd: str
    mode: str
    session_id: str | None = None
    resumed: bool = False
    parent_tool_call_id: str | None = None
    last_seq: int = 0
    exit_code: int | None = None
    result: msgspec.Raw | None = None  # the FinalResult's JSON, sent as it is


# 2: frames in a rowid table (version 1 kept them WITHOUT ROWID; migrated on open, below).
SCHEMA_VERSION: Final = 2
SCHEMA: Final = """
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
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    cwd TEXT NOT NULL,
    run_id TEXT NOT NULL,
    issued_at REAL NOT NULL
);
"""
# O Chat's Work Room of a parent tool call lives across runs (a follow-up continues it): the last
# stateRevision and row number used under each invocation, so that the next run continues them.
# Kept apart from runs (pruning a run does not reset its Work Room's counters).
INVOCATIONS_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS invocations (
    parent_tool_call_id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    sequence INTEGER NOT NULL
) WITHOUT ROWID;
"""
# A rowid table, not WITHOUT ROWID: a frame is often larger than the twentieth of a page past
# which SQLite advises against WITHOUT ROWID, and there the file took 1.62x the frames' bytes
# against 1.27x (the golden corpus's frames, measured; the key lives in the small index).
FRAMES_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS frames (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"""
COLUMNS: Final = ", ".join(RunRecord.__struct_fields__)
SELECT_RUNS: Final = f"SELECT {COLUMNS} FROM runs"  # noqa: S608 - constant columns
# The same rows without their final results, for what needs only the runs' ids and progress.
_BARE: Final = ", ".join("NULL" if f == "result" else f for f in RunRecord.__struct_fields__)
SELECT_RUNS_BARE: Final = f"SELECT {_BARE} FROM runs"  # noqa: S608 - constant columns

Frame = tuple[str, int, bytes]  # (run_id, seq, encoded frame)
# (status, result, exit_code, finished_at) of a finished run, as RunRecord has them
Finish = tuple[str, msgspec.Raw | None, int | None, float | None]


def make_parent(path: str) -> None:
    """Create the directory the store file ``path`` lives in, if it is missing."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)


def newer(version: int) -> str:
    """What is wrong with a store of schema ``version`` above :data:`SCHEMA_VERSION`."""
    return f"schema version {version} is newer than this daemon's ({SCHEMA_VERSION})"


# An SQLite file's first bytes; its header holds ``user_version`` at 60 (4 bytes, big-endian).
SQLITE_MAGIC: Final = b"SQLite format 3\0"


def file_problem(path: str) -> str | None:
    """Why :func:`connect` would refuse the file at ``path``, told from its header by reading
    it only (``doctor``); None when it is fine or missing (a new store is created)."""
    if os.path.isdir(path):
        return f"{path} is a folder, not a store file"
    try:
        with open(path, "rb") as fh:
            header = fh.read(100)
    except (FileNotFoundError, NotADirectoryError):  # none yet (its folder is checked apart)
        return None
    except OSError as exc:
        return f"cannot read {path} ({exc.strerror})"
    if not header:
        return None  # an empty file: connect makes it a store
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return f"{path} is not an SQLite database"
    version = int.from_bytes(header[60:64], "big")
    return f"{path}: {newer(version)}" if version > SCHEMA_VERSION else None


def connect(path: str) -> sqlite3.Connection:
    """Open the database in WAL mode and bring the schema up to date."""
    make_parent(path)
    if path != ":memory:":
        # Runs hold tasks, tool output and results: readable by the daemon's user only. SQLite
        # gives the -wal and -shm files the mode of the database file.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    # Made, used and closed on the store thread only; autocommit, transactions are explicit.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        # The version first, before anything writes: a newer daemon's file (in whatever journal
        # mode it keeps) is refused with not a byte of it changed, and a file that is not
        # SQLite fails here too, having been only read.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.OperationalError(f"{newer(version)}; it is left as it is")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal" and path != ":memory:":
            raise sqlite3.OperationalError(f"cannot switch to WAL (journal_mode={mode})")
        # WAL + NORMAL: a power cut may lose the last batches, never corrupt the file.
        conn.execute("PRAGMA synchronous = NORMAL")
        # A flood of writes grows the WAL; once checkpointed, give the space back beyond 64 MiB.
        conn.execute("PRAGMA journal_size_limit = 67108864")
        conn.executescript(SCHEMA)
        _migrate_frames(conn)
        conn.executescript(FRAMES_SCHEMA)
        conn.executescript(INVOCATIONS_SCHEMA)
        conn.executescript(approvals.SCHEMA)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate_frames(conn: sqlite3.Connection) -> None:
    """A version-1 store's frames into the rowid table, in one transaction (a store that stops
    midway is still version 1, whole, and migrates at the next open)."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'frames'")
    ddl = row.fetchone()
    if ddl is None or "WITHOUT ROWID" not in ddl[0].upper():
        return

    def move() -> None:
        conn.execute("ALTER TABLE frames RENAME TO frames_without_rowid")
        conn.execute(FRAMES_SCHEMA)
        conn.execute(
            "INSERT INTO frames (run_id, seq, data)"
            " SELECT run_id, seq, data FROM frames_without_rowid ORDER BY run_id, seq"
        )
        conn.execute("DROP TABLE frames_without_rowid")

    transaction(conn, move)


def transaction(conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
    """Run ``fn`` in one write transaction, rolled back if it fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        out = fn()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return out


# Rows per INSERT statement, largest first: a batch (256 frames at most by default) goes in as
# one statement, or a few. sqlite3 lets go of the GIL for each step, and each step then waits
# for the busy event loop to hand it back. Beside a loop that takes and drops the GIL at every
# poll, the store thread's CPU a frame was 4.3-14.9 us stepping once per row (executemany,
# more the busier the machine), 3.2-3.9 us at 64 rows a statement on a quiet machine and
# 6.7-9.0 on a loaded one, 3.1-3.6 and 3.9-5.6 us at 256 (bench/RESULTS.md, section 2).
# 256 rows are 768 variables, within SQLite's oldest default limit (999).
INSERT_ROWS: Final = (256, 64, 16, 4, 1)
_INSERT_FRAMES: Final = {  # placeholders only: the values are bound
    n: "INSERT OR IGNORE INTO frames (run_id, seq, data) VALUES "  # noqa: S608
    + ", ".join(["(?, ?, ?)"] * n)
    for n in INSERT_ROWS
}


def insert_frames(conn: sqlite3.Connection, frames: Sequence[Frame]) -> None:
    """Insert ``frames`` in order; a row already stored is left as it is.

    OR IGNORE (each row on its own): a batch retried after an ambiguous failure must not fail
    on its own rows.
    """
    at, total = 0, len(frames)
    for n in INSERT_ROWS:
        sql = _INSERT_FRAMES[n]
        while total - at >= n:
            conn.execute(sql, list(chain.from_iterable(frames[at : at + n])))
            at += n


def write_batch(conn: sqlite3.Connection, frames: list[Frame], finishes: dict[str, Finish]) -> None:
    """Frames, then final statuses, in one transaction: a finish never lands before its frames."""
    last: dict[str, int] = {}
    for run_id, seq, _ in frames:
        last[run_id] = max(seq, last.get(run_id, 0))

    def write() -> None:
        insert_frames(conn, frames)
        conn.executemany(
            "UPDATE runs SET last_seq = MAX(last_seq, ?) WHERE run_id = ?",
            [(seq, run_id) for run_id, seq in last.items()],
        )
        conn.executemany(
            "UPDATE runs SET status = ?, result = ?, exit_code = ?, finished_at = ?"
            " WHERE run_id = ?",
            [(*finish, run_id) for run_id, finish in finishes.items()],
        )

    transaction(conn, write)


def record(row: Sequence[Any]) -> RunRecord:
    """The record of a row selected with :data:`SELECT_RUNS`."""
    fields = dict(zip(RunRecord.__struct_fields__, row, strict=True))
    fields["resumed"] = bool(fields["resumed"])
    if fields["result"] is not None:
        fields["result"] = msgspec.Raw(bytes(fields["result"]))
    return RunRecord(**fields)


def create_run(conn: sqlite3.Connection, rec: RunRecord) -> None:
    """Insert a run; a fresh (not resumed) session id is recorded as issued by it."""
    values = msgspec.structs.astuple(rec)
    marks = ", ".join("?" * len(values))

    def write() -> None:
        conn.execute(f"INSERT INTO runs ({COLUMNS}) VALUES ({marks})", values)  # noqa: S608
        if rec.session_id is not None and not rec.resumed:
            conn.execute(
                "INSERT OR IGNORE INTO sessions (session_id, cwd, run_id, issued_at)"
                " VALUES (?, ?, ?, ?)",
                (rec.session_id, rec.cwd, rec.run_id, rec.created_at),
            )

    transaction(conn, write)


def invocation_marks(conn: sqlite3.Connection, parent_tool_call_id: str) -> tuple[int, int]:
    """The last (stateRevision, row number) used under a parent tool call; (0, 0) if none."""
    row = conn.execute(
        "SELECT revision, sequence FROM invocations WHERE parent_tool_call_id = ?",
        (parent_tool_call_id,),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def advance_invocation(
    conn: sqlite3.Connection, parent_tool_call_id: str, revision: int, sequence: int
) -> None:
    """Record what a run used under a parent tool call; the counters never go back."""
    transaction(
        conn,
        lambda: conn.execute(
            "INSERT INTO invocations (parent_tool_call_id, revision, sequence) VALUES (?, ?, ?)"
            " ON CONFLICT (parent_tool_call_id) DO UPDATE SET"
            " revision = MAX(revision, excluded.revision),"
            " sequence = MAX(sequence, excluded.sequence)",
            (parent_tool_call_id, revision, sequence),
        ),
    )


def select(conn: sqlite3.Connection, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """All rows of a query."""
    return conn.execute(sql, params).fetchall()


# The listing's order, newest first; its cursor is a run's (created_at, run_id). The first
# term of _BEFORE is the range of the index on created_at, the rest what is past the cursor.
Cursor = tuple[float, str]
_NEWEST_FIRST: Final = " ORDER BY created_at DESC, run_id DESC LIMIT ?"
_BEFORE: Final = " WHERE created_at <= ? AND (created_at < ? OR run_id < ?)"


def cursor_of(rec: RunRecord) -> Cursor:
    """Where ``rec`` stands in the listing's order (newest first: the highest cursor)."""
    return (rec.created_at, rec.run_id)


# The fields of a row of unbounded size: what a page of rows is measured by.
_SIZED: Final = tuple(RunRecord.__struct_fields__.index(name) for name in ("cwd", "result"))


def runs_page(
    conn: sqlite3.Connection,
    limit: int,
    before: Cursor | None,
    max_bytes: int | None,
    results: bool = True,
) -> tuple[list[tuple[Any, ...]], bool]:
    """Up to ``limit`` runs newest first (those after ``before``), and whether more follow;
    without their final results unless ``results``.

    With ``max_bytes`` the rows stop before their cwds and results would pass it (the first
    row is always taken): they are read one at a time, so a page holds no more than that and
    one row, however many runs the store keeps.
    """
    sql = SELECT_RUNS if results else SELECT_RUNS_BARE
    params: tuple[Any, ...] = (limit + 1,)
    if before is not None:  # the cursor's created_at twice, then its run id
        sql, params = sql + _BEFORE, (before[0], *before, limit + 1)
    rows: list[tuple[Any, ...]] = []
    size = 0
    with contextlib.closing(conn.execute(sql + _NEWEST_FIRST, params)) as cursor:
        for row in cursor:
            size += sum(len(row[i]) for i in _SIZED if row[i] is not None)
            if len(rows) == limit or (rows and max_bytes is not None and size > max_bytes):
                return rows, True
            rows.append(row)
    return rows, False


def prune(conn: sqlite3.Connection, cutoff: float, max_runs: int) -> int:
    """Delete finished runs finished before ``cutoff`` or beyond the newest ``max_runs``."""

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
        approvals.delete_runs(conn, params)
        # A session stays resumable while any run of it is kept.
        conn.execute(
            "DELETE FROM sessions WHERE session_id NOT IN"
            " (SELECT session_id FROM runs WHERE session_id IS NOT NULL)"
        )
        return len(doomed)

    return transaction(conn, delete)
