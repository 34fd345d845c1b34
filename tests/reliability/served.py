"""``codelegate serve --config`` as a child process (the production entry point, JSON logs on
stdout captured to a file), and a client over its Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from tests.fakes import FAKE_CLAUDE

BASE = "http://codelegate"
ROOT = Path(__file__).resolve().parents[2]


def write_config(
    state: Path, workspace: Path, claude: str = FAKE_CLAUDE, extra: str = "", policy: str = ""
) -> Path:
    """A config for ``serve``; ``policy`` is more ``[policy]`` lines, ``extra`` more tables."""
    path = state / "codelegate.toml"
    path.write_text(
        "[server]\n"
        f"socket = {json.dumps(str(state / 'd.sock'))}\n"
        "[claude]\n"
        f"path = {json.dumps(claude)}\n"
        "[policy]\n"
        f"workspaces = [{json.dumps(str(workspace))}]\n"
        "cancel_grace_s = 0.5\n" + policy + "[store]\n"
        f"path = {json.dumps(str(state / 'store.db'))}\n" + extra
    )
    return path


class Served:
    """``codelegate serve --config`` as a child process, and a client over its socket."""

    def __init__(
        self, config: Path, state: Path, home: Path, env: dict[str, str] | None = None
    ) -> None:
        self.config, self.state, self.home = config, state, home
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.http: aiohttp.ClientSession | None = None
        self.log = state / "daemon.log"

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}
        env.update(self.env)
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "daemon.cli", "serve", "--config", str(self.config)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    async def start(self) -> None:
        self.proc = self._spawn()
        sock = self.state / "d.sock"
        self.http = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(sock)),
            timeout=aiohttp.ClientTimeout(total=30),
        )
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with self.http.get(f"{BASE}/healthz") as resp:
                    if resp.status == 200:
                        return
            if loop.time() > end:
                pytest.fail("the daemon did not come up: " + self.log.read_text()[-2000:])
            await asyncio.sleep(0.05)

    async def json(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        assert self.http is not None
        async with self.http.request(method, f"{BASE}{path}", **kw) as resp:
            return resp.status, await resp.json()

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        assert self.http is not None
        async with self.http.get(f"{BASE}/v1/runs/{run_id}/events") as resp:
            body = await resp.read()
        return [msgspec.json.decode(line) for line in body.splitlines()]

    async def kill(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
