"""The body of ``POST /v1/runs``: decoded strictly; 400/413 with a message naming the field.

Only shape is checked here (types, unknown fields, sizes, id syntax). Whether the caller may have
what it asks for (mode, workspace, model, budget, resume) is decided by ``policy.launch``.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

import msgspec

from codelegate.policy.codes import BAD_REQUEST, EMPTY_TASK, SLASH_COMMAND, TASK_TOO_LARGE
from codelegate.policy.errors import PolicyError

# The id syntax O Chat accepts for invocationId / parentToolCallId (chat-item-mapper.ts drops
# invocation frames whose ids do not match): policy checks a request's, the translator its own.
AGENT_IO_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,512}", re.ASCII)

# JSON escapes can make a body several times larger than the task it carries, so the body bound
# leaves room for that and for the other fields; the task itself is measured after decoding.
_BODY_OVERHEAD: Final = 64 * 1024
_BODY_FACTOR: Final = 6

_Text = Annotated[str, msgspec.Meta(max_length=4096)]


class Parent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The parent agent's tool call this run works for (Agent IO ``parentToolCallId``)."""

    tool_call_id: str
    session_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None


class RunRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A caller's request for one delegated run."""

    task: str
    cwd: _Text = "."
    mode: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    resume: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    model: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    max_budget_usd: Annotated[float, msgspec.Meta(gt=0, le=1_000_000)] | None = None
    parent: Parent | None = None
    wait: bool = False


_DECODER: Final = msgspec.json.Decoder(RunRequest)
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(.*)`")


def request_body_limit(max_task_bytes: int) -> int:
    """The largest ``POST /v1/runs`` body worth reading (e.g. aiohttp's ``client_max_size``)."""
    return max_task_bytes * _BODY_FACTOR + _BODY_OVERHEAD


def decode_run_request(body: bytes, *, max_task_bytes: int) -> RunRequest:
    """Decode and shape-check a ``POST /v1/runs`` body; PolicyError 400 or 413 on refusal."""
    if len(body) > request_body_limit(max_task_bytes):
        raise PolicyError(
            TASK_TOO_LARGE,
            f"request body too large: the task may be at most {max_task_bytes} bytes",
        )
    try:
        request = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise PolicyError(BAD_REQUEST, _describe(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise PolicyError(BAD_REQUEST, f"request body is not valid JSON: {exc}") from None
    size = len(request.task.encode("utf-8", "surrogatepass"))
    if size > max_task_bytes:
        raise PolicyError(
            TASK_TOO_LARGE,
            f"task is {size} bytes; at most {max_task_bytes} bytes are accepted",
        )
    if not request.task.strip():
        raise PolicyError(EMPTY_TASK, "task must not be empty")
    refuse_slash_command(request.task, "task")
    if request.parent is not None and not AGENT_IO_ID.fullmatch(request.parent.tool_call_id):
        raise PolicyError(
            BAD_REQUEST,
            "parent.tool_call_id: expected 1-512 characters of A-Z a-z 0-9 . _ : -",
        )
    return request


def refuse_slash_command(text: str, field: str) -> None:
    """Refuse a caller's text (the task, a steering message) that the CLI would take as one of
    its own commands: a user message whose first character is "/" (``/model``, ``/heapdump``,
    ``/config`` ...). One space before it makes it plain text for the model (measured on
    2.1.332, docs/cli-control-channel.md §7). ``--disable-slash-commands`` keeps the CLI from
    running any command; this keeps the caller from meeting the CLI's local answer instead of
    the model's, and a steering message from going unechoed."""
    if text.startswith("/"):
        raise PolicyError(
            SLASH_COMMAND,
            f'{field} must not start with "/": Claude Code would read it as one of its own '
            "commands, which callers cannot use; put a space or a word before it",
        )


def _describe(message: str) -> str:
    """msgspec's ``Expected `bool`, got `str` - at `$.wait``` → ``wait: expected `bool`, …``."""
    text, _, path = message.partition(" - at `$")
    field = path.rstrip("`").lstrip(".")
    unknown = _UNKNOWN.fullmatch(text)
    if unknown:
        known = msgspec.structs.fields(Parent if field == "parent" else RunRequest)
        name = f"{field}.{unknown.group(1)}" if field else unknown.group(1)
        return f"{name}: unknown field; expected one of: {', '.join(f.name for f in known)}"
    where = field or "request body"
    return f"{where}: {text[:1].lower()}{text[1:]}"
