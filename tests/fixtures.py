"""The fixtures every test folder may use, in one place: a pytest plugin that tests/conftest.py
registers (``pytest_plugins``), so that no folder re-exports another folder's fixtures by name.

What stays in a folder's conftest is that folder's own: its helpers and the fixtures only it
uses. The helpers behind these fixtures (the e2e daemon ``E2E``, ``make_config``…) stay beside
their folders and are imported from there.
"""

from __future__ import annotations

import io
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog

from codelegate.daemon import logs
from codelegate.daemon.supervision.procs import become_subreaper, reap_orphans
from tests.conftest import pinned_claude, unavailable
from tests.contract.ochat import Show, normalizer
from tests.e2e.conftest import E2E, e2e_config, workspace_tree
from tests.stub.anthropic import Stub, serve_stub


@pytest.fixture(autouse=True)
def _own_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Development defaults live in $XDG_STATE_HOME/codelegate (clients.tool.state_dir): no test
    # may read the config `make run` wrote for the user, nor write beside it.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@contextmanager
def short_folder(prefix: str = "cl-") -> Iterator[Path]:
    """A short folder for Unix sockets, removed after the block: sun_path holds at most 107
    bytes, and pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A :func:`short_folder` for one test."""
    with short_folder() as path:
        yield path


@pytest.fixture
def claude_bin() -> str:
    """The pinned Claude Code CLI; the test is skipped without it (failed on CI)."""
    path = pinned_claude()
    if path is None:
        unavailable("the pinned Claude Code CLI is not installed (run `make test`)")
    return path


@pytest.fixture(scope="session")
def show() -> Show:
    """O Chat's own normalizer: ``show(feed, …)`` gives its items after each frame of each feed
    (tests/contract/ochat.py); the test is skipped without it (failed on CI)."""
    return normalizer()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace root ``<tmp>/ws`` with a ``sub`` folder, for daemons with the fake CLI."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    return ws


@contextmanager
def log_lines() -> Iterator[io.StringIO]:
    """The daemon's logging configured as ``serve`` does, into this stream; restored after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    # serve lets each module logger (``_log = structlog.get_logger(…)``) keep what it was bound to
    # on first use. Here that would be this stream for the rest of the session: a later test's
    # capture (log_lines again, structlog.testing.capture_logs) would not see those modules.
    logs.configure(level="info", stream=stream, cache=False)
    try:
        yield stream
    finally:
        structlog.reset_defaults()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """:func:`log_lines` for one test."""
    with log_lines() as stream:
        yield stream


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Make the test process a child subreaper for one test, then undo it."""
    if not become_subreaper():
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available here")
    yield
    reap_orphans()
    become_subreaper(on=False)


@pytest.fixture
def daemon_policy() -> dict[str, Any]:
    """Extra ``[policy]`` settings for ``e2e``; a test overrides it with
    ``parametrize("daemon_policy", …)``."""
    return {}


@pytest.fixture
def daemon_claude() -> dict[str, Any]:
    """Extra ``[claude]`` settings for ``e2e``; overridden like ``daemon_policy``."""
    return {}


@pytest.fixture
def daemon_server() -> dict[str, Any]:
    """Extra ``[server]`` settings for ``e2e`` (a TCP listener, say); overridden likewise."""
    return {}


@pytest.fixture
def daemon_approvals() -> dict[str, Any]:
    """Extra ``[approvals]`` settings for ``e2e`` (``{"enabled": True}`` turns them on)."""
    return {}


@pytest.fixture
def daemon_limits() -> dict[str, Any]:
    """Extra ``[limits]`` settings for ``e2e`` (smaller bounds, say); overridden likewise."""
    return {}


@pytest.fixture
async def e2e(
    claude_bin: str,
    tmp_path: Path,
    short_dir: Path,
    daemon_policy: dict[str, Any],
    daemon_claude: dict[str, Any],
    daemon_server: dict[str, Any],
    daemon_approvals: dict[str, Any],
    daemon_limits: dict[str, Any],
) -> AsyncIterator[E2E]:
    """A started daemon (development defaults, the pinned CLI) against a fresh loopback stub;
    script ``e2e.stub``."""
    root, workspace, home = workspace_tree(tmp_path)
    stub = Stub()
    async with serve_stub(stub):
        env = E2E(stub, workspace, home)
        policy = {"allowed_tools": ["Bash(python3:*)", "Bash(env:*)"], **daemon_policy}
        config = e2e_config(
            claude_bin,
            root,
            short_dir,
            daemon_claude,
            daemon_server,
            daemon_approvals,
            daemon_limits,
            **policy,
        )
        await env.start(config)
        try:
            yield env
        finally:
            await env.stop()
