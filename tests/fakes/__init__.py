"""Fault-injecting fakes: ``fake_claude.py`` stands in for the Claude Code CLI."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fake_claude import PLANTED_SECRET

FAKE_CLAUDE = str(Path(__file__).resolve().parent / "fake_claude.py")

__all__ = ["FAKE_CLAUDE", "PLANTED_SECRET"]
