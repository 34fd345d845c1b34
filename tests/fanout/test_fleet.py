"""A fleet: two daemons publishing to one Redis, one reader following both; the CLI reader;
``doctor``; and a real Claude Code run, on Redis byte for byte as in its replay."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from redis.asyncio import Redis

from codelegate.daemon.cli import doctor
from codelegate.daemon.clients.fleet import FleetFrame, Positions, follow_fleet
from tests.daemon.conftest import Daemon, start_daemon, stop_daemon
from tests.e2e.conftest import E2E, e2e_config, workspace_tree
from tests.fakes import FAKE_CLAUDE
from tests.fanout.conftest import (
    PREFIX,
    RedisServer,
    expected_entries,
    fanout_config,
    index,
    replay,
    settled,
    stream,
)
from tests.reliability.conftest import post, wait_done
from tests.stub.anthropic import Stub, serve_stub, text, tool

REPO = Path(__file__).resolve().parents[2]


async def collect(frames: AsyncIterator[FleetFrame], runs: int) -> list[FleetFrame]:
    """Frames until ``runs`` runs are complete."""
    out: list[FleetFrame] = []
    done = 0
    async for frame in frames:
        out.append(frame)
        done += frame.last
        if done == runs:
            return out
    raise AssertionError("the reader ended")


async def test_two_daemons_publish_under_their_own_host_ids_and_one_reader_follows_both(
    workspace: Path, tmp_path: Path, redis_server: RedisServer, redis: Redis
) -> None:
    dirs = [Path(tempfile.mkdtemp(prefix="clf-")) for _ in range(2)]
    hosts = ["alpha", "beta"]
    daemons: list[Daemon] = []
    reader = asyncio.ensure_future(
        collect(follow_fleet(redis, PREFIX, Positions(), block_ms=1000), runs=4)
    )
    try:
        for folder, host in zip(dirs, hosts, strict=True):
            config = fanout_config(folder, workspace, redis_server.url, host_id=host)
            daemons.append(await start_daemon(config, tmp_path / host))
        runs = {
            await post(d, f"fake: tools n={n}\nwork"): (d, host)
            for d, host in zip(daemons, hosts, strict=True)
            for n in (300, 40)
        }
        for run_id, (d, _) in runs.items():
            await wait_done(d, run_id)
        got = await asyncio.wait_for(reader, 60)
        for d in daemons:
            await settled(d)
        for run_id, (d, host) in runs.items():
            lines = await replay(d, run_id)
            assert await stream(redis, run_id) == expected_entries(lines)
            mine = [f for f in got if f.run_id == run_id]
            assert [f.data for f in mine] == lines
            assert [f.seq for f in mine] == list(range(1, len(lines) + 1))
            assert {f.host_id for f in mine} == {host}
        entries = await index(redis)
        assert sorted((e["run_id"], e["host_id"], e["status"]) for e in entries) == sorted(
            (run_id, host, status)
            for run_id, (_, host) in runs.items()
            for status in ("running", "completed")
        )
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        for d in daemons:
            await stop_daemon(d)
        for folder in dirs:
            shutil.rmtree(folder, ignore_errors=True)


async def test_a_reader_resumes_with_its_positions_and_gets_nothing_twice(
    fdaemon: Daemon, redis: Redis
) -> None:
    first = await post(fdaemon, "fake: tools n=30\nx")
    await wait_done(fdaemon, first)
    positions = Positions()
    got = await collect(follow_fleet(redis, PREFIX, positions, block_ms=1000), runs=1)
    second = await post(fdaemon, "fake: tools n=30\nx")
    await wait_done(fdaemon, second)
    more = await collect(follow_fleet(redis, PREFIX, positions, block_ms=1000), runs=1)
    assert {f.run_id for f in got} == {first}
    assert {f.run_id for f in more} == {second}
    assert [f.data for f in more] == await replay(fdaemon, second)


async def test_watch_redis_prints_every_frame_of_the_fleet_as_ndjson(
    fdaemon: Daemon, redis_server: RedisServer
) -> None:
    runs = [await post(fdaemon, f"fake: tools n={n}\nx") for n in (5, 60)]
    for run_id in runs:
        await wait_done(fdaemon, run_id)
    expected = {run_id: await replay(fdaemon, run_id) for run_id in runs}
    watcher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "codelegate.daemon.cli",
        "watch",
        "--redis",
        redis_server.url,
        "--prefix",
        PREFIX,
        "--json",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert watcher.stdout is not None
    lines: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while sum(b'"type":"run_result"' in line for line in lines) < len(runs):
                line = await watcher.stdout.readline()
                assert line, (await watcher.stderr.read()).decode() if watcher.stderr else ""
                lines.append(line.rstrip(b"\n"))
    finally:
        watcher.terminate()
        await watcher.wait()
    for run_id, replayed in expected.items():
        assert [ln for ln in lines if json.loads(ln)["run_id"] == run_id] == replayed


def test_watch_redis_refuses_a_bad_url_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from codelegate.daemon.cli import main

    assert main(["watch", "--redis", "http://nope"]) == 2
    assert "redis://" in capsys.readouterr().err


def _doctor_config(path: Path, workspace: Path, url: str) -> Path:
    path.write_text(
        f"[claude]\npath = {json.dumps(FAKE_CLAUDE)}\n"
        f"[policy]\nworkspaces = [{json.dumps(str(workspace))}]\n"
        f"[fanout]\nredis_url = {json.dumps(url)}\nhost_id = 'doc-1'\n"
    )
    return path


async def test_doctor_checks_the_redis_connection_and_its_append_script(
    workspace: Path,
    tmp_path: Path,
    redis_server: RedisServer,
    redis: Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = _doctor_config(tmp_path / "good.toml", workspace, redis_server.url)
    # In a thread: doctor runs its own event loop.
    assert await asyncio.to_thread(doctor, str(good)) == 0
    out = capsys.readouterr().out
    assert f"fanout: {redis_server.url} prefix 'codelegate' host_id 'doc-1'" in out

    async def problem(config: Path, secret: str) -> str:
        assert await asyncio.to_thread(doctor, str(config)) == 1
        out = capsys.readouterr().out
        assert secret not in out
        return out

    # A user that may do everything but scripting, as some managed Redis services have it.
    password = secrets.token_hex(16)
    await redis.execute_command(
        "ACL", "SETUSER", "noscripts", "on", f">{password}", "~*", "&*", "+@all", "-@scripting"
    )
    url = redis_server.url.replace("redis://", f"redis://noscripts:{password}@")
    out = await problem(_doctor_config(tmp_path / "noscripts.toml", workspace, url), password)
    assert "PROBLEM fanout.redis_url: Redis refuses the append script (" in out
    # Redis gone: said, with the URL's password masked.
    redis_server.kill()
    secret = secrets.token_hex(16)
    url = redis_server.url.replace("redis://", f"redis://:{secret}@")
    out = await problem(_doctor_config(tmp_path / "bad.toml", workspace, url), secret)
    assert "PROBLEM fanout.redis_url: cannot reach Redis at redis://:***@127.0.0.1" in out


@pytest.mark.e2e
async def test_a_real_cli_run_is_on_redis_byte_equal_to_its_replay(
    claude_bin: str, tmp_path: Path, short_dir: Path, redis_server: RedisServer, redis: Redis
) -> None:
    root, workspace, home = workspace_tree(tmp_path)
    fanout = fanout_config(short_dir, workspace, redis_server.url).fanout
    config = msgspec.structs.replace(e2e_config(claude_bin, root, short_dir), fanout=fanout)
    stub = Stub()
    async with serve_stub(stub):
        env = E2E(stub, workspace, home)
        await env.start(config)
        try:
            stub.main.turns = [
                tool("Read", say="Reading hello.py.", file_path=env.path("hello.py")),
                text("It prints hello world."),
            ]
            status, started = await env.post_run("What does hello.py print?")
            assert status == 202, started
            run_id = started["run_id"]
            assert env.handle is not None
            d = Daemon(env.handle, env.client)
            state = await wait_done(d, run_id, deadline_s=90)
            assert state["status"] == "completed"
            await settled(d)
            lines = await replay(d, run_id)
            assert any(b'"type":"tool_call"' in line for line in lines)
            assert await stream(redis, run_id) == expected_entries(lines)
        finally:
            await env.stop()
