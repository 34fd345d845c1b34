"""Human titles for cards, activity kinds, and the fixed texts O Chat's Work Room accepts.

Card titles (``summary``) may name paths and commands: they are redacted and cut to 240
characters by the caller. Activity texts never do: O Chat accepts only the allowlisted pairs below.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any, Final

from codelegate.policy.approvals import FILE_CHANGE_TOOLS
from codelegate.translator.frames import ActivityKind, ActivityStatus

SUBAGENT_TOOLS: Final = frozenset({"Task", "Agent"})

_KINDS: Final[dict[str, ActivityKind]] = {
    **dict.fromkeys(FILE_CHANGE_TOOLS, "file_change"),
    **dict.fromkeys(("Read", "Glob", "LS"), "inspect"),
    **dict.fromkeys(("Grep", "WebSearch", "WebFetch"), "search"),
    "Bash": "command",
}

# (title, running, completed, failed summaries) per kind: DESIGN "What O Chat accepts".
_ACTIVITY_TEXTS: Final[dict[ActivityKind, tuple[str, str, str, str]]] = {
    "file_change": (
        "Update workspace files",
        "Preparing workspace file changes",
        "Workspace files updated",
        "Workspace file change failed",
    ),
    "inspect": (
        "Inspect the workspace",
        "Inspecting workspace context",
        "Workspace inspection completed",
        "Workspace inspection failed",
    ),
    "search": (
        "Search for context",
        "Searching for relevant context",
        "Context search completed",
        "Context search failed",
    ),
    "command": (
        "Run a workspace command",
        "Running a workspace command",
        "Completed a workspace command",
        "A workspace command failed",
    ),
    "tool": (
        "Use a provider tool",
        "Using a provider tool",
        "Provider tool completed",
        "Provider tool failed",
    ),
}
_STATUS_INDEX: Final[dict[ActivityStatus, int]] = {"running": 1, "completed": 2, "failed": 3}


def activity_kind(tool: str) -> ActivityKind:
    """The Work Room kind of a tool (``tool`` for any tool not named in DESIGN)."""
    return _KINDS.get(tool, "tool")


def activity_texts(kind: ActivityKind, status: ActivityStatus) -> tuple[str, str]:
    """The allowlisted ``(title, summary)`` pair for an activity row."""
    texts = _ACTIVITY_TEXTS[kind]
    return texts[0], texts[_STATUS_INDEX[status]]


def relative_path(path: str, cwd: str) -> str:
    """``path`` relative to the run's ``cwd`` when inside it; otherwise as given."""
    if not path.startswith("/"):
        return path
    # The common case without normpath: a plain path under the cwd.
    n = len(cwd)
    if cwd and path.startswith(cwd) and path.startswith("/", n):
        rest = path[n + 1 :]
        # No "/." anywhere: also no rest that starts with a dot (it follows the cwd's slash).
        if rest and "/." not in path and "//" not in path:
            return rest.removesuffix("/")
    norm = posixpath.normpath(path)
    base = posixpath.normpath(cwd) if cwd else "/"
    if norm == base:
        return "."
    prefix = base if base.endswith("/") else base + "/"
    return norm[len(prefix) :] if norm.startswith(prefix) else norm


def _text(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    return value if isinstance(value, str) else ""


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` on one line (every run of whitespace one space), cut to ``limit`` with an
    ellipsis."""
    line = " ".join(text.split())
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


def tool_title(tool: str, args: Any, cwd: str) -> str:
    """A short human title: ``Read src/app.py``, ``Run: pytest -q``, ``Search "TODO" in src``."""
    return titled(tool, title_of(tool), args, cwd)


Title = Callable[[dict[str, Any], str], str]


def title_of(tool: str) -> Title | None:
    """The title function of ``tool`` (None: its name is its title); see :func:`titled`."""
    return _TITLES.get(tool)


def titled(tool: str, title: Title | None, args: Any, cwd: str) -> str:
    """:func:`tool_title` with the tool's title function already looked up (a card's)."""
    if title is None or not isinstance(args, dict):
        return tool
    return title(args, cwd) or tool


def _title(
    before: str,
    keys: tuple[str, ...],
    after: str = "",
    shape: Callable[[str, str], str] | None = None,
    where: bool = False,
) -> Title:
    # ``before`` + the first string of ``keys`` (``shape``d) + ``after`` [+ " in <path>"], or ""
    # when the call has none: a title costs only the fields its tool has.
    def title(args: dict[str, Any], cwd: str) -> str:
        for key in keys:
            value = args.get(key)
            if value and isinstance(value, str):
                break
        else:
            return ""
        if shape is not None:
            value = shape(value, cwd)
        if where:
            path = relative_path(_text(args, "path"), cwd)
            return f"{before}{value}{after} in {path}" if path else f"{before}{value}{after}"
        return f"{before}{value}{after}"

    return title


def _one_line(text: str, cwd: str) -> str:
    return one_line(text)


_PATHS: Final = ("file_path", "notebook_path")


def _edit(verb: str) -> Title:
    return _title(f"{verb} ", _PATHS, shape=relative_path)


def _subagent(tool: str) -> Title:
    return _title(f"{tool}: ", ("description",), shape=_one_line)


# One function per tool, so that a title costs only the fields that tool has.
_TITLES: Final[dict[str, Title]] = {
    "Read": _edit("Read"),
    "Write": _edit("Write"),
    "Edit": _edit("Edit"),
    "MultiEdit": _edit("Edit"),
    "NotebookEdit": _edit("Edit"),
    "Bash": _title("Run: ", ("command",), shape=_one_line),
    "Grep": _title('Search "', ("pattern",), '"', where=True),
    "Glob": _title("Find ", ("pattern",), where=True),
    "LS": _title("List ", ("path",), shape=relative_path),
    "WebFetch": _title("Fetch ", ("url",)),
    "WebSearch": _title('Search the web for "', ("query",), '"'),
    "Task": _subagent("Task"),
    "Agent": _subagent("Agent"),
    "TodoWrite": lambda args, cwd: "Update the to-do list",
}


def changed_path(tool: str, args: Any, cwd: str) -> str | None:
    """The file a file-changing tool wrote, relative to ``cwd`` (for ``files_changed``)."""
    if tool not in FILE_CHANGE_TOOLS or not isinstance(args, dict):
        return None
    path = _text(args, "file_path") or _text(args, "notebook_path")
    return relative_path(path, cwd) if path else None
