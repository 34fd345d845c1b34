#!/usr/bin/env python3
"""A fast, talkative stand-in for the Claude CLI, for load tests (stdlib only).

The prompt's first line is ``chatty n=<tool pairs> pad=<bytes of tool output> [gate=<path>]``.
It prints an init line, waits (bounded) until the file ``gate`` exists when one is given, then
``n`` tool_use/tool_result pairs whose results carry ``pad`` bytes (so that frames are big enough
to fill a slow client's socket buffers), a text and a result; exit 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

# A script of its own, started by path: the fakes' stdin reader is found from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fakes.fake_claude import VERSION, read_prompt


def main() -> int:
    if "--version" in sys.argv:
        print(f"{VERSION} (Claude Code)")
        return 0
    prompt = read_prompt()
    words = prompt.split("\n", 1)[0].split()
    params = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    n, pad = int(params.get("n", "100")), int(params.get("pad", "1000"))
    args = sys.argv[1:]
    session = args[args.index("--session-id") + 1] if "--session-id" in args else str(uuid.uuid4())
    out = sys.stdout.buffer

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    base: dict[str, Any] = {"parent_tool_use_id": None, "session_id": session}
    emit({"type": "system", "subtype": "init", "session_id": session, "cwd": ".", "tools": []})
    out.flush()
    gate = params.get("gate")
    deadline = time.monotonic() + 60
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)
    body = ("x" * 63 + "\n") * (pad // 64)
    for i in range(n):
        tid = f"toolu_chatty{i:06d}"
        use = {"type": "tool_use", "id": tid, "name": "Bash", "input": {"command": f"echo {i}"}}
        emit({"type": "assistant", "message": {"id": f"m{i}", "content": [use]}} | base)
        res = {"type": "tool_result", "tool_use_id": tid, "content": body, "is_error": False}
        emit({"type": "user", "message": {"role": "user", "content": [res]}} | base)
        out.flush()
    emit(
        {"type": "assistant", "message": {"id": "end", "content": [{"type": "text", "text": "ok"}]}}
        | base
    )
    emit(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "done",
            "session_id": session,
            "num_turns": n,
        }
    )
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
