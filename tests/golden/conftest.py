"""Fixtures for tests that run the real Claude Code CLI against the API stub."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.stub.anthropic import Stub, Turn, serve_stub
from tests.stub.claude import ClaudeRun, run_claude


@dataclass
class CliSandbox:
    """A workspace, a HOME and a private temp folder for one test's CLI runs."""

    claude: str
    workspace: Path
    home: Path
    tmp: Path

    def path(self, name: str) -> str:
        return str(self.workspace / name)

    async def run(
        self,
        stub: Stub,
        prompt: str = "Do the task.",
        *,
        mode: str = "acceptEdits",
        resume: str | None = None,
        session_id: str | None = None,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        time_limit: float = 60.0,
    ) -> ClaudeRun:
        """Serve ``stub`` and run the CLI once against it."""
        async with serve_stub(stub):
            return await run_claude(
                self.claude,
                stub.url,
                prompt,
                workspace=self.workspace,
                home=self.home,
                mode=mode,
                resume=resume,
                session_id=session_id,
                extra_args=extra,
                env={"TMPDIR": str(self.tmp), **(env or {})},
                time_limit=time_limit,
            )

    async def script(self, turns: Iterable[Turn], prompt: str = "Do the task.") -> ClaudeRun:
        return await self.run(Stub(turns), prompt)


@pytest.fixture
def cli(claude_bin: str, tmp_path: Path) -> CliSandbox:
    workspace = tmp_path / "ws"
    home = tmp_path / "home"
    tmp = tmp_path / "tmp"
    for folder in (workspace, home, tmp):
        folder.mkdir()
    (workspace / "hello.py").write_text('print("hello world")\n')
    return CliSandbox(claude_bin, workspace, home, tmp)
