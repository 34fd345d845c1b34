"""The fake Claude Code CLIs, in one place (stdlib-only scripts, started by path).

``fake_claude.py`` injects faults by scenario; ``leaky_claude.py`` plants credentials wherever
it can; ``chatty_claude.py`` is fast and talkative for load tests; ``spy.Spy`` records every
start of the first. Where the real CLI can plant the input, the tests use it instead.
"""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fake_claude import PLANTED_SECRET

_HERE = Path(__file__).resolve().parent
FAKE_CLAUDE = str(_HERE / "fake_claude.py")
LEAKY_CLAUDE = str(_HERE / "leaky_claude.py")
CHATTY_CLAUDE = str(_HERE / "chatty_claude.py")

__all__ = ["CHATTY_CLAUDE", "FAKE_CLAUDE", "LEAKY_CLAUDE", "PLANTED_SECRET"]
