"""No caller's text reaches one of the CLI's own commands (``/model``, ``/heapdump``, ...).

The CLI runs a user message whose first character is "/" as one of its commands, the prompt and
a steering message alike: ``/model`` picks a model outside ``[claude] allowed_models``,
``/heapdump`` writes the heap (credentials in clear) into HOME, ``/config`` writes HOME's
settings. Two layers, each measured here with the pinned CLI against the stub: the daemon's
fixed flags (``--disable-slash-commands``) make every command run nothing, and policy refuses
such text before a run starts or before the input is written (``slash_command``).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import secrets
from pathlib import Path

import pytest
from rich.console import Console

from codelegate.daemon.clients import terminal
from codelegate.translator import RunContext, Translator
from tests.e2e.conftest import E2E, frames_until, is_run_result
from tests.stub.anthropic import Stub, Turn, serve_stub, text
from tests.stub.claude import run_claude
from tests.stub.control import ControlSession, is_result

pytestmark = pytest.mark.e2e

# What each does when it runs (measured on 2.1.332 without the flag): a model or effort for the
# session, the heap into HOME, HOME's settings.json, the session's cost.
COMMANDS = ("/model haiku", "/effort max", "/heapdump", "/config model=haiku", "/cost")


def _written_by_commands(home: Path) -> list[str]:
    """Files a command leaves in HOME: heap snapshots, the settings /config writes."""
    return sorted(
        str(p.relative_to(home))
        for p in home.rglob("*")
        if p.name.endswith((".heapsnapshot", "-diagnostics.json")) or p.name == "settings.json"
    )


def _home_and_workspace(tmp_path: Path) -> tuple[Path, Path]:
    home, workspace = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    workspace.mkdir()
    return home, workspace


@pytest.mark.parametrize("command", COMMANDS)
async def test_a_cli_command_as_the_prompt_runs_nothing_under_the_daemons_flags(
    claude_bin: str, tmp_path: Path, command: str
) -> None:
    home, workspace = _home_and_workspace(tmp_path)
    stub = Stub()
    async with serve_stub(stub):
        run = await run_claude(
            claude_bin, stub.url, command, workspace=workspace, home=home, channel=True
        )
    name = command.split()[0]
    assert run.result["result"] == f"{name} isn't available in this environment."
    assert run.result["num_turns"] == 0  # answered by the CLI itself, no model turn
    assert _written_by_commands(home) == []
    assert stub.model_requests == []


async def test_a_steering_command_changes_no_model_and_is_not_left_unread(
    claude_bin: str, tmp_path: Path
) -> None:
    """A steering message the CLI answers itself is never echoed (``isReplay``): the channel
    counts that answer as taking it in, or the run would wait for ``run_timeout_s``."""
    home, workspace = _home_and_workspace(tmp_path)
    words = f"Now say {secrets.token_hex(6)}."
    stub = Stub(fallback="Answered.")
    async with serve_stub(stub):
        cli = await ControlSession.start(
            claude_bin,
            stub.url,
            workspace=workspace,
            home=home,
            extra_args=["--replay-user-messages"],
        )
        translator = Translator(RunContext(run_id="slash", cwd=str(workspace), started_at=0.0))
        channel = translator.channel
        read = 0

        async def written(message: str) -> None:
            nonlocal read
            start = len(cli.lines)
            channel.input_written(message)
            await cli.user(message)
            await cli.wait_for(is_result, after=start)
            for line in cli.lines[read:]:
                translator.receive_data(json.dumps(line).encode() + b"\n", 1.0)
            read = len(cli.lines)

        try:
            await cli.initialize()
            await cli.user("Hello.")
            await cli.wait_for(is_result)
            for line in cli.lines:
                translator.receive_data(json.dumps(line).encode() + b"\n", 1.0)
            read = len(cli.lines)
            await written("/model haiku")
            assert cli.lines[-1]["result"] == "/model isn't available in this environment."
            assert (channel.unread, channel.over) == (0, True)
            await written(words)
            assert (channel.unread, channel.over) == (0, True)
        finally:
            await cli.kill()
    first, last = stub.requests_of()[0], stub.requests_of()[-1]
    assert words in last.history_text()
    assert last.body["model"] == first.body["model"]  # the session's model, not haiku


async def test_a_task_or_steering_text_starting_with_a_slash_is_refused_before_the_cli_sees_it(
    e2e: E2E,
) -> None:
    status, body = await e2e.post_run("/heapdump", mode="safe")
    assert (status, body["error"]["code"]) == (400, "slash_command")
    assert 'task must not start with "/"' in body["error"]["message"]
    assert e2e.stub.requests == []
    assert _written_by_commands(e2e.home) == []

    hold = asyncio.Event()
    e2e.stub.main.turns = [Turn(text("First answer.").blocks, hold=hold), text("Noted.")]
    run = await e2e.started("Answer.", mode="safe")
    await e2e.stub.wait_for_requests(1)
    status, body = await e2e.post(f"/v1/runs/{run.run_id}/input", {"text": "/model haiku"})
    assert (status, body["error"]["code"]) == (400, "slash_command")
    assert run.translator.channel.unread == 0  # nothing was written
    # With a space first it is words for the model (the CLI's measured rule), and the run ends.
    words = f" /model haiku, {secrets.token_hex(6)}"
    status, _ = await e2e.post(f"/v1/runs/{run.run_id}/input", {"text": words})
    assert status == 202
    async with e2e.ws(run.run_id) as ws:
        hold.set()
        frames = await frames_until(ws, is_run_result)
    assert frames[-1]["result"]["status"] == "completed"
    requests = e2e.stub.requests_of()
    assert words in requests[-1].history_text()
    assert {r.body["model"] for r in requests} == {requests[0].body["model"]}


async def test_codelegate_run_says_why_a_slash_task_is_refused(e2e: E2E) -> None:
    assert e2e.handle is not None
    assert e2e.handle.socket_path is not None
    args = {"task": "/model haiku", "cwd": str(e2e.workspace), "mode": None}
    console = Console(record=True, width=200, color_system=None, file=io.StringIO())
    code = await terminal.run_async(
        argparse.Namespace(socket=e2e.handle.socket_path, resume=None, model=None, **args),
        terminal.Renderer(console, json_out=None, many=False),
        interrupt=asyncio.Event(),
    )
    assert code == terminal.EXIT_REFUSED
    assert 'refused: slash_command: task must not start with "/"' in console.export_text()
    assert e2e.stub.requests == []
