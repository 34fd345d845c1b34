#!/usr/bin/env python3
"""A stand-in CLI for ``bench_approvals``: permission prompts, one after the other, timed.

Reads the daemon's ``initialize`` and the prompt (``<timings file> <count>``), then ``count``
times: a Bash ``tool_use`` and its ``can_use_tool`` control request in one write, stamped
``sent_at`` (epoch seconds) in the tool input; waits for the answer on stdin and notes when it
read it; the tool's result; and at the end a ``result``. The read times go to the timings file
(one per line) when stdin closes. Standard library only; it ignores its argv.
"""

from __future__ import annotations

import json
import sys
import time
import uuid

SESSION = str(uuid.uuid4())


def emit(*objs: dict[str, object]) -> None:
    sys.stdout.write("".join(json.dumps(o) + "\n" for o in objs))
    sys.stdout.flush()


def assistant(content: list[dict[str, object]], n: int) -> dict[str, object]:
    message = {"id": f"msg_{n}", "type": "message", "role": "assistant", "content": content}
    return {"type": "assistant", "message": message, "session_id": SESSION}


def main() -> int:
    stdin = sys.stdin.buffer
    stdin.readline()  # initialize: this stand-in needs no answer of the daemon
    prompt = json.loads(stdin.readline())["message"]["content"]
    path, count = prompt.split()[:2]
    emit({"type": "system", "subtype": "init", "session_id": SESSION, "tools": ["Bash"]})
    read_at: list[float] = []
    for n in range(int(count)):
        use = f"toolu_bench{n:08d}"
        args = {"command": f"touch f{n}", "description": "bench", "sent_at": time.time()}
        request = {
            "subtype": "can_use_tool",
            "tool_name": "Bash",
            "display_name": "Bash",
            "input": args,
            "tool_use_id": use,
            "description": "bench",
        }
        emit(
            assistant([{"type": "tool_use", "id": use, "name": "Bash", "input": args}], n),
            {"type": "control_request", "request_id": f"req-{n}", "request": request},
        )
        for raw in stdin:
            line = json.loads(raw)
            response = line.get("response") or {}
            if line.get("type") == "control_response" and response.get("request_id") == f"req-{n}":
                read_at.append(time.time())
                break
        block = {"type": "tool_result", "tool_use_id": use, "content": "", "is_error": False}
        emit({"type": "user", "message": {"role": "user", "content": [block]}})
    emit(
        assistant([{"type": "text", "text": "Done."}], -1),
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "Done.",
            "session_id": SESSION,
            "num_turns": 1,
            "usage": {},
            "permission_denials": [],
        },
    )
    for _ in stdin:  # until the daemon closes stdin
        pass
    with open(path, "w") as fh:
        fh.write("".join(f"{t!r}\n" for t in read_at))
    return 0


if __name__ == "__main__":
    sys.exit(main())
