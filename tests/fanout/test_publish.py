"""Every frame on its run's stream, under its seq, byte-equal to the replay; the fleet index."""

from __future__ import annotations

import msgspec
import pytest
from redis.asyncio import Redis

import codelegate.daemon.fanout
import codelegate.daemon.fanout_keys
from codelegate.daemon.deliveries import Batch, Delivery
from tests.daemon.conftest import Daemon, start_daemon, stop_daemon
from tests.fanout.conftest import (
    expected_entries,
    index,
    metric,
    published,
    publisher,
    settled,
    stream,
)
from tests.reliability.conftest import post, wait_done


async def test_every_frame_is_on_the_runs_stream_gapless_and_byte_equal_to_the_replay(
    fdaemon: Daemon, redis: Redis
) -> None:
    run_id, lines = await published(fdaemon, "fake: tools n=1500\nflood")
    assert len(lines) > 1500
    assert await stream(redis, run_id) == expected_entries(lines)


async def test_the_index_has_each_runs_start_and_end_with_host_status_and_invocation(
    fdaemon: Daemon, redis: Redis
) -> None:
    plain = await post(fdaemon, "fake: normal\nhello")
    child = await post(fdaemon, "fake: normal\nhello", parent={"tool_call_id": "call_42"})
    for run_id in (plain, child):
        await wait_done(fdaemon, run_id)
    await settled(fdaemon)
    entries = await index(redis)
    assert sorted((e["run_id"], e["status"]) for e in entries) == sorted(
        [(plain, "running"), (plain, "completed"), (child, "running"), (child, "completed")]
    )
    assert {e["host_id"] for e in entries} == {"host-a"}
    assert all("invocationId" not in e for e in entries if e["run_id"] == plain)
    assert all(e["invocationId"] == "claude_code:call_42" for e in entries if e["run_id"] == child)


async def test_a_frame_handed_over_twice_is_refused_by_redis_not_doubled(
    fdaemon: Daemon, redis: Redis
) -> None:
    run_id, lines = await published(fdaemon, "fake: tools n=50\nx")
    pub = publisher(fdaemon)
    before = pub.stats.duplicates
    # The run is complete and forgotten: the publisher takes it as new and sends it all again.
    again = [Delivery(run_id, i, line) for i, line in enumerate(lines, start=1)]
    pub.write_batch(Batch(run_id, again))
    await settled(fdaemon)
    assert pub.stats.duplicates - before == len(lines)
    assert await stream(redis, run_id) == expected_entries(lines)
    assert [e["status"] for e in await index(redis)] == ["running", "completed"]


async def test_with_no_room_in_the_backlog_every_frame_comes_from_the_store(
    fdaemon: Daemon, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub = publisher(fdaemon)
    monkeypatch.setattr(pub, "_max_backlog", 0)
    run_id, lines = await published(fdaemon, "fake: tools n=400\nx")
    assert pub.stats.deferred >= len(lines) - 1  # live frames of a run behind are skipped
    assert await stream(redis, run_id) == expected_entries(lines)
    assert [e["status"] for e in await index(redis)] == ["running", "completed"]


async def test_metrics_count_published_pending_and_failed_entries(
    fdaemon: Daemon, redis: Redis
) -> None:
    _, lines = await published(fdaemon, "fake: tools n=20\nx")
    n = len(lines)
    assert await metric(fdaemon, "codelegate_fanout_published_total") == n
    assert await metric(fdaemon, "codelegate_fanout_pending") == 0
    assert await metric(fdaemon, "codelegate_fanout_failed_total") == 0
    assert await metric(fdaemon, "codelegate_fanout_runs_behind") == 0
    assert await metric(fdaemon, "codelegate_fanout_index_entries_total") == 2


async def test_without_a_fanout_section_nothing_is_published(
    config: msgspec.Struct, tmp_path: object, redis: Redis
) -> None:
    plain = msgspec.structs.replace(config, fanout=None)
    d = await start_daemon(plain, tmp_path)  # type: ignore[arg-type]
    try:
        run_id = await post(d, "fake: normal\nhello")
        await wait_done(d, run_id)
        async with d.http.get("http://codelegate/metrics") as resp:
            assert "codelegate_fanout" not in await resp.text()
    finally:
        await stop_daemon(d)
    assert await redis.keys("*") == []


def test_entry_ids_carry_the_seq() -> None:
    assert codelegate.daemon.fanout_keys.seq_of(b"17-0") == 17
    assert codelegate.daemon.fanout_keys.seq_of("3-0") == 3
