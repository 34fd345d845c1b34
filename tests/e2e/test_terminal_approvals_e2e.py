"""``codelegate run`` asks in the terminal and ``watch`` shows what waits, with the real CLI."""

from __future__ import annotations

import argparse
import asyncio
import io

import pytest
from rich.console import Console

from codelegate.daemon.clients import terminal
from codelegate.daemon.clients.terminal import EXIT_OK, Renderer
from tests.e2e.approvals import ON, asking
from tests.e2e.conftest import E2E, is_run_result
from tests.stub.anthropic import text, tool

pytestmark = pytest.mark.e2e

TOUCH = tool("Bash", command="touch made.txt", description="Make")


def console() -> Console:
    return Console(record=True, width=200, color_system=None, file=io.StringIO())


def run_args(e2e: E2E) -> argparse.Namespace:
    assert e2e.handle is not None
    return argparse.Namespace(
        socket=e2e.handle.socket_path,
        task="Do it.",
        cwd=str(e2e.workspace),
        mode="safe",
        resume=None,
        model=None,
    )


class Typist:
    """Answers the terminal's questions with ``replies``, one per question, and keeps them."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.questions: list[str] = []

    async def __call__(self, question: str) -> str | None:
        self.questions.append(question)
        return self.replies.pop(0) if self.replies else None


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_run_asks_in_the_terminal_and_offers_session_only_where_allowed(e2e: E2E) -> None:
    e2e.stub.main.turns = [TOUCH, text("Made it.")]
    typist = Typist("s", "y")  # no session for Bash: asked again, then yes
    out = console()
    code = await terminal.run_async(
        run_args(e2e), Renderer(out, json_out=None, many=False), asyncio.Event(), typist
    )
    assert code == EXIT_OK
    assert len(typist.questions) == 2
    first = typist.questions[0]
    assert "Claude Code wants to run Bash: touch made.txt (Make)" in first
    assert "[y]es / [n]o — expires in " in first
    assert "[s]ession" not in first
    assert (e2e.workspace / "made.txt").exists()
    assert "✓ approved (client): Bash" in out.export_text()


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_session_in_the_terminal_spares_the_second_write_its_question(e2e: E2E) -> None:
    write = tool("Write", file_path=e2e.path("n.txt"), content="one\n")
    again = tool("Write", file_path=e2e.path("n.txt"), content="two\n")
    e2e.stub.main.turns = [write, again, text("Written twice.")]
    typist = Typist("s")
    out = console()
    code = await terminal.run_async(
        run_args(e2e), Renderer(out, json_out=None, many=False), asyncio.Event(), typist
    )
    assert code == EXIT_OK
    assert len(typist.questions) == 1
    assert "[y]es / [n]o / [s]ession" in typist.questions[0]
    assert (e2e.workspace / "n.txt").read_text() == "two\n"
    assert "✓ approved for the session (client): Write" in out.export_text()


@pytest.mark.parametrize("daemon_approvals", [{**ON, "timeout_s": 1}])
async def test_without_a_terminal_run_only_shows_the_request_and_the_timeout_decides(
    e2e: E2E,
) -> None:
    e2e.stub.main.turns = [TOUCH, text("Not made.")]
    out = console()
    # pytest's stdin is no terminal: nobody can answer here.
    code = await terminal.run_async(
        run_args(e2e), Renderer(out, json_out=None, many=False), asyncio.Event()
    )
    assert code == EXIT_OK
    shown = out.export_text()
    assert "⏸ waiting for approval: Bash: touch made.txt (Make)" in shown
    assert "✗ denied (timeout): Bash" in shown
    assert not (e2e.workspace / "made.txt").exists()


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_watch_shows_a_pending_request_until_it_is_resolved(e2e: E2E) -> None:
    a = await asking(e2e, [TOUCH, text("Made.")])
    out = console()
    args = argparse.Namespace(socket=run_args(e2e).socket, run=a.run_id)
    watching = asyncio.ensure_future(
        terminal.watch_async(args, Renderer(out, json_out=None, many=False), asyncio.Event())
    )
    status, _ = await e2e.post(a.path(), {"approved": True})
    assert status == 200
    await a.until(is_run_result)
    await a.ws.close()
    assert await asyncio.wait_for(watching, 30) == EXIT_OK
    shown = out.export_text()
    pending = shown.index("⏸ waiting for approval: Bash: touch made.txt (Make)")
    assert a.request["request_id"] in shown
    assert shown.index("✓ approved (client): Bash") > pending
