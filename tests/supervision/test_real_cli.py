"""The pinned Claude Code CLI, supervised for real: a Bash tool process that double-forks into
a new session escapes the CLI's process tree and group; the run marker still finds it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from codelegate.daemon.supervision import procs
from codelegate.daemon.supervision.supervisor import ChildProcess
from codelegate.policy.environment import RUN_MARKER_VAR
from tests.polling import until
from tests.procfs import cmdline
from tests.stub.anthropic import Stub, Turn, serve_stub, text, tool
from tests.stub.claude import claude_argv, claude_env
from tests.supervision.conftest import gone, read_all

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("subreaper")]

# Double-fork into a new session with stdio detached (a daemonising tool), tell the stub, sleep.
ESCAPE = """\
import os, sys, time, urllib.request
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open(os.devnull, os.O_RDWR)
        for n in (0, 1, 2):
            os.dup2(fd, n)
        urllib.request.urlopen(sys.argv[1]).read()
        time.sleep(300)
    os._exit(0)
print("started")
"""


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    s = Stub()
    async with serve_stub(s):
        yield s


async def _start(
    claude_bin: str, stub: Stub, tmp_path: Path, final: Turn
) -> tuple[ChildProcess, str]:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    (workspace / "escape.py").write_text(ESCAPE)
    stub.main.turns = [
        tool("Bash", command=f"python3 escape.py {stub.signal_url('escaped')}", description="x"),
        final,
    ]
    run_id = uuid.uuid4().hex
    child = await ChildProcess.spawn(
        claude_argv(claude_bin, mode="acceptEdits", extra=["--allowed-tools", "Bash(python3:*)"]),
        cwd=str(workspace),
        env=claude_env(stub.url, home, {RUN_MARKER_VAR: run_id}),
        stdin=b"Start the server.",
        run_id=run_id,
    )
    async with asyncio.timeout(60):
        await stub.wait_for_signal("escaped")
    return child, run_id


def _escaped(run_id: str) -> list[int]:
    return [pid for pid in procs.marked_pids(run_id) if b"escape.py" in cmdline(pid)]


async def test_a_double_forked_tool_process_outlives_the_cli_until_reaped(
    claude_bin: str, stub: Stub, tmp_path: Path
) -> None:
    child, run_id = await _start(claude_bin, stub, tmp_path, text("Started it."))
    async with asyncio.timeout(60):
        out = await read_all(child)
        status = await child.wait()
    assert status.exit_code == 0, child.stderr_tail()
    assert b'"type":"result"' in out
    (escaped,) = _escaped(run_id)  # the CLI is gone; its tool's grandchild is not

    assert await child.reap_stragglers() >= 1

    assert procs.marked_pids(run_id) == []
    await until(lambda: gone(escaped))
    await child.aclose()


async def test_terminating_the_cli_mid_run_kills_the_escaped_process_too(
    claude_bin: str, stub: Stub, tmp_path: Path
) -> None:
    hold = asyncio.Event()
    child, run_id = await _start(claude_bin, stub, tmp_path, Turn(text("never").blocks, hold=hold))
    async with asyncio.timeout(60):
        await stub.wait_for_requests(2)  # the model is "thinking" after the Bash call
    (escaped,) = _escaped(run_id)

    status = await child.terminate(grace=5.0)

    assert status != (0, None)
    assert procs.marked_pids(run_id) == []
    await until(lambda: gone(escaped))
    hold.set()
    await child.aclose()
