"""``codelegate serve`` as a process: sd_notify, socket activation, SIGTERM drain."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from codelegate.daemon.store.store import RunStore
from tests.daemon.conftest import BASE
from tests.procfs import marked_processes
from tests.reliability.served import write_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def notify(short_dir: Path) -> AsyncIterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(short_dir / "notify"))
    sock.setblocking(False)
    yield sock
    sock.close()


async def notification(sock: socket.socket, wanted: str) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(30):
        while wanted not in (await loop.sock_recv(sock, 4096)).decode():
            pass


def env_for(short_dir: Path, home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(ROOT),
        "NOTIFY_SOCKET": str(short_dir / "notify"),
    }


async def run_hanging_then_sigterm(
    proc: asyncio.subprocess.Process, sock_path: Path, notify: socket.socket
) -> str:
    await notification(notify, "READY=1")
    connector = aiohttp.UnixConnector(path=str(sock_path))
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.post(f"{BASE}/v1/runs", json={"task": "fake: ignore_term"}) as resp:
            assert resp.status == 202
            run_id: str = (await resp.json())["run_id"]
        async with http.ws_connect(f"{BASE}/v1/ws?run={run_id}") as ws:
            while json.loads((await ws.receive()).data)["type"] != "tool_call":
                pass
            proc.send_signal(signal.SIGTERM)
            await notification(notify, "STOPPING=1")
            frames = []
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                frames.append(json.loads(msg.data))
            assert ws.close_code == 1001
    assert frames[-1]["type"] == "run_result"
    assert frames[-1]["result"]["status"] == "cancelled"
    async with asyncio.timeout(30):
        assert await proc.wait() == 0
    return run_id


async def stored_status(store_path: Path, run_id: str) -> str:
    store = await RunStore.open(str(store_path))
    try:
        rec = await store.get_run(run_id)
        assert rec is not None
        return rec.status
    finally:
        await store.close()


async def test_sigterm_drains_cancels_and_notifies(
    short_dir: Path, workspace: Path, tmp_path: Path, notify: socket.socket
) -> None:
    config = write_config(short_dir, workspace)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "codelegate.daemon.cli",
        "serve",
        "--config",
        str(config),
        "--drain",
        "0.2",
        env=env_for(short_dir, tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        run_id = await run_hanging_then_sigterm(proc, short_dir / "d.sock", notify)
    finally:
        if proc.returncode is None:
            proc.kill()
        out, err = await proc.communicate()
    assert b"listening on unix:" in err
    events = [json.loads(line) for line in out.splitlines()]
    assert {"listening", "stopping", "stopped"} <= {e["event"] for e in events}
    assert any(e.get("run_id") == run_id and e["event"] == "run_finished" for e in events)
    assert not (short_dir / "d.sock").exists()
    assert await stored_status(short_dir / "store.db", run_id) == "cancelled"


async def test_socket_activation_uses_the_inherited_socket(
    short_dir: Path, workspace: Path, tmp_path: Path, notify: socket.socket
) -> None:
    config = write_config(short_dir, workspace)
    path = short_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    fd = listener.fileno()
    # systemd passes the socket as fd 3 and names the receiving pid; exec keeps the pid.
    launcher = (
        "import os, sys\n"
        f"os.dup2({fd}, 3)\n"
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1')\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'codelegate.daemon.cli', 'serve',"
        " '--config', sys.argv[1], '--drain', '0.2'])\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        launcher,
        str(config),
        env=env_for(short_dir, tmp_path),
        pass_fds=(fd,),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    listener.close()
    try:
        await run_hanging_then_sigterm(proc, path, notify)
    finally:
        if proc.returncode is None:
            proc.kill()
        _, err = await proc.communicate()
    assert f"listening on unix:{path}".encode() in err
    assert not (short_dir / "d.sock").exists()  # the configured path was never bound


async def _said(stderr: asyncio.StreamReader, wanted: str) -> str:
    """The first line on the daemon's stderr that starts with ``wanted`` (bounded wait)."""
    async with asyncio.timeout(30):
        while not (line := (await stderr.readline()).decode()).startswith(wanted):
            assert line, f"stderr ended before {wanted!r}"
    return line.rstrip("\n")


async def test_ctrl_c_says_what_the_drain_waits_for_and_a_second_one_cancels_the_runs_now(
    short_dir: Path, workspace: Path, tmp_path: Path, notify: socket.socket
) -> None:
    # Ctrl-C on `make run` waited out the drain in silence, and a second one did nothing.
    config = write_config(short_dir, workspace)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "codelegate.daemon.cli", "serve", "--config", str(config), "--drain", "600"),
        env=env_for(short_dir, tmp_path),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    run_ids = []
    try:
        await notification(notify, "READY=1")
        connector = aiohttp.UnixConnector(path=str(short_dir / "d.sock"))
        async with aiohttp.ClientSession(connector=connector) as http:
            for _ in range(2):
                async with http.post(f"{BASE}/v1/runs", json={"task": "fake: hang"}) as resp:
                    assert resp.status == 202
                    run_ids.append((await resp.json())["run_id"])
        proc.send_signal(signal.SIGINT)
        assert await _said(proc.stderr, "codelegate: draining") == (
            "codelegate: draining 2 runs (up to 600 s); Ctrl-C again to cancel them now"
        )
        proc.send_signal(signal.SIGINT)
        assert await _said(proc.stderr, "codelegate: cancelling") == (
            "codelegate: cancelling 2 runs now"
        )
        async with asyncio.timeout(60):  # well within the 600 s the drain would have waited
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:  # failed: nothing of it may outlive the test
            proc.kill()
            await proc.wait()
            for pid in [p for run_id in run_ids for p in marked_processes(run_id)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    store = await RunStore.open(str(short_dir / "store.db"))
    try:
        assert [r.status for r in await store.list_runs(10)] == ["cancelled", "cancelled"]
    finally:
        await store.close()


def test_the_drain_line_says_what_there_is_to_wait_for() -> None:
    from codelegate.daemon.serving.server import drain_notice

    assert drain_notice(0, 10) == "codelegate: stopping; no run to drain"
    assert drain_notice(1, 10) == (
        "codelegate: draining 1 run (up to 10 s); Ctrl-C again to cancel it now"
    )
    assert drain_notice(3, 0) == "codelegate: stopping; cancelling 3 runs (--drain 0)"
