"""Fixtures shared by every test folder. Each folder keeps its own conftest for the rest."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from codelegate.daemon.pinned import CLAUDE_CODE_VERSION

ROOT = Path(__file__).resolve().parent.parent
# The reference transcripts of the design (shared/reference/claude-code-2.1.332), kept in the
# repository so that the tests do not depend on what lies beside the checkout.
REFERENCE = ROOT / "tests" / "translator" / "golden" / "reference"
PINNED_CLAUDE_VERSION = CLAUDE_CODE_VERSION


def pinned_claude() -> str | None:
    """The pinned Claude Code CLI that `make test` installs, or None when it is not there."""
    candidate = os.environ.get("CODELEGATE_TEST_CLAUDE") or str(
        ROOT / ".tools" / "claude" / "node_modules" / ".bin" / "claude"
    )
    return candidate if shutil.which(candidate) else None


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder for Unix sockets: sun_path holds at most 107 bytes, and pytest's
    tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="cl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def claude_bin() -> str:
    path = pinned_claude()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("the pinned Claude Code CLI is missing; run `make test`")
        pytest.skip("the pinned Claude Code CLI is not installed (run `make test`)")
    return path


@pytest.fixture(autouse=True)
def _own_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Development defaults live in $XDG_STATE_HOME/codelegate (clients.tool.state_dir): no test
    # may read the config `make run` wrote for the user, nor write beside it.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
