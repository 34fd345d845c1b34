"""Committed transcripts stay usable: JSON lines, described, free of machine traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codelegate.policy.argv import CHANNEL_FLAGS, FIXED_FLAGS
from codelegate.translator.control import INITIALIZE_ID
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


def _holds(argv: list[str], flags: tuple[str, ...]) -> bool:
    return any(argv[at : at + len(flags)] == list(flags) for at in range(len(argv)))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_transcript_was_captured_as_the_daemon_runs_the_cli(path: Path) -> None:
    # The goldens test the translator on what production prints: the daemon's fixed flags,
    # and the prompt over the control channel (a one-shot CLI prints other lines).
    argv = MANIFEST[path.name]["argv"]
    assert _holds(argv, FIXED_FLAGS)
    assert _holds(argv, CHANNEL_FLAGS)
    lines = [json.loads(raw) for raw in path.read_text().splitlines()]
    if any(line.get("subtype") == "init" for line in lines):
        # The CLI answered our initialize and echoed the prompt it took from stdin.
        answers = [line["response"] for line in lines if line["type"] == "control_response"]
        assert [answer["request_id"] for answer in answers] == [INITIALIZE_ID]
        replays = [line for line in lines if line["type"] == "user" and line.get("isReplay")]
        assert len(replays) == 1
        assert isinstance(replays[0]["message"]["content"], str)
