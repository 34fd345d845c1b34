"""Review evidence in the final result: the diff of what a run changed, the commands it ran.

A ConnectOnion agent may call no other tool after ``claude_code`` in the same turn (native
provider settlement), so the parent reviews from the result alone. The evidence is built from
the run's own card frames, which are already redacted and bounded: it says exactly what the
cards showed, and a translator restored from stored frames rebuilds it the same way.
"""

from __future__ import annotations

from typing import Final

from codelegate.policy.approvals import FILE_CHANGE_TOOLS
from codelegate.translator.bounds import utf8_len
from codelegate.translator.frames import (
    Command,
    CommandOutcome,
    ErrorType,
    Frame,
    ToolCall,
    ToolResult,
)
from codelegate.translator.redact import clean_chars, clean_text
from codelegate.translator.summary import changed_path

# The card closed because the run ended, not on the command's own result.
_RUN_ENDED: Final[frozenset[ErrorType | None]] = frozenset({"cancelled", "interrupted", "timeout"})

# Share of the final result's byte bound each kind of evidence may take: the final text, the
# denials and the rest keep at least half of it.
_CHANGES_SHARE: Final = (3, 8)
_COMMANDS_SHARE: Final = (1, 8)
_COMMAND_CHARS: Final = 1000
_ERROR_CHARS: Final = 300
# What a run keeps while it goes, before budgets apply: a run of thousands of edits must not
# grow without bound. Counted beyond that, never silently dropped.
_KEEP: Final = 512
_NAME_SEPARATOR: Final = " › "


class Review:
    """Collects file changes and Bash commands from a run's card frames, in order."""

    __slots__ = ("_changes", "_commands", "_cwd", "_lost_changes", "_lost_commands", "_open")

    def __init__(self, cwd: str) -> None:
        self._cwd = cwd
        # tool_id -> (tool, the command or the changed path) of an open card that matters here
        self._open: dict[str, tuple[str, str]] = {}
        self._changes: list[tuple[str, str | None]] = []  # (path, diff) per completed change
        self._commands: list[Command] = []
        self._lost_changes = 0
        self._lost_commands = 0

    def observe(self, frame: Frame) -> None:
        """Take note of a card frame (any other frame is ignored)."""
        if type(frame) is ToolCall:
            tool = reviewed_tool(frame.name)
            if tool is not None:
                self.opened(frame.tool_id, tool, frame.args)
        elif type(frame) is ToolResult:
            self.closed(frame)

    def opened(self, tool_id: str, tool: str, args: object) -> None:
        """A card's tool_call: ``tool`` is :func:`reviewed_tool` of its name (the card rules
        know it per tool name), ``args`` its cleaned arguments."""
        if tool == "Bash":
            command = args.get("command") if isinstance(args, dict) else None
            if isinstance(command, str):
                self._open[tool_id] = (tool, command)
        else:
            path = changed_path(tool, args, self._cwd)
            if path:
                self._open[tool_id] = (tool, path)

    def closed(self, frame: ToolResult) -> None:
        """A card's tool_result (of a card this took note of, or any other: ignored)."""
        opened = self._open.pop(frame.tool_id, None)
        if opened is None:
            return
        tool, what = opened
        if tool == "Bash":
            if len(self._commands) >= _KEEP:
                # The newest commands say most about the end state (did the tests pass?).
                del self._commands[0]
                self._lost_commands += 1
            self._commands.append(_command(what, frame))
        elif frame.status == "completed":
            if len(self._changes) >= _KEEP:
                self._lost_changes += 1
                return
            self._changes.append((what, frame.diff))

    def evidence(self, final_result_bytes: int) -> tuple[str, list[Command], int]:
        """``(changes, commands, commands_omitted)`` within their shares of the result's bound."""
        changes = self._changes_text(final_result_bytes * _CHANGES_SHARE[0] // _CHANGES_SHARE[1])
        commands, omitted = self._commands_within(
            final_result_bytes * _COMMANDS_SHARE[0] // _COMMANDS_SHARE[1]
        )
        return changes, commands, omitted + self._lost_commands

    def _changes_text(self, limit: int) -> str:
        if not self._changes and not self._lost_changes:
            return ""
        pieces = [diff or f"# {path}: changed; no diff reported\n" for path, diff in self._changes]
        # Room for the note, which names at most a few of the files it left out.
        room = max(limit - 512, 0)
        kept: list[str] = []
        used = 0
        left_out: list[str] = []
        left_bytes = 0
        for (path, _), piece in zip(self._changes, pieces, strict=True):
            size = utf8_len(piece)
            if not left_out and used + size <= room:
                kept.append(piece)
                used += size
            else:
                # Keep the order honest: once one is left out, later ones are too.
                left_out.append(path)
                left_bytes += size
        if left_out or self._lost_changes:
            count = len(left_out) + self._lost_changes
            names = ", ".join(dict.fromkeys(left_out[:8]))
            more = f" ({names}{', …' if len(set(left_out)) > 8 else ''})" if names else ""
            kept.append(
                f"# codelegate: {count} of {len(self._changes) + self._lost_changes} file changes "
                f"not shown{more}, {left_bytes} bytes of diff cut; files_changed lists every "
                "file\n"
            )
        # Each piece is clean already; the whole is cleaned again so that the guarantee holds
        # for the text the model reads, whatever the pieces were.
        return clean_text("".join(kept), limit)

    def _commands_within(self, limit: int) -> tuple[list[Command], int]:
        kept: list[Command] = []
        used = 0
        for command in reversed(self._commands):
            size = utf8_len(command.command) + utf8_len(command.error or "") + 64
            if used + size > limit:
                break
            kept.append(command)
            used += size
        kept.reverse()
        return kept, len(self._commands) - len(kept)


def reviewed_tool(name: str) -> str | None:
    """The tool a card frame's ``name`` speaks of, when the evidence takes note of it (a Bash
    command, a file change); None otherwise."""
    tool = name.rpartition(_NAME_SEPARATOR)[2]
    return tool if tool == "Bash" or tool in FILE_CHANGE_TOOLS else None


def _command(text: str, frame: ToolResult) -> Command:
    outcome: CommandOutcome
    if frame.status == "completed":
        outcome = "completed"
    elif frame.error_type == "permission_denied":
        outcome = "denied"
    elif frame.error_type in _RUN_ENDED:
        outcome = "interrupted"
    else:
        outcome = "failed"
    error = frame.error if outcome != "completed" else None
    return Command(
        # The command comes from the card's args, which the run's redactor cleaned: cleaned
        # text is a fixed point of redaction (tests/translator/test_review_commands.py), so
        # only a command past the bound is cut (and cleaned, as the cut needs).
        command=text if len(text) <= _COMMAND_CHARS else clean_chars(text, _COMMAND_CHARS),
        outcome=outcome,
        error=clean_chars(error, _ERROR_CHARS) if error else None,
    )
