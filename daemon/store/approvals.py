"""The ``approvals`` table: every permission request and question a run asked, and its answer.

The frames tell the same story (``approval_needed`` / ``ask_user``, then ``approval_resolved``),
but a run's frames are a stream to replay, not a list to answer ``GET /v1/runs/{id}/approvals``
from; this table is that list, kept by the daemon's approvals registry (``daemon/approvals.py``)
one whole row at a time and pruned with its run. It holds only what a client was shown
(redacted, bounded arguments), never the raw input the CLI asked with.

Run on the store's own thread only, like ``queries.py``.
"""

from __future__ import annotations

import sqlite3
from typing import Final

import msgspec

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS approvals (
    run_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    tool TEXT NOT NULL,
    tool_id TEXT,
    asked_at REAL NOT NULL,
    expires_at REAL,
    arguments BLOB,
    decision TEXT,
    scope TEXT,
    by TEXT,
    mode TEXT,
    message TEXT,
    answered_at REAL,
    PRIMARY KEY (run_id, request_id)
) WITHOUT ROWID;
"""


class ApprovalRow(msgspec.Struct, kw_only=True):
    """One request and, once there is one, its answer (field order = the table's columns)."""

    run_id: str
    request_id: str
    kind: str  # "permission" | "question"
    tool: str
    tool_id: str | None = None
    asked_at: float
    expires_at: float | None = None
    arguments: bytes | None = None  # JSON, redacted and bounded as in the frame
    decision: str | None = None  # "allow" | "deny"; None while pending
    scope: str | None = None  # "once" | "session"
    by: str | None = None  # client | timeout | cancel | policy | interrupted
    mode: str | None = None  # a client's reject_soft / reject_hard / reject_explain
    message: str | None = None  # what a deny told the model (redacted, bounded)
    answered_at: float | None = None


COLUMNS: Final = ", ".join(ApprovalRow.__struct_fields__)
_PLACES: Final = ", ".join("?" * len(ApprovalRow.__struct_fields__))


def put(conn: sqlite3.Connection, row: ApprovalRow) -> None:
    """Write the row whole (autocommit: one statement is its own transaction)."""
    conn.execute(
        f"INSERT OR REPLACE INTO approvals ({COLUMNS}) VALUES ({_PLACES})",  # noqa: S608
        msgspec.structs.astuple(row),
    )


def of_run(conn: sqlite3.Connection, run_id: str) -> list[ApprovalRow]:
    """A run's rows in the order they were asked."""
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM approvals WHERE run_id = ? ORDER BY asked_at, request_id",  # noqa: S608
        (run_id,),
    ).fetchall()
    fields = ApprovalRow.__struct_fields__
    out = []
    for row in rows:
        values = dict(zip(fields, row, strict=True))
        if values["arguments"] is not None:
            values["arguments"] = bytes(values["arguments"])
        out.append(ApprovalRow(**values))
    return out


def interrupt(conn: sqlite3.Connection, run_id: str, now: float) -> int:
    """Close a dead daemon's unanswered rows of ``run_id`` as denied ``by: interrupted``."""
    cur = conn.execute(
        "UPDATE approvals SET decision = 'deny', scope = 'once', by = 'interrupted',"
        " answered_at = ? WHERE run_id = ? AND decision IS NULL",
        (now, run_id),
    )
    return cur.rowcount


def delete_runs(conn: sqlite3.Connection, params: list[tuple[str]]) -> None:
    """Inside the prune's transaction: the rows of the runs it deletes."""
    conn.executemany("DELETE FROM approvals WHERE run_id = ?", params)
