"""Fixtures for ``[fanout]``: a real ``redis-server`` on loopback, daemons publishing to it.

Each test gets its own Redis (a free port, its own directory, append-only file fsynced on every
write, so that a killed and restarted Redis keeps what it acknowledged, like a production one).
Readiness and waits are events (Redis's "Ready" line, the publisher's ``settled``, a blocking
XREAD), never sleeps.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

import codelegate.daemon.fanout
import codelegate.daemon.fanout_redis
from codelegate.daemon.fanout import Publisher
from codelegate.daemon.fanout_keys import stream_key
from codelegate.daemon.serving.state import STATE
from codelegate.policy.config import Config
from tests.conftest import unavailable
from tests.daemon.conftest import (
    BASE,
    Daemon,
    make_config,
    start_daemon,
    stop_daemon,
)
from tests.fanout.redis_server import RedisServer
from tests.reliability.conftest import post, wait_done

__all__ = ["RedisServer"]

PREFIX = "cltest"
SETTLE_S = 60.0  # bound on waiting for Redis to hold everything (fails the test, never sleeps)


def _redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        unavailable("redis-server is not installed (run `make test`)")
    return path


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(_redis_server(), tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A client of the test's Redis (bytes in, bytes out)."""
    # Reconnects by itself after the test restarts Redis (a dead connection is retried).
    client = Redis.from_url(
        redis_server.url,
        retry=Retry(NoBackoff(), 2),
        retry_on_error=[RedisConnectionError],
    )
    yield client
    await client.aclose()


@pytest.fixture(autouse=True)
def quick_failover(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped Redis is noticed in half a second, and retried often (production: 5 s, 2 s)."""
    monkeypatch.setattr(codelegate.daemon.fanout_redis, "SOCKET_TIMEOUT_S", 0.5)
    monkeypatch.setattr(codelegate.daemon.fanout, "RETRY_MAX_S", 0.2)


def fanout_config(
    short_dir: Path,
    workspace: Path,
    url: str,
    *,
    host_id: str = "host-a",
    claude: str | None = None,
    **fanout: Any,
) -> Config:
    raw = msgspec.to_builtins(make_config(short_dir, workspace, policy={"max_concurrent_runs": 8}))
    if claude is not None:
        raw["claude"]["path"] = claude
    raw["fanout"] = {"redis_url": url, "stream_prefix": PREFIX, "host_id": host_id, **fanout}
    return msgspec.convert(raw, Config)


@pytest.fixture
def config(short_dir: Path, workspace: Path, redis_server: RedisServer) -> Config:
    return fanout_config(short_dir, workspace, redis_server.url)


@pytest.fixture
async def fdaemon(config: Config, tmp_path: Path) -> AsyncIterator[Daemon]:
    """A daemon in-process (fake CLI) publishing to the test's Redis."""
    d = await start_daemon(config, tmp_path)
    yield d
    await stop_daemon(d)


def publisher(d: Daemon) -> Publisher:
    pub = d.handle.app[STATE].fanout
    assert pub is not None
    return pub


async def settled(d: Daemon) -> None:
    """Wait (bounded) until Redis holds every frame the daemon's publisher has seen."""
    await asyncio.wait_for(publisher(d).settled(), SETTLE_S)


async def stream(redis: Redis, run_id: str) -> list[tuple[bytes, bytes]]:
    """The run's stream: (entry id, frame JSON) in order."""
    entries = await redis.xrange(stream_key(PREFIX, run_id))
    return [(entry_id, fields[b"frame"]) for entry_id, fields in entries]


async def replay(d: Daemon, run_id: str) -> list[bytes]:
    """The run's NDJSON replay, line by line, as bytes."""
    async with d.http.get(f"{BASE}/v1/runs/{run_id}/events") as resp:
        assert resp.status == 200
        return (await resp.read()).splitlines()


async def published(d: Daemon, task: str) -> tuple[str, list[bytes]]:
    """Start a run and wait until it is done and on Redis: its id and its NDJSON replay."""
    run_id = await post(d, task)
    await wait_done(d, run_id)
    await settled(d)
    return run_id, await replay(d, run_id)


def expected_entries(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """What the stream must hold for a replay: entry ``<seq>-0`` = line ``seq``, from 1."""
    return [(f"{i}-0".encode(), line) for i, line in enumerate(lines, start=1)]


async def index(redis: Redis) -> list[dict[str, str]]:
    """The fleet index's entries, decoded."""
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in await redis.xrange(f"{PREFIX}:runs")
    ]


async def first_entry(redis: Redis, run_id: str) -> None:
    """Block (bounded) until the run's stream has its first entry."""
    answer = await redis.xread({stream_key(PREFIX, run_id): "0-0"}, count=1, block=30_000)
    assert answer, "no frame of the run reached Redis"


async def metric(d: Daemon, name: str) -> float:
    async with d.http.get(f"{BASE}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")
