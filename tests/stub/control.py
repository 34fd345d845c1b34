"""Drive the real Claude Code CLI over its control channel (``--input-format stream-json``).

`tests.stub.claude.run_claude` writes the prompt and closes stdin; a `ControlSession` keeps stdin
open, so a test can speak the control protocol: ``initialize``, the prompt as a user message,
answers to ``can_use_tool`` requests, ``interrupt``, a second user message, and decide itself when
to close stdin. Every stdout line is parsed as it arrives, with the monotonic time it arrived, and
`ControlSession.wait_for` waits for a line matching a predicate: tests synchronise on lines, never
on sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from tests.stub.claude import Session, claude_argv, spawn_claude

Line = dict[str, Any]


def host_prompt_flags(argv: Sequence[str], prompt_tool: str | None = "stdio") -> list[str]:
    """``argv`` with ``--permission-prompts none`` turned into a permission surface on stdio
    (DESIGN "Approvals": ``--permission-prompts host --permission-prompt-tool stdio``);
    ``prompt_tool=None`` leaves out ``--permission-prompt-tool``."""
    out = list(argv)
    at = out.index("--permission-prompts")
    out[at + 1] = "host"
    if prompt_tool is not None:
        out[at + 2 : at + 2] = ["--permission-prompt-tool", prompt_tool]
    return out


@dataclass
class ControlSession:
    """One CLI process with stdin open; see the module docstring."""

    proc: asyncio.subprocess.Process
    argv: list[str]
    lines: list[Line] = field(default_factory=list)
    arrived_at: list[float] = field(default_factory=list)
    stderr: bytes = b""
    _cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _reader: asyncio.Task[None] | None = None
    _err_reader: asyncio.Task[None] | None = None
    eof: bool = False

    @classmethod
    async def start(
        cls,
        claude_bin: str,
        base_url: str,
        *,
        workspace: Path,
        home: Path,
        permission_surface: bool = False,
        prompt_tool: str | None = "stdio",
        extra_args: Sequence[str] = (),
        without_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        **session: Unpack[Session],
    ) -> ControlSession:
        argv = claude_argv(
            claude_bin,
            extra=["--input-format", "stream-json", *extra_args],
            without=without_args,
            **session,
        )
        if permission_surface:
            argv = host_prompt_flags(argv, prompt_tool)
        proc = await spawn_claude(argv, base_url, workspace=workspace, home=home, env=env)
        started = cls(proc, argv)
        started._reader = asyncio.create_task(started._read())
        started._err_reader = asyncio.create_task(started._read_stderr())
        return started

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            if not raw.strip():
                continue
            line = json.loads(raw)
            async with self._cond:
                self.lines.append(line)
                self.arrived_at.append(time.monotonic())
                self._cond.notify_all()
        async with self._cond:
            self.eof = True
            self._cond.notify_all()

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = await self.proc.stderr.read()

    # --- writing ------------------------------------------------------------------------------

    async def send(self, obj: Mapping[str, Any]) -> float:
        """Write one JSON line; the monotonic time it was written."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
        await self.proc.stdin.drain()
        return time.monotonic()

    def request_id(self) -> str:
        return f"req_{next(self._ids)}_probe"

    async def control(self, request: Mapping[str, Any]) -> tuple[str, float]:
        """Send a control_request of ours; its request id and when it was written."""
        rid = self.request_id()
        at = await self.send({"type": "control_request", "request_id": rid, "request": request})
        return rid, at

    async def initialize(self) -> Line:
        rid, _ = await self.control({"subtype": "initialize"})
        return await self.wait_for(lambda ln: _answers(ln, rid))

    async def user(self, text: str) -> float:
        return await self.send(
            {
                "type": "user",
                "message": {"role": "user", "content": text},
                "parent_tool_use_id": None,
                "session_id": "",
            }
        )

    async def answer(self, request_id: str, response: Mapping[str, Any]) -> float:
        """Answer a control_request of the CLI (e.g. can_use_tool) with ``response``."""
        return await self.send(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": request_id, "response": response},
            }
        )

    async def close_stdin(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return time.monotonic()

    # --- reading ------------------------------------------------------------------------------

    async def wait_for(
        self, predicate: Callable[[Line], bool], *, after: int = 0, time_limit: float = 60.0
    ) -> Line:
        """The first line at index >= ``after`` matching ``predicate`` (waits for it)."""

        def found() -> Line | None:
            return next((ln for ln in self.lines[after:] if predicate(ln)), None)

        async def wait() -> Line:
            async with self._cond:
                await self._cond.wait_for(lambda: found() is not None or self.eof)
            line = found()
            if line is None:
                raise AssertionError(f"the CLI ended without such a line; stderr: {self.stderr!r}")
            return line

        return await asyncio.wait_for(wait(), time_limit)

    def index(self, line: Line) -> int:
        return next(i for i, ln in enumerate(self.lines) if ln is line)

    def time_of(self, line: Line) -> float:
        return self.arrived_at[self.index(line)]

    async def wait_exit(self, time_limit: float = 30.0) -> int:
        code = await asyncio.wait_for(self.proc.wait(), time_limit)
        for task in (self._reader, self._err_reader):
            if task is not None:
                await task
        return code

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        for task in (self._reader, self._err_reader):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)

    def of_type(self, kind: str, subtype: str | None = None) -> list[Line]:
        return [
            ln
            for ln in self.lines
            if ln.get("type") == kind and (subtype is None or ln.get("subtype") == subtype)
        ]


def _answers(line: Line, request_id: str) -> bool:
    return (
        line.get("type") == "control_response"
        and (line.get("response") or {}).get("request_id") == request_id
    )


def answers(request_id: str) -> Callable[[Line], bool]:
    """A predicate: the CLI's control_response to our request ``request_id``."""
    return lambda line: _answers(line, request_id)


def can_use_tool(line: Line) -> bool:
    return (
        line.get("type") == "control_request"
        and (line.get("request") or {}).get("subtype") == "can_use_tool"
    )


def is_result(line: Line) -> bool:
    return line.get("type") == "result"
