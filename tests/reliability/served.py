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
    state: Path,
    workspace: Path,
    claude: str = FAKE_CLAUDE,
    extra: str = "",
    *,
    server: str = "",
    store: Path | None = None,
    policy: str = "",
    socket: Path | None = None,
) -> Path:
    """``state/codelegate.toml``: socket and store in ``state`` (or the ``socket`` and ``store``
    given); ``server`` adds lines to ``[server]``, ``policy`` to ``[policy]``, ``extra`` whole
    sections at the end."""
    path = state / "codelegate.toml"
    path.write_text(
        "[server]\n"
        f"socket = {json.dumps(str(socket or state / 'd.sock'))}\n" + server + "[claude]\n"
        f"path = {json.dumps(claude)}\n"
        "[policy]\n"
        f"workspaces = [{json.dumps(str(workspace))}]\n"
        "cancel_grace_s = 0.5\n" + policy + "[store]\n"
        f"path = {json.dumps(str(store or state / 'store.db'))}\n" + extra
    )
    return path


# Sets RLIMIT_NOFILE to (soft, hard), then runs the CLI.
_WITH_NOFILE = (
    "import resource, runpy, sys; soft, hard = map(int, sys.argv.pop(1).split(':')); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)); "
    "runpy.run_module('codelegate.daemon.cli', run_name='__main__', alter_sys=True)"
)


class Served:
    """``codelegate serve --config`` as a child process, and a client over its socket.

    ``nofile`` starts it with that RLIMIT_NOFILE (soft, hard); ``stdout_pipe`` gives it a pipe as
    stdout (``proc.stdout``, for a reader that goes away) and the log file as stderr only;
    ``stdout_closed`` starts it with no stdout at all (``>&-``); ``prefix`` goes before the
    command (``setpriv`` … to serve as another uid).
    """

    def __init__(
        self,
        config: Path,
        state: Path,
        home: Path,
        env: dict[str, str] | None = None,
        *,
        nofile: tuple[int, int] | None = None,
        stdout_pipe: bool = False,
        stdout_closed: bool = False,
        log: str = "daemon.log",
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.config, self.state, self.home = config, state, home
        self.env = env or {}
        self.nofile, self.stdout_pipe, self.stdout_closed = nofile, stdout_pipe, stdout_closed
        self.prefix = prefix
        self.proc: subprocess.Popen[bytes] | None = None
        self.http: aiohttp.ClientSession | None = None
        self.log = state / log

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}
        env.update(self.env)
        argv = ["serve", "--config", str(self.config)]
        if self.nofile is None:
            command = [sys.executable, "-m", "codelegate.daemon.cli", *argv]
        else:
            limits = f"{self.nofile[0]}:{self.nofile[1]}"
            command = [sys.executable, "-c", _WITH_NOFILE, limits, *argv]
        if self.stdout_closed:
            command = ["/bin/sh", "-c", 'exec "$@" >&-', "sh", *command]
        command = [*self.prefix, *command]
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE if self.stdout_pipe else log,
                stderr=log if self.stdout_pipe or self.stdout_closed else subprocess.STDOUT,
            )

    async def exits(self, deadline_s: float = 30.0) -> int:
        """Start it expecting it not to come up: its exit code (bounded wait)."""
        proc = self.proc = self._spawn()
        try:
            return await asyncio.to_thread(proc.wait, deadline_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            pytest.fail(f"the daemon came up (or hung) instead of exiting: {self.log}")

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

    async def stop(self) -> int | None:
        """SIGTERM, then its exit code (SIGKILL after a bounded wait)."""
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode
