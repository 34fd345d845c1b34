"""Fixtures for supervision tests: spawn the fake CLI as the daemon would, clean up by marker."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from codelegate.daemon.supervision import cgroups, procs
from codelegate.daemon.supervision.procs import reap_orphans
from codelegate.daemon.supervision.supervisor import ChildProcess
from codelegate.policy.argv import FIXED_FLAGS
from codelegate.policy.environment import RUN_MARKER_VAR
from codelegate.policy.modes import mode_for
from tests.fakes import FAKE_CLAUDE

# The daemon's fixed flags (policy.argv), without the control channel: these tests write the
# fake's prompt as text on stdin.
ARGV = [
    *FIXED_FLAGS,
    "--permission-mode",
    mode_for("safe").cli,
    "--session-id",
    "4f6c1d2e-8a3b-4c5d-9e7f-0a1b2c3d4e5f",
]

Spawn = Callable[..., Awaitable[ChildProcess]]


def fake_env(run_id: str) -> dict[str, str]:
    """A child environment as narrow as the daemon's, plus the run marker."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        RUN_MARKER_VAR: run_id,
    }


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    fields = procs._stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def exists(pid: int) -> bool:
    """True if ``pid`` is still in the process table (zombies included)."""
    return Path(f"/proc/{pid}").exists()


def gone(pid: int) -> bool:
    """One round of the daemon's periodic orphan reaper, then: is ``pid`` gone, zombie too?

    A killed orphan turns into a zombie a moment after the kill sweep saw it die; in the daemon
    the reaper task collects it within a second, here each poll does.
    """
    reap_orphans()
    return not exists(pid)


async def spawn_grandchild(
    spawn_fake: Spawn, tmp_path: Path, words: str, **kw: Any
) -> tuple[ChildProcess, Path]:
    """The fake CLI's ``grandchild`` scenario (``words``: its other settings): it starts a
    process that leaves the CLI's session and writes its pid to the file returned."""
    pidfile = tmp_path / "grandchild.pid"
    return await spawn_fake(f"grandchild pidfile={pidfile} {words}", **kw), pidfile


async def read_until(child: ChildProcess, needle: bytes) -> bytes:
    """The child's stdout up to and including the chunk that contains ``needle``."""
    out = bytearray()
    while needle not in out:
        chunk = await child.read()
        if not chunk:
            pytest.fail(f"EOF before {needle!r}")
        out += chunk
    return bytes(out)


@pytest.fixture(params=["marker", "cgroup"])
def attribution(request: pytest.FixtureRequest) -> str:
    """How a run's processes are found: the env marker alone, or a cgroup per run as well."""
    if request.param == "cgroup" and cgroups.delegated_base() is None:
        pytest.skip("no delegated, writable cgroup v2 subtree here")
    return str(request.param)


@pytest.fixture
async def spawn_fake(tmp_path: Path, attribution: str) -> AsyncIterator[Spawn]:
    """Spawn the fake CLI with a scenario; every run is killed by marker at teardown."""
    runs: list[ChildProcess] = []

    async def _spawn(
        scenario: str = "normal", *, run_id: str | None = None, **kw: Any
    ) -> ChildProcess:
        rid = run_id or uuid.uuid4().hex
        child = await ChildProcess.spawn(
            [sys.executable, FAKE_CLAUDE, *ARGV],
            cwd=str(tmp_path),
            env=fake_env(rid),
            stdin=f"fake: {scenario}\nplease do the thing\n".encode(),
            run_id=rid,
            **({"cgroup": attribution == "cgroup"} | kw),
        )
        runs.append(child)
        return child

    yield _spawn
    for child in runs:
        await child.terminate(0)
        await child.aclose()
        assert procs.marked_pids(child.run_id) == []
        assert child.cgroup is None  # removed once empty


async def read_all(child: ChildProcess, n: int = 1 << 16) -> bytes:
    """All of the child's stdout."""
    out = bytearray()
    while chunk := await child.read(n):
        out += chunk
    return bytes(out)
