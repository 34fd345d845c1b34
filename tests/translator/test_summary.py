"""Human card titles and Work Room texts."""

from __future__ import annotations

import pytest

from codelegate.translator.summary import (
    activity_kind,
    activity_texts,
    changed_path,
    relative_path,
    tool_title,
)

CWD = "/srv/workspaces/demo"


@pytest.mark.parametrize(
    ("tool", "args", "title"),
    [
        ("Read", {"file_path": f"{CWD}/src/app.py"}, "Read src/app.py"),
        ("Write", {"file_path": f"{CWD}/README.md"}, "Write README.md"),
        ("Edit", {"file_path": f"{CWD}/README.md"}, "Edit README.md"),
        ("MultiEdit", {"file_path": "/etc/hosts"}, "Edit /etc/hosts"),
        ("NotebookEdit", {"notebook_path": f"{CWD}/n.ipynb"}, "Edit n.ipynb"),
        ("Bash", {"command": "pytest   -q\n  --lf"}, "Run: pytest -q --lf"),
        ("Grep", {"pattern": "TODO", "path": f"{CWD}/src"}, 'Search "TODO" in src'),
        ("Grep", {"pattern": "TODO"}, 'Search "TODO"'),
        ("Glob", {"pattern": "**/*.py", "path": CWD}, "Find **/*.py in ."),
        ("Glob", {"pattern": "*.md"}, "Find *.md"),
        ("LS", {"path": f"{CWD}/src/"}, "List src"),
        ("WebFetch", {"url": "https://example.org"}, "Fetch https://example.org"),
        ("WebSearch", {"query": "msgspec"}, 'Search the web for "msgspec"'),
        ("Agent", {"description": "Find  the bug"}, "Agent: Find the bug"),
        ("Task", {"prompt": "no description"}, "Task"),
        ("TodoWrite", {"todos": []}, "Update the to-do list"),
        ("Read", {"file_path": 5}, "Read"),
        ("Read", "not a dict", "Read"),
        ("LS", {}, "LS"),
        ("Bash", {}, "Bash"),
        ("Grep", {}, "Grep"),
        ("Glob", {}, "Glob"),
        ("WebFetch", {}, "WebFetch"),
        ("WebSearch", {}, "WebSearch"),
        ("Write", {}, "Write"),
        ("Edit", {}, "Edit"),
        ("mcp__x__y", {"a": 1}, "mcp__x__y"),
    ],
)
def test_titles(tool: str, args: object, title: str) -> None:
    assert tool_title(tool, args, CWD) == title


def test_relative_paths() -> None:
    assert relative_path(f"{CWD}/a/../b.py", CWD) == "b.py"
    assert relative_path(CWD, CWD) == "."
    assert relative_path("/srv/workspaces/demo2/x", CWD) == "/srv/workspaces/demo2/x"
    assert relative_path("rel/x", CWD) == "rel/x"
    assert relative_path("/x/y", "/") == "x/y"
    assert relative_path("/x/y", "") == "x/y"


def test_kinds_and_texts() -> None:
    assert [activity_kind(t) for t in ("Edit", "Read", "Grep", "Bash", "Agent")] == [
        "file_change",
        "inspect",
        "search",
        "command",
        "tool",
    ]
    assert activity_texts("command", "failed") == (
        "Run a workspace command",
        "A workspace command failed",
    )


def test_changed_path() -> None:
    assert changed_path("Write", {"file_path": f"{CWD}/a"}, CWD) == "a"
    assert changed_path("Read", {"file_path": f"{CWD}/a"}, CWD) is None
    assert changed_path("Edit", "x", CWD) is None
    assert changed_path("Edit", {}, CWD) is None
