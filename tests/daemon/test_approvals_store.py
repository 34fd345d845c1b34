"""The approvals table: whole rows in order, a dead daemon's open rows closed, pruned with runs."""

from __future__ import annotations

from pathlib import Path

import msgspec

from codelegate.daemon.store.approvals import ApprovalRow
from codelegate.daemon.store.store import RunStore
from tests.store.conftest import finished, record


def asked(run_id: str, request_id: str, at: float) -> ApprovalRow:
    return ApprovalRow(
        run_id=run_id,
        request_id=request_id,
        kind="permission",
        tool="Write",
        tool_id="claude:toolu_1",
        asked_at=at,
        expires_at=at + 120,
        arguments=msgspec.json.encode({"file_path": "n.txt"}),
    )


async def test_the_last_version_of_a_row_written_wins_and_rows_list_in_asking_order(
    tmp_path: Path,
) -> None:
    store = await RunStore.open(str(tmp_path / "s.db"))
    try:
        await store.create_run(record("r1"))
        first, second = asked("r1", "r1:5", 10.0), asked("r1", "r1:2", 20.0)
        store.put_approval(second)
        store.put_approval(first)
        answered = msgspec.structs.replace(
            first, decision="allow", scope="once", by="client", answered_at=11.0
        )
        store.put_approval(answered)  # not awaited: the store's one thread keeps the order
        rows = await store.approvals("r1")
        assert rows == [answered, second]
        assert await store.approvals("other") == []
    finally:
        await store.close()


async def test_a_dead_daemons_unanswered_rows_close_as_interrupted_and_answered_ones_stay(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "s.db")
    store = await RunStore.open(path)
    await store.create_run(record("r1"))
    done = msgspec.structs.replace(
        asked("r1", "r1:3", 1.0), decision="deny", scope="once", by="timeout", answered_at=2.0
    )
    store.put_approval(done)
    store.put_approval(asked("r1", "r1:9", 3.0))
    await store.close()  # the rows survive the daemon
    store = await RunStore.open(path)
    try:
        assert await store.interrupt_approvals("r1", 50.0) == 1
        rows = {r.request_id: r for r in await store.approvals("r1")}
        assert rows["r1:3"] == done
        left = rows["r1:9"]
        assert (left.decision, left.scope, left.by, left.answered_at) == (
            "deny",
            "once",
            "interrupted",
            50.0,
        )
    finally:
        await store.close()


async def test_a_pruned_runs_approvals_go_with_it(tmp_path: Path) -> None:
    store = await RunStore.open(str(tmp_path / "s.db"))
    try:
        for at, run_id in enumerate(("older", "newest")):
            await store.create_run(record(run_id, created_at=float(at)))
            store.put_approval(asked(run_id, f"{run_id}:1", float(at)))
            await store.finish_run(finished(run_id, float(at)))
        assert await store.prune(30, 1, now=5.0) == 1
        assert await store.approvals("older") == []
        assert [r.request_id for r in await store.approvals("newest")] == ["newest:1"]
    finally:
        await store.close()
