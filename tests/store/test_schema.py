"""The store's schema across versions: an older store is brought up to date on open, whole."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from pathlib import Path

import pytest

from codelegate.daemon.store import approvals, queries
from codelegate.daemon.store.store import RunStore, StoreError
from tests.store.conftest import frame, newer_store

# Version 1 kept frames WITHOUT ROWID: the table as that version created it.
V1_FRAMES = """
CREATE TABLE frames (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
"""


def _v1_store(path: str, frames: list[tuple[str, int, bytes]]) -> None:
    queries.make_parent(path)
    conn = sqlite3.connect(path)
    conn.executescript(queries.SCHEMA + V1_FRAMES + queries.INVOCATIONS_SCHEMA + approvals.SCHEMA)
    for run_id in sorted({run_id for run_id, _, _ in frames}):
        conn.execute(
            "INSERT INTO runs (run_id, status, created_at, cwd, mode, last_seq)"
            " VALUES (?, 'completed', 1000.0, '/srv/workspaces/demo', 'safe', ?)",
            (run_id, max(seq for r, seq, _ in frames if r == run_id)),
        )
    conn.executemany("INSERT INTO frames VALUES (?, ?, ?)", frames)
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def _frames_ddl(path: str) -> tuple[str, int]:
    conn = sqlite3.connect(path)
    try:
        (ddl,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'frames'").fetchone()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
    finally:
        conn.close()
    return ddl, version


async def test_a_version_1_store_keeps_every_frame_byte_for_byte_in_the_rowid_table(
    db_path: str,
) -> None:
    # Fresh bytes each time: the migration copies what is there, it does not rebuild frames.
    frames = [
        (run_id, seq, frame(run_id, seq) + secrets.token_hex(seq).encode())
        for run_id in ("r1", "r2")
        for seq in range(1, 40)
    ]
    _v1_store(db_path, frames)
    store = await RunStore.open(db_path)
    try:
        for run_id in ("r1", "r2"):
            kept = [data for r, _, data in frames if r == run_id]
            assert await store.frames_after(run_id, 0) == kept
            assert await store.frames_after(run_id, 30) == kept[30:]
            rec = await store.get_run(run_id)
            assert rec is not None
            assert rec.last_seq == 39
        store.append_frame("r1", 40, frame("r1", 40))
        assert (await store.frames_after("r1", 39)) == [frame("r1", 40)]
    finally:
        await store.close()
    ddl, version = _frames_ddl(db_path)
    assert "WITHOUT ROWID" not in ddl.upper()
    assert version == queries.SCHEMA_VERSION == 2
    # Opened again, nothing moves a second time.
    store = await RunStore.open(db_path)
    try:
        assert len(await store.frames_after("r2", 0)) == 39
    finally:
        await store.close()


async def test_a_new_store_keeps_frames_in_a_rowid_table(db_path: str) -> None:
    store = await RunStore.open(db_path)
    await store.close()
    ddl, version = _frames_ddl(db_path)
    assert "WITHOUT ROWID" not in ddl.upper()
    assert version == queries.SCHEMA_VERSION


async def test_a_store_from_a_newer_daemon_is_refused_and_left_byte_for_byte_as_it_is(
    db_path: str,
) -> None:
    before = newer_store(db_path)
    with pytest.raises(StoreError, match=r"newer than this daemon's .*left as it is"):
        await RunStore.open(db_path)
    # Not a byte changed: the WAL is not switched on before the version is read.
    assert await asyncio.to_thread(Path(db_path).read_bytes) == before


def test_doctor_tells_a_store_serve_would_refuse_from_its_header_only(
    db_path: str, tmp_path: Path
) -> None:
    assert queries.file_problem(db_path) is None  # none yet: serve creates it
    newer = f"{db_path}: {queries.newer(queries.SCHEMA_VERSION + 1)}"
    newer_store(db_path)
    assert queries.file_problem(db_path) == newer
    Path(db_path).unlink()
    Path(db_path).write_bytes(b"")
    assert queries.file_problem(db_path) is None  # empty: serve makes it a store
    queries.connect(db_path).close()
    assert queries.file_problem(db_path) is None
    Path(db_path).write_bytes(queries.SQLITE_MAGIC)  # a header cut short
    assert queries.file_problem(db_path) == f"{db_path} is not an SQLite database"
    assert queries.file_problem(str(tmp_path)) == f"{tmp_path} is a folder, not a store file"
