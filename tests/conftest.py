"""Fixtures shared by every test folder. Each folder keeps its own conftest for the rest."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The reference transcripts of the design (shared/reference/claude-code-2.1.332), kept in the
# repository so that the tests do not depend on what lies beside the checkout.
REFERENCE = ROOT / "tests" / "translator" / "golden" / "reference"
PINNED_CLAUDE_VERSION = "2.1.332"


def pinned_claude() -> str | None:
    """The pinned Claude Code CLI that `make test` installs, or None when it is not there."""
    candidate = os.environ.get("CODELEGATE_TEST_CLAUDE") or str(
        ROOT / ".tools" / "claude" / "node_modules" / ".bin" / "claude"
    )
    return candidate if shutil.which(candidate) else None


@pytest.fixture
def claude_bin() -> str:
    path = pinned_claude()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("the pinned Claude Code CLI is missing; run `make test`")
        pytest.skip("the pinned Claude Code CLI is not installed (run `make test`)")
    return path
