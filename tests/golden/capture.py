"""Capture real Claude Code CLI transcripts against the stub: ``python -m tests.golden.capture``.

Each scenario runs the pinned CLI exactly as the daemon launches it (see DESIGN.md): its fixed
and channel flags, the prompt over the control channel, stdin closed when the translator says
the run is over (``run_claude(channel=True)``); with a scripted model (tests/stub), in a fresh
temp workspace and HOME. It writes the CLI's stdout to
``tests/golden/transcripts/<name>.jsonl`` with every trace of this machine replaced: the
workspace becomes /srv/workspaces/demo, HOME /home/demo, the CLI's temp folder
/tmp/claude-1000, the stub's port 8089, the
CLI's install folder /usr/lib. A transcript that still names this machine is refused.

    python -m tests.golden.capture            # every scenario
    python -m tests.golden.capture basic env  # some of them
    python -m tests.golden.capture --list
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

from tests.conftest import pinned_claude
from tests.golden.conftest import HELLO_PY, CliSandbox
from tests.stub.anthropic import (
    Stub,
    Text,
    Thinking,
    ToolUse,
    Turn,
    error,
    serve_stub,
    start_subagent,
    text,
    tool,
    tools,
)
from tests.stub.claude import ClaudeRun, Session

TRANSCRIPTS = Path(__file__).resolve().parent / "transcripts"
DEMO_WORKSPACE = "/srv/workspaces/demo"
DEMO_HOME = "/home/demo"
DEMO_PORT = "8089"
DEMO_NPM_PREFIX = "/usr/lib"
# A fixed PATH: the capturing machine's own PATH would leak into the env dump.
CAPTURE_PATH = "/usr/local/bin:/usr/bin:/bin"
SLOW_PY = (
    "python3 -u -c 'import time\nfor i in range({n}):\n    print(\"tick\", i); time.sleep(0.5)'"
)


class Sandbox(CliSandbox):
    """One scenario's temp workspace, HOME and stub; runs the CLI in them (with the machine's
    TMPDIR: the env dump shows it)."""

    def __init__(self, claude: str, root: Path, stub: Stub) -> None:
        super().__init__(claude, root / "ws", root / "home")
        self.root = root
        self.stub = stub
        self.workspace.mkdir()
        self.home.mkdir()
        (self.workspace / "hello.py").write_text(HELLO_PY)
        (self.workspace / "notes.md").write_text("# Notes\n\nTODO: say hello\n")

    async def ask(
        self,
        prompt: str,
        *,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        **session: Unpack[Session],
    ) -> ClaudeRun:
        """Run the CLI once against the scenario's stub (served by ``capture``), as a run of
        the daemon: its fixed flags, the prompt on the control channel."""
        env = {"PATH": CAPTURE_PATH, **(env or {})}
        return await self.launch(
            self.stub.url,
            prompt,
            extra_args=extra,
            env=env,
            time_limit=90.0,
            channel=True,
            **session,
        )


Body = Callable[[Sandbox], Awaitable[dict[str, ClaudeRun]]]


@dataclass(frozen=True)
class Scenario:
    name: str
    shows: str
    main: Callable[[Sandbox], list[Turn]]
    body: Body
    subagents: Callable[[Sandbox], dict[str, list[Turn]]] = lambda sb: {}


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str,
    shows: str,
    main: Callable[[Sandbox], list[Turn]],
    subagents: Callable[[Sandbox], dict[str, list[Turn]]] | None = None,
) -> Callable[[Body], Body]:
    def register(body: Body) -> Body:
        SCENARIOS[name] = Scenario(name, shows, main, body, subagents or (lambda sb: {}))
        return body

    return register


def one_run(
    prompt: str, *, mode: str = "acceptEdits", extra: Sequence[str] = (), **env: str
) -> Body:
    async def body(sb: Sandbox) -> dict[str, ClaudeRun]:
        return {"": await sb.ask(prompt, mode=mode, extra=extra, env=env)}

    return body


# --- scenarios ---------------------------------------------------------------------------------

scenario(
    "basic",
    "Read, Edit and Bash in acceptEdits, text before the first tool; one line per content block "
    "with the message id repeated; Edit's structuredPatch, Bash stdout in tool_use_result",
    lambda sb: [
        tool("Read", say="Let me look at the file.", file_path=sb.path("hello.py")),
        tool(
            "Edit",
            file_path=sb.path("hello.py"),
            old_string="hello world",
            new_string="hello there",
        ),
        tool("Bash", command="cat hello.py", description="Show the file"),
        text("I changed the greeting in hello.py to 'hello there'."),
    ],
)(one_run("Change the greeting in hello.py to 'hello there'."))

scenario(
    "parallel",
    "three tools in one assistant turn (parallel calls), results in one or more user lines",
    lambda sb: [
        tools(
            ToolUse("Read", {"file_path": sb.path("hello.py")}),
            ToolUse("Read", {"file_path": sb.path("notes.md")}),
            ToolUse("Bash", {"command": "ls", "description": "List files"}),
            say="Reading both files and listing the folder.",
        ),
        text("hello.py prints a greeting; notes.md has one TODO."),
    ],
)(one_run("What do hello.py and notes.md contain?"))

scenario(
    "write_new",
    "Write of a new file in acceptEdits (allowed), with thinking before it",
    lambda sb: [
        Turn(
            [
                Thinking("The user wants a new module; I will write it."),
                ToolUse("Write", {"file_path": sb.path("src/util.py"), "content": "X = 1\n"}),
            ]
        ),
        text("Created src/util.py."),
    ],
)(one_run("Create src/util.py with X = 1."))

scenario(
    "denied_accept_edits",
    "acceptEdits under --permission-prompts none: `touch made.txt` inside the workspace runs, "
    "`python3 -c …` and `touch ../outside.txt` are denied (system/permission_denied, an is_error "
    "tool_result, result.permission_denials), a read-only `ls` runs",
    lambda sb: [
        tool("Bash", command="touch made.txt", description="Create a file"),
        tool("Bash", command="python3 -c 'print(6 * 7)'", description="Compute"),
        tool("Bash", command="touch ../outside.txt", description="Create a file outside"),
        tool("Bash", command="ls", description="List files"),
        text("made.txt exists; python3 and writing outside the workspace were denied."),
    ],
)(one_run("Create made.txt and outside.txt, and compute 6 * 7 with python3."))

scenario(
    "denied_manual",
    "Write in manual mode is denied (permissionMode default in init), then Read works",
    lambda sb: [
        tool("Write", file_path=sb.path("new.txt"), content="hi\n"),
        tool("Read", file_path=sb.path("hello.py")),
        text("Writing new.txt was denied; hello.py prints hello world."),
    ],
)(one_run("Write new.txt, then read hello.py.", mode="manual"))

SUB = "[[subagent-a]]"
ASK_SUBAGENT = f"{SUB} Read hello.py and report what it prints."


def _subagent_reads(say: str | None = None) -> Callable[[Sandbox], dict[str, list[Turn]]]:
    """The subagent of the Agent scenarios: it reads hello.py and says what it prints."""
    return lambda sb: {
        SUB: [
            tool("Read", say=say, file_path=sb.path("hello.py")),
            text("hello.py prints 'hello world'."),
        ]
    }


scenario(
    "subagent_foreground",
    "a foreground Agent (Task) subagent doing a Read: the subagent's lines carry "
    "parent_tool_use_id = the Agent tool_use id, plus task_started/task_progress/task_notification "
    "(local_agent); the Agent tool_result comes after the subagent finished",
    lambda sb: [
        start_subagent("Read hello.py", ASK_SUBAGENT, background=False),
        text("The subagent says hello.py prints hello world."),
    ],
    _subagent_reads(),
)(one_run("Use a subagent to find out what hello.py prints."))

scenario(
    "subagent_forwarded",
    "--forward-subagent-text with partial messages, as the daemon runs: a foreground Agent whose "
    "subagent says something, reads, then answers; its text comes as assistant lines with "
    "parent_tool_use_id = the Agent tool_use id (whether its partial messages stream too shows "
    "in the stream_event lines' parent_tool_use_id)",
    lambda sb: [
        start_subagent("Read hello.py", ASK_SUBAGENT, background=False),
        text("The subagent says hello.py prints hello world."),
    ],
    _subagent_reads(say="Reading hello.py for the parent agent."),
)(one_run("Use a subagent to find out what hello.py prints."))

scenario(
    "subagent_background",
    "a background Agent subagent (the default): the Agent tool_result 'Async agent launched' comes "
    "at once, the main turn's first result line while the subagent still works (listed open by "
    "background_tasks_changed); its task_notification, then a second system/init and a second "
    "result (result_index)",
    lambda sb: [
        start_subagent("Read hello.py", ASK_SUBAGENT, background=None),
        text("I started a subagent; I will report when it finishes."),
        text("The subagent finished: hello.py prints hello world."),
    ],
    _subagent_reads(),
)(one_run("Use a background subagent to find out what hello.py prints."))

# The operator rule under which the ticker runs without asking (acceptEdits asks for python3).
RUN_PYTHON = ["--allowed-tools", "Bash(python3:*)"]


def _ticker(
    name: str,
    shows: str,
    ticks: tuple[int, str],
    prompt: str,
    replies: list[str],
    **bash: object,
) -> None:
    """A scenario whose one Bash call runs SLOW_PY: ``ticks`` is (half seconds, description)."""
    n, description = ticks
    scenario(
        name,
        shows,
        lambda sb: [
            tool("Bash", command=SLOW_PY.format(n=n), description=description, **bash),
            *map(text, replies),
        ],
    )(one_run(prompt, extra=RUN_PYTHON))


_ticker(
    "bash_background",
    "Bash with run_in_background (python3 allowed by an operator rule): task_started local_bash, "
    "the immediate 'running in background' tool_result, a first result, then task_notification, "
    "a second init and a second result",
    (3, "Tick three times"),
    "Run the ticker in the background.",
    ["The ticker runs in the background.", "The ticker finished."],
    run_in_background=True,
)
_ticker(
    "bash_slow",
    "a foreground Bash of ~3 s: task_started / task_notification with task_type local_bash and "
    "the Bash tool_use_id, before the Bash tool_result (which closes the card)",
    (6, "Tick six times"),
    "Run the ticker.",
    ["Ticked six times."],
)
_ticker(
    "bash_heartbeat",
    "a foreground Bash of ~32 s: one tool_progress heartbeat line after 30 s (tool_use_id "
    "'<Bash id>-heartbeat-0', parent_tool_use_id = the Bash tool_use id, elapsed_time_seconds)",
    (64, "Tick for 32 seconds"),
    "Run the long ticker.",
    ["Done ticking."],
)

scenario(
    "env_dump",
    "`env` allowed by an operator rule (acceptEdits denies it otherwise): the tool_result shows "
    "ANTHROPIC_API_KEY and the CLI's own CLAUDE_CODE_* variables, which the translator must redact",
    lambda sb: [
        tool("Bash", command="env", description="Show the environment"),
        text("Here is the environment."),
    ],
)(one_run("Show me the environment.", extra=["--allowed-tools", "Bash(env:*)"]))

scenario(
    "large_output",
    "a ~24 KB Bash output that arrives whole in the tool_result, then a ~600 KB one that the CLI "
    "persists to a file and previews (<persisted-output>)",
    lambda sb: [
        tool("Bash", command="seq -w 1 4800", description="Count to 4800"),
        tool("Bash", command="seq -w 100000 199999", description="Count a hundred thousand"),
        text("Counted."),
    ],
)(one_run("Count."))

scenario(
    "api_error",
    "the API answers 400 every time: a synthetic assistant message, a result with subtype success "
    "but is_error true, api_error_status, and exit code 1",
    lambda sb: [error(400, "stub: invalid request", times=50)],
)(one_run("Say hello."))

scenario(
    "api_retry",
    "the API answers 500 once, then succeeds: a system/api_retry line, then the normal answer",
    lambda sb: [error(500, "internal error"), text("Hello after a retry.")],
)(one_run("Say hello."))

scenario(
    "api_error_retries_exhausted",
    "500 on every attempt with CLAUDE_CODE_MAX_RETRIES=1: one api_retry, then is_error, exit 1",
    lambda sb: [error(500, "internal error", times=50)],
)(one_run("Say hello.", CLAUDE_CODE_MAX_RETRIES="1"))

scenario(
    "partial",
    "--include-partial-messages: stream_event lines (message_start, content_block_* with "
    "text/thinking/input_json deltas, message_delta, message_stop) around the assistant lines",
    lambda sb: [
        Turn(
            [
                Thinking("Read the file first."),
                ToolUse("Read", {"file_path": sb.path("hello.py")}),
            ]
        ),
        text("hello.py prints hello world."),
    ],
)(one_run("What does hello.py print?"))


LONG_MODULE = "".join(f"def f{n}(x):\n    return x + {n}\n\n\n" for n in range(40))

scenario(
    "partial_write",
    "--include-partial-messages as the daemon runs it: a long text streamed in many text_delta "
    "lines, then a Write of a 1.5 KB file whose input arrives in many input_json_delta lines "
    "(its card can open at content_block_start), a Bash, and a streamed final answer",
    lambda sb: [
        Turn(
            [
                Text(
                    "I will write the module in one go, then list the folder to check that "
                    "it is there, and tell you what I did."
                ),
                ToolUse("Write", {"file_path": sb.path("src/long.py"), "content": LONG_MODULE}),
            ]
        ),
        tool("Bash", command="ls src", description="List src"),
        text("Wrote src/long.py with forty small functions; ls shows it in src."),
    ],
)(one_run("Write src/long.py with forty small functions."))


async def _resume(sb: Sandbox) -> dict[str, ClaudeRun]:
    first = await sb.ask("Read hello.py.")
    assert first.session_id is not None
    second = await sb.ask("Now change it to say hello there.", resume=first.session_id)
    seen = sb.stub.requests_of("main")[-1].history_text()
    if "Read hello.py." not in seen:
        raise RuntimeError("the resumed run did not send the first run's conversation")
    return {"_1": first, "_2": second}


scenario(
    "resume",
    "two runs: the second with --resume <first session id> continues the conversation (the stub "
    "checks its history); the same session_id in both",
    lambda sb: [
        tool("Read", file_path=sb.path("hello.py")),
        text("hello.py prints hello world."),
        tool(
            "Edit",
            file_path=sb.path("hello.py"),
            old_string="hello world",
            new_string="hello there",
        ),
        text("Changed."),
    ],
)(_resume)


async def _resume_unknown(sb: Sandbox) -> dict[str, ClaudeRun]:
    return {"": await sb.ask("Continue.", resume=str(uuid.uuid4()))}


scenario(
    "resume_unknown",
    "--resume with an id the CLI does not know: one result line, subtype error_during_execution, "
    "is_error, exit code 1, no init",
    lambda sb: [],
)(_resume_unknown)


# --- sanitising --------------------------------------------------------------------------------


def _slug(path: str) -> str:
    """How the CLI names a project folder after a path."""
    return re.sub(r"[^A-Za-z0-9]", "-", path)


def sanitise(raw: str, sb: Sandbox) -> str:
    """Replace every path and id of this machine by the demo ones."""
    pairs = [
        (str(sb.workspace.resolve()), DEMO_WORKSPACE),
        (str(sb.workspace), DEMO_WORKSPACE),
        (str(sb.home.resolve()), DEMO_HOME),
        (str(sb.home), DEMO_HOME),
        # what is left of the temp root: the workspace's parent folder
        (str(sb.root.resolve()), str(Path(DEMO_WORKSPACE).parent)),
        (str(sb.root), str(Path(DEMO_WORKSPACE).parent)),
    ]
    for real, demo in pairs:
        raw = raw.replace(real, demo).replace(_slug(real), _slug(demo))
    raw = re.sub(r"/tmp/claude-\d+/", "/tmp/claude-1000/", raw)
    raw = re.sub(r"/tmp/cc-socks/\d+\.sock", "/tmp/cc-socks/4242.sock", raw)
    binary = Path(sb.claude).resolve()
    if "node_modules" in binary.parts:
        prefix = Path(*binary.parts[: binary.parts.index("node_modules")])
        raw = raw.replace(str(prefix) + "/", DEMO_NPM_PREFIX + "/")
    raw = raw.replace(str(binary), DEMO_NPM_PREFIX + "/bin/claude")
    port = sb.stub.url.rsplit(":", 1)[1]
    return raw.replace(f"127.0.0.1:{port}", f"127.0.0.1:{DEMO_PORT}")


def _demo_args(args: Sequence[str], sb: Sandbox) -> list[str]:
    return [sanitise(a, sb) for a in args]


def leaks(text_: str) -> list[str]:
    """Traces of this machine still in a transcript (allowing the demo paths)."""
    cleaned = re.sub(r"/tmp/(claude-1000|cc-socks)/", "", text_).replace(
        str(Path(DEMO_WORKSPACE).parent), ""
    )
    home = str(Path.home())
    suspects = ["/tmp", "/work", "/root"] + ([home] if len(home) > 4 else [])
    found = [s for s in suspects if s in cleaned]
    for name in {socket.gethostname(), getpass.getuser()}:
        if name and re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", cleaned):
            found.append(name)
    return found


async def capture(claude: str, spec: Scenario, out: Path) -> list[Path]:
    root = Path(tempfile.mkdtemp(prefix="codelegate-capture-"))
    stub = Stub()
    try:
        sb = Sandbox(claude, root, stub)
        stub.main.turns = spec.main(sb)
        for marker, turns in spec.subagents(sb).items():
            stub.subagent(marker, turns)
        async with serve_stub(stub):
            runs = await spec.body(sb)
        written = []
        manifest_path = out / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
        for suffix, run in runs.items():
            data = sanitise(run.stdout.decode(), sb)
            found = leaks(data)
            if found:
                raise RuntimeError(f"{spec.name}{suffix}: machine traces left: {found}")
            for line in data.splitlines():
                json.loads(line)
            path = out / f"{spec.name}{suffix}.jsonl"
            path.write_text(data)
            written.append(path)
            manifest[path.name] = {
                "exit_code": run.exit_code,
                "argv": [DEMO_NPM_PREFIX + "/bin/claude", *_demo_args(run.argv[1:], sb)],
                "shows": spec.shows,
            }
            print(f"{path.name}: {len(data.splitlines())} lines, exit {run.exit_code}")
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
        return written
    finally:
        shutil.rmtree(root, ignore_errors=True)
        # the CLI's task files for this workspace (TMPDIR is left alone: the env dump shows it)
        cli_tmp = Path(tempfile.gettempdir()) / f"claude-{os.getuid()}"
        shutil.rmtree(cli_tmp / _slug(str(root / "ws")), ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="scenarios to capture (default: all)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--out", type=Path, default=TRANSCRIPTS)
    args = parser.parse_args(argv)
    if args.list:
        for spec in SCENARIOS.values():
            print(f"{spec.name}: {spec.shows}")
        return 0
    claude = pinned_claude()
    if claude is None:
        print(
            "the pinned Claude Code CLI is not installed (make test installs it)", file=sys.stderr
        )
        return 2
    unknown = [n for n in args.names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(SCENARIOS):
        asyncio.run(capture(claude, SCENARIOS[name], args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
