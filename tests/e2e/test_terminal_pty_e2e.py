"""``codelegate run`` as a user starts it, in a pty, against ``codelegate serve`` with the real
CLI: what reaches the screen, and what a closed terminal or a SIGTERM does to the run.

The daemon is a process of its own: a client the test process started would be a descendant of
an in-process daemon, which refuses its own descendants (a run's processes may not call it).
"""

from __future__ import annotations

import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from codelegate.daemon.clients.terminal import EXIT_OK
from tests.e2e.conftest import workspace_tree
from tests.e2e.test_cancel_e2e import SLEEPER
from tests.polling import polled, until
from tests.procfs import marked_processes
from tests.pty_client import PtyClient
from tests.reliability.served import Served, write_config
from tests.stub.anthropic import Stub, serve_stub, text, tool
from tests.stub.claude import API_KEY

pytestmark = pytest.mark.e2e


class Daemon:
    """``codelegate serve`` with [approvals] on, the stub as its model, and a workspace."""

    def __init__(self, served: Served, stub: Stub, workspace: Path) -> None:
        self.served, self.stub, self.workspace = served, stub, workspace

    async def run(self, *task: str) -> PtyClient:
        """``codelegate run TASK`` in this daemon's workspace, on a terminal of its own."""
        sock = str(self.served.state / "d.sock")
        return await PtyClient.start(*task, "--cwd", str(self.workspace), "--socket", sock)

    async def state(self, run_id: str) -> dict[str, Any]:
        status, state = await self.served.json("GET", f"/v1/runs/{run_id}")
        assert status == 200, state
        return dict(state)


@pytest.fixture
async def daemon(claude_bin: str, tmp_path: Path, short_dir: Path) -> AsyncIterator[Daemon]:
    root, workspace, home = workspace_tree(tmp_path)
    config = write_config(
        short_dir,
        root,
        claude_bin,
        extra="[approvals]\nenabled = true\ntimeout_s = 120\n",
        policy='allowed_tools = ["Bash(python3:*)"]\n',
    )
    stub = Stub()
    async with serve_stub(stub):
        env = {"ANTHROPIC_BASE_URL": stub.url, "ANTHROPIC_API_KEY": API_KEY, "LANG": "C.UTF-8"}
        served = Served(config, short_dir, home, env)
        await served.start()
        try:
            yield Daemon(served, stub, workspace)
        finally:
            await served.stop()


async def test_the_approval_question_on_a_terminal_shows_the_letters_to_type(
    daemon: Daemon,
) -> None:
    # While rich's Live draws the cards, sys.stderr is its proxy, which printed the unfinished
    # question line as markup: "[y]es / [n]o" reached the screen as "es / o".
    touch = tool("Bash", command="touch made.txt", description="Make")
    daemon.stub.main.turns = [touch, text("Made it.")]
    client = await daemon.run("Do it.")
    try:
        await client.shown("Claude Code wants to run Bash: touch made.txt (Make)")
        await client.shown(" — expires in ")
        assert "  [y]es / [n]o — expires in " in client.screen
        client.type(b"y\n")
        assert await client.exit_code() == EXIT_OK
    finally:
        await client.close()
    assert "✓ approved (client): Bash" in client.screen
    assert (daemon.workspace / "made.txt").exists()


@pytest.mark.parametrize("ending", ["hang_up", "sigterm"])
async def test_a_run_whose_terminal_goes_away_or_that_gets_sigterm_is_cancelled(
    daemon: Daemon, ending: str
) -> None:
    (daemon.workspace / "sleeper.py").write_text(SLEEPER)
    ready = daemon.stub.signal_url("sleeper")
    hold = tool("Bash", command=f"python3 sleeper.py {ready}", description="Hold")
    daemon.stub.main.turns = [hold, text("Held.")]
    client = await daemon.run("Hold on.")
    try:
        await client.shown(" · ")
        found = re.search(r"run (\S+) · ", client.screen)
        assert found is not None, client.screen
        run_id = found.group(1)
        await daemon.stub.wait_for_signal("sleeper")  # its Bash is running
        if ending == "hang_up":
            client.hang_up()
        else:
            client.proc.send_signal(signal.SIGTERM)
        signum = signal.SIGHUP if ending == "hang_up" else signal.SIGTERM
        assert await client.exit_code() == 128 + signum
    finally:
        await client.close()

    async def ended() -> dict[str, Any] | None:
        state = await daemon.state(run_id)
        return None if state["status"] == "running" else state

    assert (await polled(ended, what="the run's end"))["status"] == "cancelled"
    await until(lambda: marked_processes(run_id) == [], 30, "the run's processes gone")
