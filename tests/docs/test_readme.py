"""The README's Quick start and curl examples, taken out of README.md and run as written.

A fresh HOME (so ``~/proj`` and ``~/.local/state/codelegate`` are this test's), ``make run
WORKSPACE=~/proj`` in the checkout with the pinned CLI as the ``claude`` on PATH and the loopback
stub as the model, then the Quick start's second-terminal commands and the "HTTP API" curl
block, each of which must succeed. A README edit that breaks a command breaks this test.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.fixtures import short_folder
from tests.stub.anthropic import Stub, serve_stub
from tests.stub.claude import API_KEY

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

pytestmark = pytest.mark.e2e


def section(title: str) -> str:
    """The text of the README section with that heading, up to the next heading of its level
    (a ``#`` line inside a code block is a shell comment, not a heading)."""
    lines = README.read_text().splitlines(keepends=True)
    out: list[str] = []
    level = 0
    fenced = False
    for line in lines:
        heading = re.match(r"(#+) ", line) if not fenced else None
        if line.startswith("```"):
            fenced = not fenced
        if heading and level and len(heading[1]) <= level:
            break
        if level:
            out.append(line)
        elif heading and line.rstrip("\n") == f"{heading[1]} {title}":
            level = len(heading[1])
    assert level, f"README has no section {title!r}"
    return "".join(out)


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)


def commands(block: str) -> list[str]:
    """One shell command per entry: continuation lines joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n", " ", block)
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_blocks_this_test_runs_are_there() -> None:
    first, second = sh_blocks(section("Quick start"))[:2]
    assert commands(first)[0].startswith("make run WORKSPACE=~/proj")
    assert any("codelegate run" in c for c in commands(second))
    [curl] = [b for b in sh_blocks(section("HTTP API")) if b.startswith("S=")]
    assert "$RUN_ID" in curl
    assert "RUN_ID=$(" in curl  # set before it is used


@pytest.fixture
def home() -> Iterator[Path]:
    # Short: the socket path under it must fit in sun_path (107 bytes).
    with short_folder("cl-doc-") as path:
        (path / "proj").mkdir()
        yield path


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    async with serve_stub(Stub(fallback="Done.")) as served:
        yield served


def _env(home: Path, stub: Stub, claude_bin: str) -> dict[str, str]:
    bin_dir = home / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "claude").symlink_to(claude_bin)  # make run uses a claude on PATH: the pinned one
    path = f"{home}/.local/bin:{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {
        "PATH": path,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": stub.url,
        "ANTHROPIC_API_KEY": API_KEY,
    }  # no XDG_STATE_HOME: the README's ~/.local/state/codelegate


def _bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_the_quick_start_and_the_curl_examples_run_as_written(
    claude_bin: str, home: Path, stub: Stub
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    env = _env(home, stub, claude_bin)
    first, second = sh_blocks(section("Quick start"))[:2]
    make_run = commands(first)[0].split("#")[0].strip()  # `make test` is what runs this test
    served = await asyncio.to_thread(
        subprocess.Popen,
        ["bash", "-c", make_run],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log: list[str] = []
    try:
        assert served.stdout is not None
        while not any('"event":"listening"' in line for line in log[-1:]):
            line = await asyncio.to_thread(served.stdout.readline)
            assert line, f"make run ended before serving:\n{''.join(log)}"
            log.append(line)
        drain = asyncio.ensure_future(asyncio.to_thread(served.stdout.read))

        for command in commands(second):
            done = await asyncio.to_thread(_bash, command, env)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            if command.startswith("codelegate doctor"):
                assert "PROBLEM" not in done.stdout
                assert f"workspace roots: {home / 'proj'}" in done.stdout
            if "codelegate run" in command:
                assert "✓ completed" in done.stdout
                assert f"resume: codelegate run --cwd {home / 'proj'} --resume" in done.stdout

        [curl] = [b for b in sh_blocks(section("HTTP API")) if b.startswith("S=")]
        done = await asyncio.to_thread(_bash, curl, env)
        assert done.returncode == 0, (done.stdout, done.stderr)
        out = done.stdout
        assert out.count('"status":"completed"') >= 2, out  # the two waiting runs
        assert '"type":"run_result"' in out  # the event stream ran to its end
        assert '"run_finished"' in out  # cancelling a finished run: 409
        assert '"status":"ok"' in out  # healthz
        refusals = re.findall(r'\{"error":\{"code":"(\w+)"', out)
        assert refusals == ["run_finished"], out  # nothing else was refused
    finally:
        os.killpg(served.pid, signal.SIGTERM)
        code = await asyncio.to_thread(served.wait, 60)
        if "drain" in locals():
            await drain
        if served.stdout is not None:
            served.stdout.close()
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), "".join(log)


def test_the_config_reference_is_the_tested_example_and_one_cli_path_is_given() -> None:
    [reference] = re.findall(r"^```toml\n(.*?)^```", section("Configuration"), re.M | re.S)
    assert reference == (ROOT / "tests" / "policy" / "example_config.toml").read_text()
    # A host install puts the CLI in one place; README, example config and steps agree on it.
    host = "/opt/codelegate/claude/node_modules/.bin/claude"
    text = README.read_text() + (ROOT / "systemd" / "config.toml.example").read_text()
    named = set(re.findall(r"/opt/[\w/.-]*claude\b(?!/)", text)) - {"/opt/codelegate/claude"}
    assert named == {host}
