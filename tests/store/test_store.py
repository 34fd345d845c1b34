"""RunStore: round trip, restart, batching, pruning, concurrency from the loop, write failures."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import threading
from pathlib import Path

import msgspec
import pytest
import structlog
import structlog.testing

from codelegate.daemon.store import queries
from codelegate.daemon.store.queries import RunRecord
from codelegate.daemon.store.store import RunStore, StoreError
from tests.store.conftest import finished, frame, record


async def test_round_trip(store: RunStore) -> None:
    await store.create_run(record("r1", session_id="s-1", parent_tool_call_id="call_1"))
    for seq in range(1, 6):
        store.append_frame("r1", seq, frame("r1", seq))
    assert await store.frames_after("r1", 0) == [frame("r1", s) for s in range(1, 6)]
    assert await store.frames_after("r1", 3) == [frame("r1", 4), frame("r1", 5)]
    await store.finish_run(finished("r1", 2000.0, result=b'{"status":"completed"}'))
    rec = await store.get_run("r1")
    assert rec is not None
    assert (rec.status, rec.last_seq, rec.exit_code, rec.finished_at) == ("completed", 5, 0, 2000.0)
    assert rec.result == msgspec.Raw(b'{"status":"completed"}')
    assert rec.parent_tool_call_id == "call_1"
    assert await store.get_run("nope") is None
    assert await store.frames_after("nope", 0) == []


async def test_restart_gives_the_same_frames_bytes_and_seqs(db_path: str) -> None:
    first = await RunStore.open(db_path)
    await first.create_run(record("r1"))
    await first.create_run(record("r2", created_at=1001.0))
    for seq in range(1, 301):
        first.append_frame("r1", seq, frame("r1", seq))
    first.append_frame("r2", 1, frame("r2", 1))
    await first.finish_run(finished("r1", 1500.0))
    before = await first.frames_after("r1", 0)
    await first.close()  # r2 is left "running", as if the daemon died

    second = await RunStore.open(db_path)
    try:
        assert await second.frames_after("r1", 0) == before
        rec = await second.get_run("r1")
        assert rec is not None
        assert (rec.status, rec.last_seq) == ("completed", 300)
        assert [r.run_id for r in await second.live_runs()] == ["r2"]
        assert await second.frames_after("r2", 0) == [frame("r2", 1)]
    finally:
        await second.close()


async def test_frames_are_written_in_batches(db_path: str) -> None:
    store = await RunStore.open(db_path, flush_frames=256, flush_interval=60.0)
    try:
        await store.create_run(record("r1"))
        for seq in range(1, 1001):
            store.append_frame("r1", seq, frame("r1", seq))
        await store.flush()
        # 3 full batches of 256 on size, the remaining 232 on flush: 4 transactions, not 1000.
        assert store.batches_written == 4
        assert store.frames_written == 1000
        assert len(await store.frames_after("r1", 0)) == 1000
    finally:
        await store.close()


async def test_a_batch_is_written_on_the_timer_without_a_flush(db_path: str) -> None:
    store = await RunStore.open(db_path, flush_interval=0.01)
    try:
        await store.create_run(record("r1"))
        store.append_frame("r1", 1, frame("r1", 1))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while store.frames_written < 1:
            assert loop.time() < deadline, "the timer never flushed"
            await asyncio.sleep(0.01)
        assert store.unwritten == 0
    finally:
        await store.close()


async def test_close_flushes_the_buffer(db_path: str) -> None:
    store = await RunStore.open(db_path, flush_interval=60.0)
    await store.create_run(record("r1"))
    store.append_frame("r1", 1, frame("r1", 1))
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError):
        store.append_frame("r1", 2, frame("r1", 2))
    again = await RunStore.open(db_path)
    try:
        assert await again.frames_after("r1", 0) == [frame("r1", 1)]
    finally:
        await again.close()


async def test_sessions_are_owned_by_the_issuing_runs_workspace(store: RunStore) -> None:
    await store.create_run(record("r1", session_id="s-1", cwd="/srv/a"))
    # A resumed run of the same session does not take ownership.
    await store.create_run(record("r2", session_id="s-1", cwd="/srv/b", resumed=True))
    assert await store.session_owner("s-1") == "/srv/a"
    assert await store.session_owner("s-unknown") is None


async def test_list_runs_newest_first(store: RunStore) -> None:
    for i in range(5):
        await store.create_run(record(f"r{i}", created_at=1000.0 + i))
    assert [r.run_id for r in await store.list_runs(3)] == ["r4", "r3", "r2"]


async def test_a_page_of_runs_continues_past_its_cursor_ties_included_and_stops_at_its_bytes(
    store: RunStore,
) -> None:
    # Runs started in the same instant are told apart by their ids, so that a page ending
    # among them leaves none out and none twice.
    for run_id in ("a", "b", "c"):
        await store.create_run(record(run_id, created_at=2000.0))
    await store.create_run(record("older", created_at=1000.0))
    page, more = await store.runs_page(2)
    assert ([r.run_id for r in page], more) == (["c", "b"], True)
    page, more = await store.runs_page(2, before=(2000.0, "b"))
    assert ([r.run_id for r in page], more) == (["a", "older"], False)
    # Bytes: the cwds (and results) of the rows read stop the page; the first row is taken
    # whatever its size.
    cwd = len(record("x").cwd)
    page, more = await store.runs_page(10, max_bytes=2 * cwd)
    assert ([r.run_id for r in page], more) == (["c", "b"], True)
    page, more = await store.runs_page(10, before=(2000.0, "b"), max_bytes=1)
    assert ([r.run_id for r in page], more) == (["a"], True)


async def test_runs_listed_without_results_keep_all_else_they_hold(store: RunStore) -> None:
    result = msgspec.json.encode({"result": secrets.token_hex(1024)})
    await store.create_run(record("r1", session_id="s-1"))
    await store.finish_run(finished("r1", 1001.0, result=result))
    [whole] = await store.list_runs(5)
    [bare] = await store.list_runs(5, results=False)
    assert whole.result is not None
    assert bytes(whole.result) == result
    assert bare == msgspec.structs.replace(whole, result=None)


async def test_duplicate_run_id_is_a_store_error(store: RunStore) -> None:
    await store.create_run(record("r1"))
    with pytest.raises(StoreError):
        await store.create_run(record("r1"))


async def test_prune_by_age_and_count_keeps_running_runs(store: RunStore) -> None:
    day = 86400.0
    now = 100 * day
    await store.create_run(record("old", created_at=now - 40 * day, session_id="s-old"))
    await store.finish_run(finished("old", now - 40 * day))
    await store.create_run(record("live", created_at=now - 50 * day))  # still running
    for i in range(4):
        rid = f"new{i}"
        await store.create_run(record(rid, created_at=now - day + i, session_id=f"s-{i}"))
        store.append_frame(rid, 1, frame(rid, 1))
        await store.finish_run(finished(rid, now - day + i))
    store.append_frame("old", 1, frame("old", 1))

    assert await store.prune(30, 1000, now=now) == 1  # "old" is past retention
    assert await store.get_run("old") is None
    assert await store.frames_after("old", 0) == []
    assert await store.session_owner("s-old") is None

    assert await store.prune(30, 2, now=now) == 2  # only the newest 2 finished runs are kept
    kept = {r.run_id for r in await store.list_runs(100)}
    assert kept == {"live", "new2", "new3"}
    assert await store.session_owner("s-3") == "/srv/workspaces/demo"
    assert await store.session_owner("s-0") is None


async def test_a_resumed_sessions_owner_survives_while_a_run_of_it_is_kept(
    store: RunStore,
) -> None:
    await store.create_run(record("first", created_at=1.0, session_id="s-1"))
    await store.finish_run(finished("first", 2.0))
    await store.create_run(record("again", created_at=3.0, session_id="s-1", resumed=True))
    await store.finish_run(finished("again", 4.0))
    assert await store.prune(30, 1, now=5.0) == 1
    assert await store.session_owner("s-1") == "/srv/workspaces/demo"


async def test_concurrent_access_from_the_loop(store: RunStore) -> None:
    runs = [f"r{i}" for i in range(8)]
    for rid in runs:
        await store.create_run(record(rid))

    async def producer(rid: str) -> None:
        for seq in range(1, 501):
            store.append_frame(rid, seq, frame(rid, seq))
            if seq % 50 == 0:
                await asyncio.sleep(0)  # interleave with the other runs and the readers

    async def reader(rid: str) -> None:
        for _ in range(20):
            got = await store.frames_after(rid, 0)
            # Whatever has been appended so far is visible, in order and gapless.
            assert got == [frame(rid, s) for s in range(1, len(got) + 1)]
            await store.list_runs(5)

    await asyncio.gather(*(producer(r) for r in runs), *(reader(r) for r in runs))
    await store.flush()
    for rid in runs:
        assert await store.frames_after(rid, 0) == [frame(rid, s) for s in range(1, 501)]
        rec = await store.get_run(rid)
        assert rec is not None
        assert rec.last_seq == 500


async def test_database_work_never_runs_on_the_event_loop_thread(db_path: str) -> None:
    store = await RunStore.open(db_path)
    threads: set[int] = set()
    await store._call(
        lambda conn: conn.set_trace_callback(lambda _sql: threads.add(threading.get_ident()))
    )
    try:
        await store.create_run(record("r1"))
        store.append_frame("r1", 1, frame("r1", 1))
        await store.frames_after("r1", 0)
        await store.prune(30, 10)
        await store.flush()
    finally:
        await store.close()
    assert threads
    assert threading.get_ident() not in threads
    assert len(threads) == 1


async def test_a_write_failure_surfaces_and_loses_nothing(db_path: str) -> None:
    errors: list[BaseException] = []
    store = await RunStore.open(db_path, on_error=errors.append, flush_interval=60.0)
    try:
        await store.create_run(record("r1"))
        store.append_frame("r1", 1, frame("r1", 1))
        await store.flush()
        # The disk turns read-only under the daemon.
        await store._call(lambda conn: conn.execute("PRAGMA query_only = 1"))
        store.append_frame("r1", 2, frame("r1", 2))  # the run carries on: no exception here
        with pytest.raises(StoreError, match="not written"):
            await store.flush()
        assert errors
        assert isinstance(errors[0], sqlite3.Error)
        assert store.write_errors >= 1
        # Readers still see the unwritten frame, merged from the buffer.
        assert await store.frames_after("r1", 0) == [frame("r1", 1), frame("r1", 2)]
        # The disk comes back: the retried batch lands, nothing is lost.
        await store._call(lambda conn: conn.execute("PRAGMA query_only = 0"))
        await store.flush()
        assert store.unwritten == 0
    finally:
        await store.close()
    again = await RunStore.open(db_path)
    try:
        assert await again.frames_after("r1", 0) == [frame("r1", 1), frame("r1", 2)]
    finally:
        await again.close()


async def test_a_connection_closed_underneath_surfaces_as_store_error(db_path: str) -> None:
    errors: list[BaseException] = []
    store = await RunStore.open(db_path, on_error=errors.append)
    await store.create_run(record("r1"))
    await store._call(lambda conn: conn.close())
    store.append_frame("r1", 1, frame("r1", 1))
    with pytest.raises(StoreError):
        await store.flush()
    with pytest.raises(StoreError):
        await store.get_run("r1")
    assert errors
    await store.close()  # still closes cleanly; the failure goes to on_error


async def test_opening_an_unusable_path_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StoreError, match="cannot open"):
        await RunStore.open(str(blocker / "sub" / "db"))


async def test_the_database_is_in_wal_mode(store: RunStore) -> None:
    rows = await store._call(lambda conn: conn.execute("PRAGMA journal_mode").fetchall())
    assert rows == [("wal",)]


async def test_the_runs_table_has_a_column_for_every_field_of_the_record(store: RunStore) -> None:
    rows = await store._call(lambda conn: conn.execute("PRAGMA table_info(runs)").fetchall())
    assert sorted(row[1] for row in rows) == sorted(RunRecord.__struct_fields__)


async def test_a_final_status_that_cannot_be_written_is_kept_and_retried(db_path: str) -> None:
    errors: list[BaseException] = []
    store = await RunStore.open(db_path, on_error=errors.append)
    try:
        await store.create_run(record("r1"))
        store.append_frame("r1", 1, frame("r1", 1))
        await store._call(lambda conn: conn.execute("PRAGMA query_only = 1"))

        with pytest.raises(StoreError, match="final status of r1"):
            await store.finish_run(finished("r1", 2000.0, result=b'{"status":"completed"}'))

        # Readers already see the outcome; the run is not "live" any more.
        rec = await store.get_run("r1")
        assert rec is not None
        assert (rec.status, rec.exit_code, rec.last_seq) == ("completed", 0, 1)
        assert [r.status for r in await store.list_runs(5)] == ["completed"]
        assert await store.live_runs() == []
        # Space comes back: the retry timer writes it without anyone asking.
        await store._call(lambda conn: conn.execute("PRAGMA query_only = 0"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while store.unwritten:
            assert loop.time() < deadline, "the retry never happened"
            await asyncio.sleep(0.05)
        assert errors
    finally:
        await store.close()
    again = await RunStore.open(db_path)
    try:
        rec = await again.get_run("r1")
        assert rec is not None
        answer = ("completed", msgspec.Raw(b'{"status":"completed"}'), 1)
        assert (rec.status, rec.result, rec.last_seq) == answer
        assert await again.live_runs() == []
    finally:
        await again.close()


async def test_frames_other_runs_append_during_a_flush_are_not_a_failure(store: RunStore) -> None:
    await store.create_run(record("r1"))
    await store.create_run(record("r2", created_at=1001.0))
    store.append_frame("r1", 1, frame("r1", 1))
    # Another run appends while this flush waits for the store thread.
    asyncio.get_running_loop().call_soon(store.append_frame, "r2", 1, frame("r2", 1))
    await store.flush()
    await store.flush()
    assert await store.frames_after("r2", 0) == [frame("r2", 1)]


async def test_the_database_files_are_private_to_the_daemons_user(tmp_path: Path) -> None:
    path = tmp_path / "state" / "runs.db"
    store = await RunStore.open(str(path))
    try:
        await store.create_run(record("r1"))
        store.append_frame("r1", 1, frame("r1", 1))
        await store.flush()
        for name in ("runs.db", "runs.db-wal", "runs.db-shm"):
            assert (path.parent / name).stat().st_mode & 0o077 == 0, name
    finally:
        await store.close()


async def test_a_work_rooms_counters_survive_a_restart_and_a_prune_and_never_go_back(
    db_path: str,
) -> None:
    store = await RunStore.open(db_path)
    try:
        assert await store.invocation_marks("call_1") == (0, 0)
        await store.create_run(record("r1", parent_tool_call_id="call_1"))
        await store.finish_run(finished("r1", 2.0))
        await store.advance_invocation("call_1", 5, 3)
        await store.advance_invocation("call_1", 4, 7)  # an older run's end, written late
        await store.advance_invocation("call_2", 1, 1)
    finally:
        await store.close()
    store = await RunStore.open(db_path)
    try:
        assert await store.invocation_marks("call_1") == (5, 7)
        assert await store.prune(0, 0, now=10.0) == 1
        assert await store.invocation_marks("call_1") == (5, 7)
        assert await store.invocation_marks("call_2") == (1, 1)
    finally:
        await store.close()


async def test_a_flooding_run_keeps_another_runs_record_and_frames_one_batch_away(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[set[str]] = []  # the runs in each batch, in the order written
    real = queries.write_batch

    def write_batch(conn: sqlite3.Connection, frames: list[queries.Frame], finishes: dict) -> None:  # type: ignore[type-arg]
        batches.append({run_id for run_id, _, _ in frames})
        real(conn, frames, finishes)

    monkeypatch.setattr(queries, "write_batch", write_batch)
    store = await RunStore.open(db_path, flush_frames=256, flush_interval=60.0)
    try:
        await store.create_run(record("flood"))
        for seq in range(1, 20_001):  # 78 batches' worth, buffered at once
            store.append_frame("flood", seq, frame("flood", seq))
        await asyncio.sleep(0)  # the writer has its first batch in flight
        # A new run's record is written behind at most that one batch, not the whole flood.
        await store.create_run(record("quiet", created_at=1001.0))
        assert store.batches_written <= 2
        # Batches written or in flight before the quiet run's frame comes:
        ahead = store.batches_written + (store._buffers.inflight is not None)
        store.append_frame("quiet", 1, frame("quiet", 1))
        await store.flush()
        # Its frame went with the next batch (round-robin), not after the flood's 19,000 others.
        first = next(i for i, runs in enumerate(batches) if "quiet" in runs)
        assert first <= ahead
        assert len(await store.frames_after("flood", 0)) == 20_000
    finally:
        await store.close()


async def test_a_finish_never_lands_before_the_frames_of_a_failed_batch(db_path: str) -> None:
    errors: list[BaseException] = []
    store = await RunStore.open(db_path, on_error=errors.append, flush_frames=256)
    await store.create_run(record("r1"))
    # A real "disk full": the file may not grow; frames need new pages, the finish does not.
    pages = (await store._call(queries.select, "PRAGMA page_count"))[0][0]
    await store._call(lambda conn: conn.execute(f"PRAGMA max_page_count = {pages}"))
    for seq in range(1, 257):  # exactly one batch: in flight when the finish comes
        store.append_frame("r1", seq, frame("r1", seq) + b" " * 2000)
    with pytest.raises(StoreError, match="final status of r1 not written"):
        await store.finish_run(finished("r1", 2000.0, result=b'{"status":"completed"}'))
    assert any("full" in str(e) for e in errors)
    with structlog.testing.capture_logs() as logs:
        await store.close()  # never raises: says what it could not write
    (lost,) = [e for e in logs if e["event"] == "store_unflushed"]
    assert (lost["frames"], lost["final_statuses"], lost["runs"]) == (256, 1, ["r1"])
    again = await RunStore.open(db_path)
    try:
        rec = await again.get_run("r1")
        assert rec is not None
        # Neither landed: the run reads as running (recovery closes it as interrupted), never
        # "completed" with its frames missing.
        assert (rec.status, rec.last_seq) == ("running", 0)
        assert await again.frames_after("r1", 0) == []
    finally:
        await again.close()


async def test_a_run_past_its_cap_stores_its_first_frames_and_its_closing_ones(
    db_path: str,
) -> None:
    store = await RunStore.open(db_path, max_frames=10, max_bytes=1 << 20)
    try:
        await store.create_run(record("r1"))
        kept = [store.append_frame("r1", seq, frame("r1", seq)) for seq in range(1, 21)]
        assert kept == [True] * 10 + [False] * 10
        assert store.not_stored("r1") == 10
        assert store.append_frame("r1", 21, frame("r1", 21), always=True)
        await store.finish_run(finished("r1", 2000.0))
        page = await store.frames_page("r1", 0, 100)
        assert [seq for seq, _ in page] == [*range(1, 11), 21]
        assert [seq for seq, _ in await store.frames_page("r1", 5, 3)] == [6, 7, 8]
        rec = await store.get_run("r1")
        assert rec is not None
        assert rec.last_seq == 21
        # The byte cap likewise.
        await store.create_run(record("r2", created_at=1001.0))
        big = b"x" * 400_000
        assert [store.append_frame("r2", s, big) for s in (1, 2, 3)] == [True, True, False]
    finally:
        await store.close()


async def test_frames_appended_together_stop_at_the_cap_where_one_at_a_time_would(
    db_path: str,
) -> None:
    store = await RunStore.open(db_path, max_frames=10, max_bytes=1 << 20)
    try:
        await store.create_run(record("r1"))
        rows = [("r1", seq, frame("r1", seq)) for seq in range(1, 9)]
        assert store.append_frames("r1", rows) == 0  # all within the cap
        rows = [("r1", seq, frame("r1", seq)) for seq in range(9, 15)]
        always = [False, False, False, True, False, True]  # seqs 12 and 14 must be kept
        assert store.append_frames("r1", rows, always) == 2  # 11 and 13: past the cap
        assert store.not_stored("r1") == 2
        assert store.append_frames("r1", [("r1", 15, frame("r1", 15))]) == 1
        assert store.append_frames("r1", [("r1", 16, frame("r1", 16))], always=True) == 0
        await store.flush()
        page = await store.frames_page("r1", 0, 100)
        assert page == [(seq, frame("r1", seq)) for seq in (*range(1, 11), 12, 14, 16)]
        # The byte cap likewise, within one batch.
        await store.create_run(record("r2", created_at=1001.0))
        big = [("r2", s, b"x" * 400_000) for s in (1, 2, 3)]
        assert store.append_frames("r2", big) == 1
        assert [seq for seq, _ in await store.frames_page("r2", 0, 10)] == [1, 2]
    finally:
        await store.close()


@pytest.mark.parametrize("count", [1, 3, 4, 21, 64, 85, 130, 256, 341])
def test_a_batch_of_any_size_is_written_whole_in_order_and_a_retry_keeps_what_is_there(
    tmp_path: Path, count: int
) -> None:
    conn = queries.connect(str(tmp_path / "runs.db"))
    try:
        first = [("r1", seq, frame("r1", seq)) for seq in range(1, count + 1)]
        queries.write_batch(conn, first, {})
        # A retry after an ambiguous failure: the same rows (changed bytes would not replace
        # them) and new ones after.
        again = [(r, seq, b"retried") for r, seq, _ in first] + [("r1", count + 1, b"new")]
        queries.write_batch(conn, again, {})
        rows = conn.execute("SELECT seq, data FROM frames ORDER BY rowid").fetchall()
        assert rows == [(seq, data) for _, seq, data in first] + [(count + 1, b"new")]
    finally:
        conn.close()


async def test_a_full_disk_is_retried_on_the_timer_not_on_every_new_frame(db_path: str) -> None:
    errors: list[BaseException] = []
    store = await RunStore.open(db_path, on_error=errors.append, flush_frames=16)
    try:
        await store.create_run(record("r1"))
        await store._call(lambda conn: conn.execute("PRAGMA query_only = 1"))
        for seq in range(1, 17):
            store.append_frame("r1", seq, frame("r1", seq))
        with structlog.testing.capture_logs() as first, pytest.raises(StoreError):
            await store.flush()
        assert [e["event"] for e in first] == ["store_write_failed"]
        failures = store.write_errors
        for seq in range(17, 2001):  # 124 batches' worth while the disk is still full
            store.append_frame("r1", seq, frame("r1", seq))
        assert store._writer is None  # no write started: the retry waits for its timer
        assert store.write_errors == failures
        with structlog.testing.capture_logs() as logs:
            with pytest.raises(StoreError):
                await store.flush()  # still full: a second failure, not logged again
            await store._call(lambda conn: conn.execute("PRAGMA query_only = 0"))
            await store.flush()
        assert len(await store.frames_after("r1", 0)) == 2000
        assert [e["event"] for e in logs] == ["store_write_recovered"]
    finally:
        await store.close()
