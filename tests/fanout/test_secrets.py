"""The Redis password in ``[fanout] redis_url`` works and is never shown: not in a log line of
the served daemon (also while Redis is unreachable), nor in any HTTP answer."""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.fanout.conftest import PREFIX, expected_entries
from tests.fanout.redis_server import RedisServer
from tests.reliability.served import Served, write_config


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="clfs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_redis_password_reaches_no_log_line_and_no_answer(
    tmp_path: Path, state: Path
) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (run `make test`)")
    password = secrets.token_hex(20)
    server = RedisServer(binary, tmp_path / "redis", password=password)
    server.start()
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    fanout = f'[fanout]\nredis_url = {json.dumps(server.url)}\nstream_prefix = "{PREFIX}"\n'
    served = Served(write_config(state, workspace, extra=fanout), state, home)
    client = Redis.from_url(server.url)
    answers: list[bytes] = []
    try:
        await served.start()
        assert served.http is not None
        status, started = await served.json("POST", "/v1/runs", json={"task": "fake: normal\nx"})
        assert status == 202, started
        run_id = started["run_id"]
        key = f"{PREFIX}:run:{run_id}"
        # Authenticated publishing works: block until the run_result entry is in Redis.
        last = "0-0"
        while True:
            got = await client.xread({key: last}, block=30_000)
            assert got, "the run's frames did not reach Redis"
            last = got[0][1][-1][0]
            if b'"type":"run_result"' in got[0][1][-1][1][b"frame"]:
                break
        async with served.http.get(f"http://codelegate/v1/runs/{run_id}/events") as resp:
            lines = (await resp.read()).splitlines()
        entries = [(i, f[b"frame"]) for i, f in await client.xrange(key)]
        assert entries == expected_entries(lines)
        # Redis gone: the publisher's errors are logged, and must not name the password either.
        await client.aclose()
        server.stop()
        status, started = await served.json("POST", "/v1/runs", json={"task": "fake: normal\nx"})
        assert status == 202
        for path in ("/metrics", "/healthz", "/v1/runs", f"/v1/runs/{run_id}"):
            async with served.http.get(f"http://codelegate{path}") as resp:
                answers.append(await resp.read())
    finally:
        await served.stop()
        server.stop()
    log = served.log.read_bytes()
    assert b"fanout_started" in log
    assert b"fanout_unavailable" in log  # the error path really was taken
    for where, blob in {"log": log, "http": b"\n".join(answers)}.items():
        assert password.encode() not in blob, f"the Redis password is in the {where}"
