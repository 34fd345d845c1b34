"""Committed transcripts stay usable: JSON lines, described, free of machine traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import PINNED_CLAUDE_VERSION
from tests.golden.capture import SCENARIOS, TRANSCRIPTS, leaks

FILES = sorted(TRANSCRIPTS.glob("*.jsonl"))
MANIFEST = json.loads((TRANSCRIPTS / "manifest.json").read_text())


def test_every_scenario_has_a_transcript() -> None:
    names = {path.name for path in FILES}
    for name in SCENARIOS:
        assert f"{name}.jsonl" in names or f"{name}_1.jsonl" in names, name
    assert set(MANIFEST) == names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_transcript_is_clean_json_lines_of_the_pinned_cli(path: Path) -> None:
    data = path.read_text()
    assert not leaks(data)
    lines = [json.loads(raw) for raw in data.splitlines()]
    assert all(isinstance(line, dict) and "type" in line for line in lines)
    for init in (line for line in lines if line.get("subtype") == "init"):
        assert init["claude_code_version"] == PINNED_CLAUDE_VERSION
        assert init["cwd"] == "/srv/workspaces/demo"
    assert lines[-1]["type"] == "result"
    assert (lines[-1]["is_error"] is True) == (MANIFEST[path.name]["exit_code"] == 1)
