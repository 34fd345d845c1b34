"""``codelegate serve --config FILE`` as operators start it, with the real CLI and the stub."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import BASE, workspace_tree
from tests.procfs import marked_processes
from tests.reliability.served import write_config
from tests.stub.anthropic import Stub, Turn, serve_stub, text, tool
from tests.stub.claude import API_KEY

pytestmark = pytest.mark.e2e

CODELEGATE = Path(sys.executable).with_name("codelegate")


class Notifications:
    """A NOTIFY_SOCKET of our own: the daemon says READY=1 / STOPPING=1 here, as to systemd."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    async def expect(self, word: str) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(30):
            while word not in (await loop.sock_recv(self.sock, 4096)).decode().splitlines():
                pass

    def close(self) -> None:
        self.sock.close()


class Served:
    """A ``codelegate serve`` process and an HTTP client on its socket."""

    def __init__(self, config: Path, env: dict[str, str], notify: Notifications) -> None:
        self.config, self.env, self.notify = config, env, notify
        self.proc: asyncio.subprocess.Process | None = None
        self.http: aiohttp.ClientSession | None = None

    async def start(self, socket_path: Path) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            str(CODELEGATE),
            "serve",
            "--config",
            str(self.config),
            "--drain",
            "1",
            env=self.env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await self.notify.expect("READY=1")
        self.http = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket_path)))

    async def stop(self) -> int | None:
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        await self.notify.expect("STOPPING=1")
        async with asyncio.timeout(30):
            return await self.proc.wait()

    async def request(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        assert self.http is not None
        async with self.http.request(method, f"{BASE}{path}", **kw) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def served(
    claude_bin: str, tmp_path: Path, short_dir: Path
) -> AsyncIterator[tuple[Served, Stub, Path]]:
    if not CODELEGATE.exists():
        pytest.skip("the codelegate console script is not installed in this venv")
    root, workspace, home = workspace_tree(tmp_path)
    config = write_config(
        short_dir,
        root,
        claude_bin,
        policy='default_mode = "accept_edits"\nallowed_modes = ["safe", "accept_edits"]\n'
        'allowed_tools = ["Bash(python3:*)"]\nmax_concurrent_runs = 2\nrun_timeout_s = 120\n',
    )
    notify = Notifications(short_dir / "n.sock")
    stub = Stub()
    async with serve_stub(stub):
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(home / "tmp"),
            "ANTHROPIC_BASE_URL": stub.url,
            "ANTHROPIC_API_KEY": API_KEY,
            "NOTIFY_SOCKET": str(notify.path),
        }
        daemon = Served(config, env, notify)
        await daemon.start(short_dir / "d.sock")
        try:
            yield daemon, stub, workspace
        finally:
            with contextlib.suppress(ProcessLookupError):
                await daemon.stop()
            notify.close()


async def test_serve_with_a_config_file_runs_the_real_cli(
    served: tuple[Served, Stub, Path],
) -> None:
    daemon, stub, workspace = served
    status, health = await daemon.request("GET", "/healthz")
    assert status == 200
    assert health["cli_version"] == "2.1.332"
    stub.main.turns = [
        tool("Edit", file_path=str(workspace / "hello.py"), old_string="world", new_string="you"),
        text("Done."),
    ]
    # no mode: the config's default_mode (accept_edits) lets the Edit through
    status, result = await daemon.request(
        "POST", "/v1/runs", json={"task": "Greet you.", "cwd": str(workspace), "wait": True}
    )
    assert status == 200
    assert result["status"] == "completed"
    assert result["files_changed"] == ["hello.py"]
    status, refused = await daemon.request(
        "POST", "/v1/runs", json={"task": "x", "cwd": str(workspace), "mode": "auto"}
    )
    assert status == 403
    assert refused["error"]["code"]
    assert await daemon.stop() == 0


async def test_sigterm_mid_run_leaves_no_process_and_a_final_status(
    served: tuple[Served, Stub, Path],
) -> None:
    daemon, stub, workspace = served
    stub.main.turns = [Turn(text("never").blocks, hold=asyncio.Event())]
    status, started = await daemon.request(
        "POST", "/v1/runs", json={"task": "Think.", "cwd": str(workspace)}
    )
    assert status == 202
    run_id = started["run_id"]
    await stub.wait_for_requests(1)
    assert marked_processes(run_id)
    assert await daemon.stop() == 0
    assert marked_processes(run_id) == []
    # a new daemon on the same store reports the run as ended, not running
    await daemon.start(Path(daemon.env["NOTIFY_SOCKET"]).with_name("d.sock"))
    status, state = await daemon.request("GET", f"/v1/runs/{run_id}")
    assert status == 200
    assert state["status"] in ("cancelled", "interrupted")
