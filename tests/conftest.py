"""The test suite's root: the paths and the pinned CLI every folder may need.

The fixtures every folder may use are in tests/fixtures.py, registered here as a plugin; each
folder keeps its own conftest for the rest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import HealthCheck, settings

from codelegate.daemon.pinned import CLAUDE_CODE_VERSION

# No test may depend on the machine's speed: Hypothesis's default deadline (200 ms an example)
# and its too-slow health check fail a property on a loaded machine, with nothing wrong in the
# code.
settings.register_profile("codelegate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("codelegate")

ROOT = Path(__file__).resolve().parent.parent
# The reference transcripts of the design (shared/reference/claude-code-2.1.332), kept in the
# repository so that the tests do not depend on what lies beside the checkout.
REFERENCE = ROOT / "tests" / "golden" / "reference"
PINNED_CLAUDE_VERSION = CLAUDE_CODE_VERSION

pytest_plugins = ["tests.fixtures"]


def pytest_sessionstart(session: pytest.Session) -> None:
    # make test runs the suite on the source (coverage sees it) and then the translator's tests on
    # the compiled build: each pass must import the build it says it tests.
    from codelegate.translator import compiled

    if compiled() != bool(os.environ.get("CODELEGATE_TEST_COMPILED")):
        which = "compiled build" if compiled() else "source"
        pytest.exit(f"this pass imported the translator's {which} (CODELEGATE_TEST_COMPILED)", 3)


def pinned_claude() -> str | None:
    """The pinned Claude Code CLI that `make test` installs, or None when it is not there."""
    candidate = os.environ.get("CODELEGATE_TEST_CLAUDE") or str(
        ROOT / ".tools" / "claude" / "node_modules" / ".bin" / "claude"
    )
    return candidate if shutil.which(candidate) else None


def unavailable(why: str) -> NoReturn:
    """A test's tool or input is missing: skipped here, failed on CI (where every test runs)."""
    if os.environ.get("CI"):
        pytest.fail(f"{why}; on CI every test must run")
    pytest.skip(why)
