"""Fixtures for tests that run the real Claude Code CLI against the API stub."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

import pytest

from tests.stub.anthropic import Stub, Turn, serve_stub
from tests.stub.claude import ClaudeRun, Session, run_claude
from tests.stub.control import ControlSession

HELLO_PY = 'print("hello world")\n'


@dataclass
class CliSandbox:
    """A workspace, a HOME and a private temp folder for one test's CLI runs (and the capture
    script's: tests/golden/capture.py)."""

    claude: str
    workspace: Path
    home: Path
    # The CLI's TMPDIR; None leaves the machine's.
    tmp: Path | None = None

    def path(self, name: str) -> str:
        return str(self.workspace / name)

    def _env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """What the CLI's environment gets in this sandbox: its TMPDIR, then ``env``."""
        own = {} if self.tmp is None else {"TMPDIR": str(self.tmp)}
        return {**own, **(env or {})}

    async def launch(
        self, url: str, prompt: str, *, env: Mapping[str, str] | None = None, **options: Any
    ) -> ClaudeRun:
        """Run the CLI once in this sandbox against the stub served at ``url`` (``options``:
        those of ``run_claude``)."""
        return await run_claude(
            self.claude,
            url,
            prompt,
            workspace=self.workspace,
            home=self.home,
            env=self._env(env),
            **options,
        )

    async def control(self, url: str, **options: Any) -> ControlSession:
        """The CLI started with stdin open against the stub served at ``url`` (``options``: those
        of ``ControlSession.start``)."""
        return await ControlSession.start(
            self.claude, url, workspace=self.workspace, home=self.home, env=self._env(), **options
        )

    async def run(
        self,
        stub: Stub,
        prompt: str = "Do the task.",
        *,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        **session: Unpack[Session],
    ) -> ClaudeRun:
        """Serve ``stub`` and run the CLI once against it, as a run of the daemon speaks to it
        (the channel flags, the prompt over the control channel): the stream facts are those of
        what the daemon reads."""
        async with serve_stub(stub):
            return await self.launch(
                stub.url, prompt, extra_args=extra, env=env, channel=True, **session
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
    (workspace / "hello.py").write_text(HELLO_PY)
    return CliSandbox(claude_bin, workspace, home, tmp)
