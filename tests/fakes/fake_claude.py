#!/usr/bin/env python3
"""A fault-injecting stand-in for ``claude -p --output-format stream-json`` (stdlib only).

It accepts the real CLI's flags, reads the prompt from stdin (a stream-json user message with
``--input-format stream-json``) and prints stream-json lines shaped
like those of Claude Code 2.1.332. What it does is chosen by a scenario, taken from (first hit):

1. the prompt's first line, ``fake: <scenario> key=value ...`` (works through the daemon, whose
   child environment passes almost nothing);
2. the environment, ``FAKE_CLAUDE_SCENARIO="<scenario> key=value ..."``;
3. otherwise ``normal``.

Scenarios (keys in brackets):
  normal            init, a Bash tool_use, its tool_result, a text, a result; exit 0
  crash             init, a tool_use, then dies [how=abort|segv|exit139]
  hang              prints nothing and sleeps [after=init: print init first]
  garbage           init, binary junk and broken JSON lines, then a normal ending
  big_line          init, one line of [bytes=52428800] bytes, then a normal ending
  exit_before_init  a stderr message and exit 1, no stdout
  ignore_term       ignores SIGTERM; init, a tool_use, then sleeps
  ignore_interrupt  init, a tool_use, then copies each later stdin line to [lines=PATH] without
                    answering; writes "SIGTERM" there and exits 143 on SIGTERM [background=ID,ID:
                    first a background_tasks_changed line listing those tasks open]
  grandchild        init, a Bash tool_use, leaves a double-forked setsid grandchild that ignores
                    SIGTERM and sleeps [pidfile=PATH] [hold_stdio=1: it keeps our stdout/stderr]
                    [scrub_env=1: it re-executes itself with an empty environment]
                    [then=hang|exit]
  stderr            [lines=5] stderr lines, one with a planted API key, [long=N] then one
                    line of N characters, then a normal run
  tools             [n=1000] tool lines (tool_use/tool_result alternating) as fast as possible
                    [rate=0: lines per second, 0 = unthrottled]; each tool_use input carries
                    ``sent_at`` (epoch seconds) for latency measurement; then a result
                    [gate=PATH: a FIFO; each [batch=50] lines wait for one byte from it, so a
                    test paces the run by its reader's progress instead of the clock]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import uuid
from typing import Any

PLANTED_SECRET = "sk-ant-api03-" + "Zm9vYmFyYmF6cXV4" * 4 + "-AAAA"
VERSION = "2.1.332"


def _argv(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="claude", add_help=False)
    parser.add_argument("-p", "--print", action="store_true")
    parser.add_argument("--output-format", default="text")
    parser.add_argument("--input-format", default="text")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--safe-mode", action="store_true")
    parser.add_argument("--include-partial-messages", action="store_true")
    parser.add_argument("--permission-prompts", default=None)
    parser.add_argument("--permission-mode", default="default")
    parser.add_argument("--session-id", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--model", default="claude-opus-5-5")
    parser.add_argument("--max-budget-usd", default=None)
    for name in ("--allowed-tools", "--allowedTools", "--disallowed-tools", "--disallowedTools"):
        parser.add_argument(name, action="append", nargs="*", default=[])
    parser.add_argument("--version", action="store_true")
    ns, _unknown = parser.parse_known_args(args)
    return ns


def read_prompt() -> str:
    """The prompt: a user message on a stream-json stdin (``--input-format stream-json``, after
    the ``initialize`` request), else the whole of a text stdin. Stdin is not read any further
    (like a CLI busy with its turn), so the daemon's later lines wait in the pipe."""
    args = sys.argv
    if "--input-format" not in args[:-1] or args[args.index("--input-format") + 1] != "stream-json":
        return sys.stdin.read()
    while line := sys.stdin.readline():
        msg = json.loads(line)
        if msg.get("type") == "user":
            return str(msg["message"]["content"])
    return ""


def _emit(obj: dict[str, Any]) -> None:
    _out = sys.stdout.buffer
    _out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    _out.flush()


class Script:
    """Prints the lines of one fake session."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.session = ns.resume or ns.session_id or str(uuid.uuid4())
        self.mode = ns.permission_mode
        self.model = ns.model
        self.tools = 0

    def base(self) -> dict[str, Any]:
        return {"parent_tool_use_id": None, "session_id": self.session, "uuid": str(uuid.uuid4())}

    def init(self) -> None:
        _emit(
            {
                "type": "system",
                "subtype": "init",
                "cwd": os.getcwd(),
                "session_id": self.session,
                "tools": ["Bash", "Edit", "Read", "Write"],
                "mcp_servers": [],
                "model": self.model,
                "permissionMode": self.mode,
                "apiKeySource": "ANTHROPIC_API_KEY",
                "claude_code_version": VERSION,
                "uuid": str(uuid.uuid4()),
            }
        )

    def text(self, text: str) -> None:
        _emit(
            {"type": "assistant", "message": self._msg([{"type": "text", "text": text}])}
            | self.base()
        )

    def _msg(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": f"msg_{self.tools}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        }

    def tool_use(self, command: str, **extra: Any) -> str:
        self.tools += 1
        tool_id = f"toolu_fake{self.tools:08d}"
        block = {
            "type": "tool_use",
            "id": tool_id,
            "name": "Bash",
            "input": {"command": command, **extra},
        }
        _emit({"type": "assistant", "message": self._msg([block])} | self.base())
        return tool_id

    def tool_result(self, tool_id: str, output: str) -> None:
        block = {
            "tool_use_id": tool_id,
            "type": "tool_result",
            "content": output,
            "is_error": False,
        }
        line = {"type": "user", "message": {"role": "user", "content": [block]}} | self.base()
        line["tool_use_result"] = {"stdout": output, "stderr": "", "interrupted": False}
        _emit(line)

    def result(self, text: str = "All done.", *, is_error: bool = False) -> None:
        _emit(
            {
                "type": "result",
                "subtype": "success",
                "is_error": is_error,
                "result": text,
                "session_id": self.session,
                "num_turns": self.tools + 1,
                "duration_ms": 12,
                "total_cost_usd": 0.0001,
                "usage": {"input_tokens": 40, "output_tokens": 20},
                "permission_denials": [],
                "terminal_reason": "completed",
                "result_index": 0,
                "uuid": str(uuid.uuid4()),
            }
        )

    def normal_ending(self) -> None:
        tool_id = self.tool_use("echo hello")
        self.tool_result(tool_id, "hello")
        self.text("Done.")
        self.result()


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


_SLEEPER = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "if len(sys.argv) > 1:\n"
    "    open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
    "    os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "while True: time.sleep(3600)"
)


def _write_pid(pidfile: str) -> None:
    tmp = f"{pidfile}.tmp"
    with open(tmp, "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(tmp, pidfile)  # atomic: a reader never sees a half-written pid


def _leave_grandchild(pidfile: str | None, hold_stdio: bool, scrub_env: bool) -> None:
    """Double-fork into a new session, like a tool process that escapes the CLI's tree.

    With a pidfile, returns only once the grandchild is fully set up (the pidfile is written
    last), so that what the test does next never races the grandchild's start.
    """
    first = os.fork()
    if first:
        os.waitpid(first, 0)  # the middle process exits at once: the grandchild is orphaned
        deadline = time.monotonic() + 30
        while pidfile and not os.path.exists(pidfile) and time.monotonic() < deadline:
            time.sleep(0.005)
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not hold_stdio:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    if scrub_env:  # drop every variable, the run marker too: only a cgroup still finds it
        argv = [sys.executable, "-c", _SLEEPER, *([pidfile] if pidfile else [])]
        os.execve(sys.executable, argv, {})  # noqa: S606
    if pidfile:
        _write_pid(pidfile)
    _sleep_forever()


def _scenario(prompt: str) -> tuple[str, dict[str, str]]:
    first = prompt.split("\n", 1)[0].strip()
    spec = (
        first[len("fake:") :]
        if first.startswith("fake:")
        else os.environ.get("FAKE_CLAUDE_SCENARIO", "")
    )
    words = spec.split()
    if not words:
        return "normal", {}
    params = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    return words[0], params


def main(args: list[str]) -> int:
    if any(a.startswith("--dangerously") or a.startswith("--allow-dangerously") for a in args):
        sys.stderr.write("fake claude: refusing a dangerous permission flag\n")
        return 2
    ns = _argv(args)
    if ns.version:
        print(f"{VERSION} (Claude Code)")
        return 0
    prompt = read_prompt()
    name, params = _scenario(prompt)
    s = Script(ns)

    if name == "exit_before_init":
        sys.stderr.write("Error: could not start (fake exit_before_init)\n")
        return 1
    if name == "hang":
        if params.get("after") == "init":
            s.init()
        _sleep_forever()
    if name == "ignore_interrupt":
        # Reads stdin on, writes each line to [lines=PATH], answers nothing; "SIGTERM" there
        # when the daemon gives up on the interrupt.
        record = open(params["lines"], "a", buffering=1)  # noqa: SIM115

        def on_term(signum: int, frame: object) -> None:
            record.write("SIGTERM\n")
            os._exit(143)

        signal.signal(signal.SIGTERM, on_term)
        s.init()
        if "background" in params:
            tasks = [
                {"task_id": t, "task_type": "local_bash"} for t in params["background"].split(",")
            ]
            _emit({"type": "system", "subtype": "background_tasks_changed", "tasks": tasks})
        s.tool_use("sleep 1000")
        for line in sys.stdin:
            record.write(line)
        _sleep_forever()
    if name == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        s.init()
        s.tool_use("sleep 1000")
        _sleep_forever()
    if name == "stderr":
        for i in range(int(params.get("lines", "5"))):
            extra = f" ANTHROPIC_API_KEY={PLANTED_SECRET}" if i == 1 else ""
            sys.stderr.write(f"fake stderr line {i}{extra}\n")
        if "long" in params:  # one huge line, e.g. a minified stack trace
            sys.stderr.write("L" * int(params["long"]) + "\nafter the long line\n")
        sys.stderr.flush()

    s.init()
    if name == "crash":
        s.tool_use("make build")
        how = params.get("how", "abort")
        if how == "exit139":
            os._exit(139)
        os.kill(os.getpid(), signal.SIGSEGV if how == "segv" else signal.SIGABRT)
        _sleep_forever()  # pragma: no cover - the signal is fatal
    elif name == "garbage":
        _out = sys.stdout.buffer
        _out.write(b'\x00\xff\xfe garbage \x80\x81\n{"type": "assistant", "message": \n')
        _out.write(b'not json at all\n[1, 2, 3]\n"a string"\n{"type": "no_such_type"}\n')
        _out.flush()
        s.normal_ending()
    elif name == "big_line":
        size = int(params.get("bytes", str(50 * 1024 * 1024)))
        _out = sys.stdout.buffer
        chunk = b"x" * (1 << 20)
        left = size
        while left > 0:
            _out.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        _out.write(b"\n")
        _out.flush()
        s.normal_ending()
    elif name == "grandchild":
        tool_id = s.tool_use("nohup ./serve.sh &")
        _leave_grandchild(
            params.get("pidfile"), params.get("hold_stdio") == "1", params.get("scrub_env") == "1"
        )
        s.tool_result(tool_id, "started")
        if params.get("then", "hang") == "hang":
            _sleep_forever()
        s.text("Left a server running.")
        s.result()
    elif name == "tools":
        n, rate = int(params.get("n", "1000")), float(params.get("rate", "0"))
        batch = int(params.get("batch", "50"))
        gate = open(params["gate"], "rb", buffering=0) if "gate" in params else None  # noqa: SIM115
        start = time.monotonic()
        for i in range(n):
            if gate is not None and i % batch == 0 and not gate.read(1):
                return 1  # the test closed the gate: it is gone
            if rate > 0:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if i % 2 == 0:
                last = s.tool_use(f"echo {i}", sent_at=time.time())
            else:
                s.tool_result(last, str(i))
        s.result()
    else:
        s.normal_ending()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
