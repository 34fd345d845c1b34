"""Run the real Claude Code CLI headless against the stub, the way the daemon launches it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

from codelegate.policy.argv import CHANNEL_FLAGS, FIXED_FLAGS
from codelegate.translator import RunContext, Translator
from codelegate.translator.control import opening

API_KEY = "sk-ant-test-dummy"


@dataclass
class ClaudeRun:
    """What one CLI process printed, and how it ended."""

    argv: list[str]
    stdout: bytes
    stderr: str
    exit_code: int | None
    session_id: str | None
    pid: int = 0
    lines: list[dict[str, Any]] = field(default_factory=list)

    def of_type(self, kind: str, subtype: str | None = None) -> list[dict[str, Any]]:
        return [
            line
            for line in self.lines
            if line.get("type") == kind and (subtype is None or line.get("subtype") == subtype)
        ]

    @property
    def results(self) -> list[dict[str, Any]]:
        return self.of_type("result")

    @property
    def result(self) -> dict[str, Any]:
        return self.results[-1]

    def blocks(self, kind: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(line, block) for every content block of ``kind`` in assistant/user lines."""
        out: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for line in self.lines:
            if line.get("type") not in ("assistant", "user"):
                continue
            content = (line.get("message") or {}).get("content")
            if isinstance(content, list):
                out.extend((line, b) for b in content if isinstance(b, dict) and b["type"] == kind)
        return out


def claude_env(base_url: str, home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A minimal child environment (as the daemon builds it) pointing the CLI at the stub."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": API_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    env.update(extra or {})
    return env


class Session(TypedDict, total=False):
    """How one CLI process is started, as far as its argv goes: the permission mode (default
    acceptEdits), and a new session (``session_id``, default a fresh uuid) or ``resume``."""

    mode: str
    session_id: str | None
    resume: str | None


def claude_argv(
    claude_bin: str,
    *,
    extra: Sequence[str] = (),
    without: Sequence[str] = (),
    **session: Unpack[Session],
) -> list[str]:
    # The daemon's fixed flags, from their one owner: tests run the CLI the way runs do
    # (``without``: those a test measures the CLI without, e.g. --forward-subagent-text).
    fixed = [flag for flag in FIXED_FLAGS if flag not in without]
    argv = [claude_bin, *fixed, "--permission-mode", session.get("mode", "acceptEdits")]
    resume = session.get("resume")
    if resume is not None:
        argv += ["--resume", resume]
    else:
        argv += ["--session-id", session.get("session_id") or str(uuid.uuid4())]
    return argv + list(extra)


async def spawn_claude(
    argv: Sequence[str],
    base_url: str,
    *,
    workspace: Path,
    home: Path,
    env: Mapping[str, str] | None,
) -> asyncio.subprocess.Process:
    """Start the CLI with pipes on stdin, stdout and stderr, in a session of its own (so that
    its process group can be killed), in the environment of :func:`claude_env`."""
    return await asyncio.create_subprocess_exec(
        *argv,
        cwd=workspace,
        env=claude_env(base_url, home, env),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        limit=64 * 1024 * 1024,
    )


async def run_claude(
    claude_bin: str,
    base_url: str,
    prompt: str,
    *,
    workspace: Path,
    home: Path,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    time_limit: float = 60.0,
    channel: bool = False,
    **session: Unpack[Session],
) -> ClaudeRun:
    """Run the CLI to completion and parse its stream-json lines: the prompt as text on stdin,
    closed at once; or (``channel``) over the control channel, as a run of the daemon speaks it
    (see :func:`_speak_as_the_daemon`)."""
    resume = session.get("resume")
    session_id = session.get("session_id") or (None if resume else str(uuid.uuid4()))
    opened: Session = {**session, "session_id": session_id}
    extra = [*CHANNEL_FLAGS, *extra_args] if channel else list(extra_args)
    argv = claude_argv(claude_bin, extra=extra, **opened)
    proc = await spawn_claude(argv, base_url, workspace=workspace, home=home, env=env)
    talk = _speak_as_the_daemon(proc, prompt) if channel else proc.communicate(prompt.encode())
    try:
        stdout, stderr = await asyncio.wait_for(talk, time_limit)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    run = ClaudeRun(
        argv, stdout, stderr.decode("utf-8", "replace"), proc.returncode, None, proc.pid
    )
    for raw in stdout.splitlines():
        if raw.strip():
            run.lines.append(json.loads(raw))
    inits = run.of_type("system", "init")
    run.session_id = inits[0]["session_id"] if inits else (resume or session_id)
    return run


async def _speak_as_the_daemon(
    proc: asyncio.subprocess.Process, prompt: str
) -> tuple[bytes, bytes]:
    """What a run of the daemon writes and when (daemon/driving.py): the opening of
    translator.control (``initialize``, then the prompt as a user message), stdin kept open
    until the translator's channel says the run is over, then closed; the output up to EOF."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    stderr = asyncio.ensure_future(proc.stderr.read())
    # Only its channel is read: when the run is over is the translator's to say, as in a run.
    watch = Translator(RunContext(run_id="watch", cwd="/", started_at=0.0))
    proc.stdin.write(opening(prompt))
    with contextlib.suppress(ConnectionError):  # a CLI that ended at once (it says why)
        await proc.stdin.drain()
    out = bytearray()
    try:
        while chunk := await proc.stdout.read(1 << 16):
            out += chunk
            watch.receive_data(chunk, 0.0)
            if watch.channel.over and not proc.stdin.is_closing():
                proc.stdin.close()
        proc.stdin.close()
        await proc.wait()
        return bytes(out), await stderr
    finally:
        stderr.cancel()  # a run cut short by its time limit reads no more
