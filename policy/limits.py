"""``[limits]``: bounds on what a run may produce and what the daemon keeps.

Part of the operator's config (``policy.config`` parses it and asks :func:`limits_problem` for
what the schema cannot say); pure.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

KiB: Final = 1024
MiB: Final = 1024 * KiB

# Without [limits] pending_input_bytes, the unread steering text of a run may be this many
# times task_bytes (a few messages of the largest size, fewer than pending_inputs of them).
PENDING_INPUT_TASKS: Final = 4


class LimitsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[limits]``: bounds on what a run may produce and what the daemon keeps."""

    arg_bytes: Annotated[int, msgspec.Meta(ge=256, le=1 * MiB)] = 4 * KiB
    result_bytes: Annotated[int, msgspec.Meta(ge=256, le=1 * MiB)] = 4 * KiB
    final_result_bytes: Annotated[int, msgspec.Meta(ge=1 * KiB, le=16 * MiB)] = 64 * KiB
    line_bytes: Annotated[int, msgspec.Meta(ge=64 * KiB, le=256 * MiB)] = 8 * MiB
    task_bytes: Annotated[int, msgspec.Meta(ge=1 * KiB, le=8 * MiB)] = 1 * MiB
    text_chars: Annotated[int, msgspec.Meta(ge=256, le=1_000_000)] = 16_000
    replay_frames: Annotated[int, msgspec.Meta(ge=100, le=10_000_000)] = 50_000
    subscriber_queue: Annotated[int, msgspec.Meta(ge=16, le=1_000_000)] = 1024
    stderr_lines: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 200
    # Steering messages of one run written but not yet taken in by the CLI: it queues them in
    # memory (about twice their size) and each becomes model input, so a caller may not pile
    # them up, in number nor in bytes; one message is at most task_bytes.
    pending_inputs: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 16
    # None: PENDING_INPUT_TASKS x task_bytes (see pending_input_cap).
    pending_input_bytes: Annotated[int, msgspec.Meta(ge=1 * KiB, le=1024 * MiB)] | None = None
    # What the run store keeps of one run; later frames are delivered live, not stored.
    max_stored_frames: Annotated[int, msgspec.Meta(ge=1000, le=100_000_000)] = 200_000
    max_stored_bytes: Annotated[int, msgspec.Meta(ge=1 * MiB, le=64 * 1024 * MiB)] = 128 * MiB

    @property
    def pending_input_cap(self) -> int:
        """The UTF-8 bytes of steering text of one run that may wait for the CLI at once."""
        if self.pending_input_bytes is not None:
            return self.pending_input_bytes
        return PENDING_INPUT_TASKS * self.task_bytes


def limits_problem(limits: LimitsConfig) -> tuple[str, str] | None:
    """``(key, expected)`` for a ``[limits]`` the schema lets through but the daemon cannot
    keep; None when there is none."""
    cap = limits.pending_input_bytes
    if cap is not None and cap < limits.task_bytes:
        return (
            "limits.pending_input_bytes",
            f"expected at least task_bytes ({limits.task_bytes}), or a steering message of "
            f"task_bytes could never be accepted; got {cap}",
        )
    return None
