"""Fixtures for the run store tests."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from codelegate.daemon.store import queries
from codelegate.daemon.store.queries import RunRecord
from codelegate.daemon.store.store import RunStore


def record(run_id: str, *, created_at: float = 1000.0, **kw: object) -> RunRecord:
    """A running run's record with sensible defaults."""
    fields: dict[str, object] = {
        "run_id": run_id,
        "status": "running",
        "created_at": created_at,
        "cwd": "/srv/workspaces/demo",
        "mode": "safe",
    }
    fields.update(kw)
    return RunRecord(**fields)  # type: ignore[arg-type]


def finished(run_id: str, at: float, *, result: bytes = b"{}") -> RunRecord:
    """The record ``finish_run`` takes for a run that completed at ``at`` (exit code 0)."""
    return record(
        run_id, status="completed", finished_at=at, exit_code=0, result=msgspec.Raw(result)
    )


def frame(run_id: str, seq: int) -> bytes:
    """A stand-in encoded frame: distinct bytes per (run, seq)."""
    return b'{"type":"tool_call","run_id":"%s","seq":%d}' % (run_id.encode(), seq)


def newer_store(path: str | Path) -> bytes:
    """A store as a newer daemon may keep it: a schema version above this daemon's, in a
    rollback journal (no WAL), with a fresh random row; its bytes."""
    queries.make_parent(str(path))
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE later (x BLOB)")
    conn.execute("INSERT INTO later VALUES (?)", (secrets.token_bytes(64),))
    conn.execute(f"PRAGMA user_version = {queries.SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    return Path(path).read_bytes()


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "var" / "codelegate.db")


@pytest.fixture
async def store(db_path: str) -> AsyncIterator[RunStore]:
    s = await RunStore.open(db_path)
    yield s
    await s.close()
