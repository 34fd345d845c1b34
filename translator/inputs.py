"""What the daemon gives a run's translator: its context, its bounds, and how the CLI ended."""

from __future__ import annotations

from typing import Final, Literal

import msgspec

# A tool's name is short; bounded anyway, as it goes into every frame of its card.
NAME_CHARS: Final = 128


class RunContext(msgspec.Struct, frozen=True, kw_only=True):
    """What the daemon knows of a run before the CLI says anything."""

    run_id: str
    cwd: str  # resolved run cwd: summaries and files_changed are relative to it
    mode: str = "safe"  # request mode: safe | accept_edits | auto | plan
    parent_tool_call_id: str | None = None  # -> invocationId "claude_code:<id>", parentToolCallId
    parent_session_id: str | None = None
    session_id: str | None = None  # the id the CLI was launched with (--session-id / --resume)
    resumed: bool = False
    started_at: float  # epoch seconds
    # The last stateRevision and Work Room row number already used under this run's invocation
    # id by earlier runs (a follow-up continues the Work Room): the daemon keeps them in its store.
    revision_base: int = 0
    sequence_base: int = 0


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds on what frames carry (DESIGN invariant 7); bytes are UTF-8 bytes."""

    arg_bytes: int = 4096
    result_bytes: int = 4096
    final_result_bytes: int = 65536
    line_bytes: int = 8 * 1024 * 1024
    text_chars: int = 16000
    summary_chars: int = 240  # O Chat cuts card summaries there
    error_chars: int = 1024
    items: int = 64  # entries kept per list or object in args
    held_lines: int = 1000  # subagent lines waiting for their Task card
    denials: int = 32
    stderr_chars: int = 2000  # the end of stderr kept in a failed run's result


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """How the CLI process ended, as the daemon saw it."""

    reason: Literal["exited", "cancelled", "timeout", "interrupted", "spawn_failed"]
    exit_code: int | None = None
    signal: int | None = None
    stderr_tail: str = ""  # already redacted and bounded by the daemon
    frames_not_stored: int = 0  # frames past the run store's cap (delivered live only)
