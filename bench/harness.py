"""What the daemon benchmarks share: a served daemon in a child process, /proc readings, stats.

The daemon runs as in production (``codelegate serve --config``, uvloop, JSON logs at warning
level) with the fault-injecting fake CLI as Claude, so that a benchmark measures the
daemon, not a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
import uvloop

ROOT = Path(__file__).resolve().parent.parent
FAKE_CLAUDE = str(ROOT / "tests" / "fakes" / "fake_claude.py")
BASE = "http://codelegate"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


_T = TypeVar("_T")


def on_uvloop(main: Coroutine[Any, Any, _T]) -> _T:
    """Run a benchmark's ``main`` on uvloop, the loop the daemon serves on."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def machine() -> str:
    """nproc, CPU model and Python version, for RESULTS.md."""
    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    py = sys.version.split()[0]
    return f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), {model}, Python {py}"


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS)."""
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


class ServedDaemon:
    """``codelegate serve`` in a child process, with an HTTP client over its socket."""

    def __init__(
        self,
        *,
        profile: str | None = None,
        env: dict[str, str] | None = None,
        **sections: dict[str, Any],
    ) -> None:
        self.profile = profile  # write a cProfile of the daemon there (at its clean exit)
        self.env = env or {}  # more of the daemon's environment (an API stub's URL, say)
        self.tmp = Path(tempfile.mkdtemp(prefix="clbench-"))
        self.workspace = self.tmp / "ws"
        self.workspace.mkdir()
        self.socket = str(self.tmp / "d.sock")
        config: dict[str, dict[str, Any]] = {
            "server": {"socket": self.socket},
            "claude": {"path": FAKE_CLAUDE},
            "policy": {"workspaces": [str(self.workspace)], "max_concurrent_runs": 64},
            "store": {"path": str(self.tmp / "store.db")},
        }
        for name, values in sections.items():
            config.setdefault(name, {}).update(values)
        self.config = self.tmp / "codelegate.toml"
        self.config.write_text(_toml(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.http: aiohttp.ClientSession | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.tmp), **self.env}
        prof = ["-m", "cProfile", "-o", self.profile] if self.profile else []
        argv = [
            sys.executable,
            *prof,
            "-m",
            "codelegate.daemon.cli",
            "serve",
            "--config",
            str(self.config),
        ]
        return subprocess.Popen(
            [*argv, "--log-level", "warning"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def __aenter__(self) -> ServedDaemon:
        self.proc = self._spawn()
        self.http = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.socket, limit=0),
            timeout=aiohttp.ClientTimeout(total=300),
        )
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("the daemon exited during start-up")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with self.http.get(f"{BASE}/healthz") as resp:
                    if resp.status == 200:
                        return self
            if loop.time() > end:
                raise RuntimeError("the daemon did not come up in 30 s")
            await asyncio.sleep(0.05)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.http is not None:
            await self.http.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, 30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    async def start_run(self, task: str, **fields: Any) -> str:
        assert self.http is not None
        async with self.http.post(f"{BASE}/v1/runs", json={"task": task, **fields}) as resp:
            body = await resp.json()
            if resp.status != 202:
                raise RuntimeError(f"run refused: {body}")
            return str(body["run_id"])

    async def get(self, path: str) -> Any:
        assert self.http is not None
        async with self.http.get(f"{BASE}{path}") as resp:
            if resp.content_type == "application/json":
                return await resp.json()
            return await resp.text()

    async def post(self, path: str) -> Any:
        assert self.http is not None
        async with self.http.post(f"{BASE}{path}") as resp:
            return await resp.json()


def _toml(config: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"
