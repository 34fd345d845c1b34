"""Helpers shared by the translator tests: contexts, feeding, and frames as plain data."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

import msgspec

from codelegate.translator import Limits, Outcome, RunContext, Translator
from codelegate.translator.frames import Frame, encode_frame

CWD = "/srv/workspaces/demo"
EXITED = Outcome(reason="exited", exit_code=0)


def context(**overrides: Any) -> RunContext:
    """A run context for tests; ``parent`` in the name of O Chat's Work Room is on by default."""
    fields: dict[str, Any] = {
        "run_id": "run-1",
        "cwd": CWD,
        "started_at": 1000.0,
        "parent_tool_call_id": "call_1",
    }
    fields.update(overrides)
    return RunContext(**fields)


def line(**fields: Any) -> bytes:
    """One stream-json line."""
    return json.dumps(fields).encode() + b"\n"


def system(subtype: str, **fields: Any) -> bytes:
    """One ``system`` line of ``subtype``."""
    return line(type="system", subtype=subtype, **fields)


def run(
    chunks: Iterable[bytes],
    ctx: RunContext | None = None,
    *,
    outcome: Outcome = EXITED,
    limits: Limits | None = None,
    now: float = 1001.0,
) -> list[Frame]:
    """Every frame of a run fed ``chunks``, closed with ``outcome``."""
    translator = Translator(ctx or context(), limits)
    frames = translator.start(1000.0)
    for chunk in chunks:
        frames += translator.receive_data(chunk, now)
    frames += translator.close(outcome, now + 1)
    return frames


def as_data(frames: Sequence[Frame]) -> list[dict[str, Any]]:
    """Frames as the JSON objects a client receives."""
    return [msgspec.json.decode(encode_frame(frame)) for frame in frames]


def of_type(frames: Sequence[Frame], kind: str) -> list[dict[str, Any]]:
    return [frame for frame in as_data(frames) if frame["type"] == kind]


def chunked(data: bytes, sizes: Iterable[int]) -> list[bytes]:
    """``data`` cut into chunks of the given sizes (the rest in one last chunk)."""
    out: list[bytes] = []
    pos = 0
    for size in sizes:
        if pos >= len(data):
            break
        out.append(data[pos : pos + size])
        pos += size
    if pos < len(data):
        out.append(data[pos:])
    return out


def assistant(*blocks: dict[str, Any], parent: str | None = None) -> bytes:
    return line(
        type="assistant",
        message={"id": "msg_1", "role": "assistant", "content": list(blocks)},
        parent_tool_use_id=parent,
        session_id="s-1",
    )


def tool_use(use_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": name, "input": args}


def tool_result(
    use_id: str,
    content: Any = "ok",
    *,
    is_error: bool | None = None,
    parent: str | None = None,
    extra: Any = None,
) -> bytes:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use_id, "content": content}
    if is_error is not None:
        block["is_error"] = is_error
    fields: dict[str, Any] = {
        "type": "user",
        "message": {"role": "user", "content": [block]},
        "parent_tool_use_id": parent,
    }
    if extra is not None:
        fields["tool_use_result"] = extra
    return line(**fields)


def result_line(text: str = "done", **fields: Any) -> bytes:
    base: dict[str, Any] = {
        "subtype": "success",
        "is_error": False,
        "result": text,
        "session_id": "s-1",
        "num_turns": 1,
        "duration_ms": 5,
        "total_cost_usd": 0.01,
        "usage": {"input_tokens": 1, "output_tokens": 2},
        "permission_denials": [],
    }
    base.update(fields)
    base["type"] = "result"  # last, as the CLI writes it
    return line(**base)


def init_line(session_id: str = "s-1") -> bytes:
    return line(type="system", subtype="init", session_id=session_id, cwd=CWD, tools=["Read"])


def encode(value: str, how: str, before: bytes, after: bytes) -> tuple[str, str]:
    """The text ``value`` appears as when encoded ``how`` among other bytes, and the part of that
    text that comes from the value alone (what must not survive)."""
    raw = value.encode()
    if how in ("base64", "urlsafe_base64"):
        blob = base64.b64encode(before + raw + after).decode()
        if how == "urlsafe_base64":
            blob = blob.replace("+", "-").replace("/", "_")
        # The characters whose 6 bits all lie within the value's bytes.
        first, last = -(-8 * len(before) // 6), (8 * (len(before) + len(raw))) // 6
        return blob, blob[first:last]
    if how in ("hex", "HEX"):
        blob = raw.hex() if how == "hex" else raw.hex().upper()
        return blob, blob
    if how == "json":
        blob = json.dumps({"v": value})
        return blob, json.dumps(value)[1:-1]
    if how == "url":
        return f"https://h/?q={quote(value, safe='')}", quote(value, safe="")
    return value, value
