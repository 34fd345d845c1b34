"""Fixtures for daemon tests: a daemon in-process on a Unix socket, the fake CLI as Claude.

``start_daemon`` (and the ``daemon`` fixture built on it) is the documented way to run the whole
daemon inside a test: ``serving.server.start_server(config)`` on a short socket path, plus an
aiohttp client session over that socket.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from codelegate.daemon.serving.server import ServerHandle, start_server
from codelegate.policy.config import Config, development_config
from tests.fakes import FAKE_CLAUDE

BASE = "http://codelegate"


def make_config(short_dir: Path, workspace: Path, **sections: dict[str, Any]) -> Config:
    """Development defaults for ``workspace`` with the fake CLI, state in ``short_dir``."""
    base = development_config(str(workspace), FAKE_CLAUDE)
    raw = msgspec.to_builtins(base)
    raw["server"]["socket"] = str(short_dir / "d.sock")
    raw["store"]["path"] = str(short_dir / "store.db")
    raw["policy"]["cancel_grace_s"] = 1.0
    for section, values in sections.items():
        raw[section].update(values)
    return msgspec.convert(raw, Config)


def tcp_listener(folder: Path, token: str, **server: Any) -> dict[str, Any]:
    """A ``[server]`` section with a TCP listener on a free loopback port whose bearer token is
    ``token`` (written to ``folder/token``), plus the ``server`` keys given."""
    token_file = folder / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)  # open to others, serve refuses it
    return {"tcp": "127.0.0.1:0", "token_file": str(token_file), **server}


def child_environ(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}


@dataclass
class Daemon:
    """A daemon running in this process and a client session talking to it over its socket."""

    handle: ServerHandle
    http: aiohttp.ClientSession

    async def post_run(self, task: str, **fields: Any) -> aiohttp.ClientResponse:
        return await self.http.post(f"{BASE}/v1/runs", json={"task": task, **fields})

    async def json(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.http.request(method, f"{BASE}{path}", **kw) as resp:
            return resp.status, await resp.json()

    async def events(self, run_id: str, after: int = 0) -> list[dict[str, Any]]:
        """The NDJSON stream of a run, to its end."""
        async with self.http.get(f"{BASE}/v1/runs/{run_id}/events?after={after}") as resp:
            assert resp.status == 200
            assert resp.content_type == "application/x-ndjson"
            body = await resp.read()
        return [msgspec.json.decode(line) for line in body.splitlines()]

    def ws(self, query: str = "") -> Any:
        return self.http.ws_connect(f"{BASE}/v1/ws{query}")


async def start_daemon(config: Config, home: Path) -> Daemon:
    handle = await start_server(config, environ=child_environ(home))
    assert handle.socket_path is not None
    connector = aiohttp.UnixConnector(path=handle.socket_path)
    http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))
    return Daemon(handle, http)


async def stop_daemon(d: Daemon) -> None:
    await d.http.close()
    await d.handle.close()


@asynccontextmanager
async def running_daemon(config: Config, home: Path) -> AsyncIterator[Daemon]:
    """``start_daemon`` for the length of a block, stopped however the block ends."""
    d = await start_daemon(config, home)
    try:
        yield d
    finally:
        await stop_daemon(d)


@pytest.fixture
def config(short_dir: Path, workspace: Path) -> Config:
    return make_config(short_dir, workspace)


@pytest.fixture
async def daemon(config: Config, tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(config, tmp_path) as d:
        yield d


async def next_frame(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), 30)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    frame: dict[str, Any] = msgspec.json.decode(msg.data)
    return frame


async def frames_until_result(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """Frames (not control messages) up to and including a run_result."""
    out: list[dict[str, Any]] = []
    while True:
        frame = await next_frame(ws)
        if "seq" not in frame:
            continue
        out.append(frame)
        if frame["type"] == "run_result":
            return out
