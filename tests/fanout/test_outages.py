"""Redis stopped, killed, restarted, or down while the daemon itself restarts: the runs go on,
and Redis ends up with every frame exactly once, filled from the store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from redis.asyncio import Redis

import codelegate.daemon.fanout
from codelegate.policy.config import Config
from tests.daemon.conftest import Daemon, start_daemon, stop_daemon
from tests.fakes import CHATTY_CLAUDE
from tests.fanout.conftest import (
    RedisServer,
    expected_entries,
    fanout_config,
    first_entry,
    index,
    metric,
    publisher,
    replay,
    settled,
    stream,
)
from tests.reliability.conftest import post, wait_done

PARENT = {"tool_call_id": "call_fleet"}  # its provider_invocation is frame 1, before the gate


@pytest.fixture
def config(short_dir: Path, workspace: Path, redis_server: RedisServer) -> Config:
    """The chatty CLI: it prints nothing after init until its gate file exists."""
    return fanout_config(short_dir, workspace, redis_server.url, claude=CHATTY_CLAUDE)


async def gated_run(d: Daemon, redis: Redis, gate: Path, n: int = 1500) -> str:
    """A run whose first frame is in Redis and whose bulk waits for ``gate``."""
    run_id = await post(d, f"chatty n={n} pad=200 gate={gate}\nwork", parent=PARENT)
    await first_entry(redis, run_id)
    return run_id


async def test_a_stopped_redis_holds_up_no_run_and_misses_nothing(
    fdaemon: Daemon, redis: Redis, redis_server: RedisServer, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    run_id = await gated_run(fdaemon, redis, gate)
    redis_server.pause()
    try:
        gate.touch()
        # While Redis is stopped, the run runs to its end and its replay is whole.
        state = await wait_done(fdaemon, run_id)
        assert state["status"] == "completed"
        lines = await replay(fdaemon, run_id)
        assert len(lines) > 3000
        # Its last frames cannot be in Redis yet: queued, in flight, or left to the store.
        waiting = await metric(fdaemon, "codelegate_fanout_pending")
        behind = await metric(fdaemon, "codelegate_fanout_runs_behind")
        assert waiting + behind > 0
    finally:
        redis_server.resume()
    await settled(fdaemon)
    assert await stream(redis, run_id) == expected_entries(lines)
    assert [e["status"] for e in await index(redis)] == ["running", "completed"]
    assert await metric(fdaemon, "codelegate_fanout_pending") == 0


@pytest.mark.parametrize(
    "wipe", [False, True], ids=["redis-keeps-its-data", "redis-comes-back-empty"]
)
async def test_a_redis_killed_and_restarted_mid_run_gets_every_frame_once(
    fdaemon: Daemon, redis: Redis, redis_server: RedisServer, tmp_path: Path, wipe: bool
) -> None:
    gate = tmp_path / "gate"
    run_id = await gated_run(fdaemon, redis, gate)
    redis_server.kill(wipe=wipe)
    gate.touch()
    assert (await wait_done(fdaemon, run_id))["status"] == "completed"
    lines = await replay(fdaemon, run_id)
    await asyncio.to_thread(redis_server.start)
    await settled(fdaemon)
    assert await stream(redis, run_id) == expected_entries(lines)
    # One start and one end, also when the start entry was there before the kill.
    assert [e["status"] for e in await index(redis)] == ["running", "completed"]


async def made_while_redis_was_gone(
    config: Config, tmp_path: Path, redis_server: RedisServer, tasks: list[str]
) -> tuple[Daemon, list[str]]:
    """Runs of ``tasks`` made and finished by a daemon while Redis was gone, then Redis back
    and a second daemon on the same store (the caller stops it), and the runs' ids."""
    first = await start_daemon(config, tmp_path)
    try:
        redis_server.kill()
        runs = [await post(first, task) for task in tasks]
        for run_id in runs:
            await wait_done(first, run_id)
    finally:
        await stop_daemon(first)  # Redis is gone: these frames are only in the store
    await asyncio.to_thread(redis_server.start)
    return await start_daemon(config, tmp_path), runs


async def test_a_daemon_restarted_catches_up_the_runs_redis_missed(
    config: Config, tmp_path: Path, redis_server: RedisServer, redis: Redis
) -> None:
    tasks = [f"chatty n={n} pad=50\nwork" for n in (10, 300)]
    second, runs = await made_while_redis_was_gone(config, tmp_path, redis_server, tasks)
    try:
        await settled(second)
        for run_id in runs:
            # The replay of the store, which the first daemon sent its clients too.
            assert await stream(redis, run_id) == expected_entries(await replay(second, run_id))
        assert sorted((e["run_id"], e["status"]) for e in await index(redis)) == sorted(
            (run_id, status) for run_id in runs for status in ("running", "completed")
        )
    finally:
        await stop_daemon(second)


async def test_a_capped_run_far_behind_is_caught_up_page_by_page_under_its_own_seqs(
    config: Config,
    tmp_path: Path,
    redis_server: RedisServer,
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pages far smaller than the run, and a store that keeps only part of it: its stored seqs
    # jump from its first frames to its closing ones.
    monkeypatch.setattr(codelegate.daemon.fanout, "CATCH_UP_PAGE", 64)
    raw = msgspec.to_builtins(config)
    raw["limits"]["max_stored_frames"] = 1000
    capped = msgspec.convert(raw, Config)
    task = "chatty n=1500 pad=50\nwork"
    second, (run_id,) = await made_while_redis_was_gone(capped, tmp_path, redis_server, [task])
    try:
        await settled(second)
        stored = await replay(second, run_id)  # what the store kept
        seqs = [msgspec.json.decode(line)["seq"] for line in stored]
        assert len(seqs) < seqs[-1]  # the store skipped frames: the seqs jump
        assert await stream(redis, run_id) == [
            (f"{seq}-0".encode(), line) for seq, line in zip(seqs, stored, strict=True)
        ]
    finally:
        await stop_daemon(second)


async def test_a_daemon_stopped_while_redis_was_stopped_is_caught_up_by_the_next_one(
    config: Config,
    tmp_path: Path,
    redis_server: RedisServer,
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codelegate.daemon.fanout, "CLOSE_GRACE_S", 0.2)
    gate = tmp_path / "gate"
    first = await start_daemon(config, tmp_path)
    try:
        run_id = await gated_run(first, redis, gate)  # frame 1 is in Redis
        redis_server.pause()
        gate.touch()
        assert (await wait_done(first, run_id))["status"] == "completed"
        lines = await replay(first, run_id)
    finally:
        await stop_daemon(first)  # Redis stopped: it cannot have the rest
    redis_server.resume()  # it may still run what the first daemon had sent
    second = await start_daemon(config, tmp_path)  # the same store
    try:
        await settled(second)
        assert await stream(redis, run_id) == expected_entries(lines)
        assert [e["status"] for e in await index(redis)] == ["running", "completed"]
    finally:
        await stop_daemon(second)


async def test_a_run_caught_up_from_the_store_goes_on_live_after_its_catch_up(
    fdaemon: Daemon, redis: Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub = publisher(fdaemon)
    gate = tmp_path / "gate"
    monkeypatch.setattr(pub, "_max_backlog", 0)  # no room: frame 1 is left to the store
    run_id = await gated_run(fdaemon, redis, gate)
    await settled(fdaemon)  # caught up: the run is no longer behind
    assert pub.stats.deferred == 1
    monkeypatch.setattr(pub, "_max_backlog", codelegate.daemon.fanout.BACKLOG_MAX)
    gate.touch()
    assert (await wait_done(fdaemon, run_id))["status"] == "completed"
    await settled(fdaemon)
    lines = await replay(fdaemon, run_id)
    assert await stream(redis, run_id) == expected_entries(lines)
    assert pub.stats.deferred == 1  # everything after frame 1 went live, none from the store
    assert [e["status"] for e in await index(redis)] == ["running", "completed"]
