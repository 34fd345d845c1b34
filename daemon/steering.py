"""Steering: a user message written to a running CLI (``POST /v1/runs/{id}/input``).

Measured on 2.1.332 (docs/cli-control-channel.md §4): a user message written to stdin mid-run
reaches the model. Written while a tool runs, it joins that tool's result (the turn goes on, one
``result``); written while the model answers without tools, it is a turn of its own after that
answer (a second ``result``). So the run is not over at a ``result`` while a message written to
it may still be unread: :class:`Inputs` keeps stdin open until the CLI has taken in every
message written (``--replay-user-messages`` echoes each one as the CLI takes it in) and a
``result`` has come after the last one.
"""

from __future__ import annotations

from typing import Any

import msgspec

from codelegate.daemon.record import Run
from codelegate.policy.codes import (
    BAD_REQUEST,
    EMPTY_TASK,
    RUN_FINISHED,
    TASK_TOO_LARGE,
    TOO_MANY_INPUT_BYTES,
    TOO_MANY_INPUTS,
)
from codelegate.policy.errors import PolicyError
from codelegate.policy.request import refuse_slash_command
from codelegate.translator.bounds import utf8_len
from codelegate.translator.control import user_message


class _Input(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    text: str


def decode_input(body: bytes, *, max_bytes: int) -> str:
    """The text of an input body; 400 / 413 like a task's (the same ``[limits] task_bytes``)."""
    try:
        text = msgspec.json.decode(body, type=_Input).text
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PolicyError(BAD_REQUEST, f"bad input: {str(exc)[:300]}") from None
    size = utf8_len(text)
    if size > max_bytes:
        raise PolicyError(
            TASK_TOO_LARGE, f"text is {size} bytes; at most {max_bytes} bytes are accepted"
        )
    if not text.strip():
        raise PolicyError(EMPTY_TASK, "text must not be empty")
    refuse_slash_command(text, "text")
    return text


def send_input(
    run: Run | None, text: str, *, max_unread: int, max_unread_bytes: int
) -> dict[str, Any]:
    """Write ``text`` to the run's CLI as a user message; 409 once the run is ending, 429 while
    ``max_unread`` messages wait for the CLI to take them in (``[limits] pending_inputs``), or
    while ``text`` would take the bytes waiting past ``max_unread_bytes``
    (``pending_input_bytes``)."""
    if run is None or run.done.is_set():
        raise PolicyError(RUN_FINISHED, "the run already ended")
    child = run.child
    if run.stopping is not None or child is None or not child.stdin_open:
        raise PolicyError(RUN_FINISHED, "the run is ending; it takes no more input")
    # The CLI keeps what it has not taken in queued in memory, unbounded: the daemon bounds it.
    channel = run.translator.channel
    if channel.unread >= max_unread:
        raise PolicyError(
            TOO_MANY_INPUTS,
            f"{channel.unread} messages wait for the CLI to take them in; "
            f"at most {max_unread} may wait",
        )
    size = utf8_len(text)
    if channel.unread_bytes + size > max_unread_bytes:
        raise PolicyError(
            TOO_MANY_INPUT_BYTES,
            f"{channel.unread_bytes} bytes of input wait for the CLI to take them in, and this "
            f"message is {size}; at most {max_unread_bytes} bytes may wait",
        )
    # Counted before it is written: the pump reads the CLI's echo only after this returns.
    channel.input_written(text)
    child.send(user_message(text))
    return {"run_id": run.run_id, "accepted": True}
