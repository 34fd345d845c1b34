"""The whole path for real: the daemon in-process on a Unix socket, the pinned Claude Code CLI as
its child, and the loopback API stub as the model (passed through the child environment's
allowlisted ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from codelegate.daemon.record import Run
from codelegate.daemon.serving.server import ServerHandle, start_server
from codelegate.daemon.serving.state import manager_of
from codelegate.policy.config import Config, development_config
from tests.stub.anthropic import Stub
from tests.stub.claude import API_KEY

BASE = "http://codelegate"
FRAME_TIMEOUT = 30.0


def e2e_config(
    claude: str,
    root: Path,
    state: Path,
    claude_section: dict[str, Any] | None = None,
    server_section: dict[str, Any] | None = None,
    approvals_section: dict[str, Any] | None = None,
    limits_section: dict[str, Any] | None = None,
    **policy: Any,
) -> Config:
    """Development defaults with ``root`` the only workspace root and the pinned CLI; extra
    ``[claude]`` / ``[server]`` / ``[approvals]`` / ``[limits]`` keys in ``claude_section`` /
    ``server_section`` / ``approvals_section`` / ``limits_section``, extra ``[policy]`` keys as
    keywords."""
    raw = msgspec.to_builtins(development_config(str(root), claude))
    raw["server"]["socket"] = str(state / "d.sock")
    raw["store"]["path"] = str(state / "store.db")
    raw["policy"]["cancel_grace_s"] = 2.0
    raw["policy"].update(policy)
    raw["claude"].update(claude_section or {})
    raw["server"].update(server_section or {})
    raw["limits"].update(limits_section or {})
    if approvals_section:
        raw["approvals"] = {**raw.get("approvals", {}), **approvals_section}
    return msgspec.convert(raw, Config)


@dataclass
class E2E:
    """A daemon, its HTTP client over the socket, the stub it talks to, and the workspace."""

    stub: Stub
    workspace: Path
    home: Path
    handle: ServerHandle | None = None
    http: aiohttp.ClientSession | None = None
    runs: list[str] = field(default_factory=list)

    def path(self, name: str) -> str:
        return str(self.workspace / name)

    @property
    def client(self) -> aiohttp.ClientSession:
        assert self.http is not None
        return self.http

    async def start(self, config: Config) -> None:
        environ = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.home / "tmp"),
            "ANTHROPIC_BASE_URL": self.stub.url,
            "ANTHROPIC_API_KEY": API_KEY,
            "CODELEGATE_E2E_NOT_PASSED": "1",  # not on the allowlist: must not reach the CLI
        }
        self.handle = await start_server(config, environ=environ)
        assert self.handle.socket_path is not None
        self.http = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.handle.socket_path),
            timeout=aiohttp.ClientTimeout(total=60),
        )

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
        if self.handle is not None:
            await self.handle.close()

    async def post_run(self, task: str, **fields: Any) -> tuple[int, Any]:
        body = {"task": task, "cwd": str(self.workspace), "mode": "accept_edits", **fields}
        async with self.client.post(f"{BASE}/v1/runs", json=body) as resp:
            answer = await resp.json()
        if resp.status == 202:
            self.runs.append(answer["run_id"])
        return resp.status, answer

    async def started(self, task: str, **fields: Any) -> Run:
        """A run started (202) with ``task``: the daemon's own object of it."""
        status, answer = await self.post_run(task, **fields)
        assert status == 202, answer
        return self.run_of(answer["run_id"])

    def run_of(self, run_id: str) -> Run:
        """The daemon's object of the run ``run_id`` (live or recently finished)."""
        assert self.handle is not None
        run = manager_of(self.handle.app).get(run_id)
        assert run is not None
        return run

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.client.get(f"{BASE}{path}") as resp:
            return resp.status, await resp.json()

    async def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.client.post(f"{BASE}{path}", json=body) as resp:
            return resp.status, await resp.json()

    async def settled(self, run_id: str) -> None:
        """Wait until the last process of ``run_id`` is gone: after a cancel the CLI honoured,
        the closing frames go out first and the process cleanup finishes behind them."""
        assert self.handle is not None
        run = manager_of(self.handle.app).get(run_id)
        assert run is not None
        async with asyncio.timeout(30):
            await run.settled.wait()

    def ws(self, run_id: str, after: int = 0) -> Any:
        return self.client.ws_connect(f"{BASE}/v1/ws?run={run_id}&after={after}")


def workspace_tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``(root, workspace, home)``: the workspace root, its ``demo`` folder holding a
    ``hello.py``, and the CLI's home (with ``tmp``), all under ``tmp_path``."""
    root = tmp_path / "workspaces"
    workspace = root / "demo"
    home = tmp_path / "home"
    for folder in (workspace, home, home / "tmp"):
        folder.mkdir(parents=True)
    (workspace / "hello.py").write_text('print("hello world")\n')
    return root, workspace, home


async def next_frame(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), FRAME_TIMEOUT)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    frame: dict[str, Any] = msgspec.json.decode(msg.data)
    return frame


async def frames_until(
    ws: aiohttp.ClientWebSocketResponse, done: Any, into: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Frames (control messages skipped) until ``done(frame)`` holds, that frame included."""
    frames = [] if into is None else into
    while True:
        frame = await next_frame(ws)
        if "seq" not in frame:
            continue
        frames.append(frame)
        if done(frame):
            return frames


def is_run_result(frame: dict[str, Any]) -> bool:
    return bool(frame["type"] == "run_result")


# END
