"""DESIGN.md's "Stream facts", checked on the raw stream-json of the pinned real CLI.

Each test scripts the model with the stub, runs the CLI once as a run of the daemon does (its
flags, the prompt over the control channel; about a second) and asserts on what it printed.
When a fact changes in a new CLI version, these fail first and name it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PINNED_CLAUDE_VERSION
from tests.golden.conftest import CliSandbox
from tests.stub.anthropic import Stub, Text, Thinking, ToolUse, Turn, error, text, tool, tools
from tests.stub.claude import API_KEY, ClaudeRun

pytestmark = pytest.mark.e2e

SUB = "[[facts-subagent]]"


def tool_results(run: ClaudeRun) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """tool_use_id -> (user line, tool_result block)."""
    return {block["tool_use_id"]: (line, block) for line, block in run.blocks("tool_result")}


def session_files(home: Path, session_id: str | None) -> list[Path]:
    """The CLI's conversation files for ``session_id`` under ``home``."""
    return list((home / ".claude").rglob(f"{session_id}.jsonl"))


def result_text(block: dict[str, Any]) -> str:
    content = block["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


async def test_init_line_and_one_assistant_line_per_block(cli: CliSandbox) -> None:
    run = await cli.script(
        [
            tools(
                ToolUse("Read", {"file_path": cli.path("hello.py")}),
                ToolUse("Bash", {"command": "ls", "description": "List files"}),
                say="Looking around.",
            ),
            text("Seen."),
        ]
    )
    assert run.exit_code == 0
    (init,) = run.of_type("system", "init")
    assert init["session_id"] == run.session_id
    assert init["cwd"] == str(cli.workspace)
    assert init["permissionMode"] == "acceptEdits"
    assert init["claude_code_version"] == PINNED_CLAUDE_VERSION
    assert {"Bash", "Edit", "Read", "Write", "Task"} <= set(init["tools"])
    assistant = run.of_type("assistant")
    # one line per content block: the first turn's three blocks share one message id
    assert [len(line["message"]["content"]) for line in assistant] == [1, 1, 1, 1]
    ids = [line["message"]["id"] for line in assistant]
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert [b["type"] for line in assistant for b in line["message"]["content"]] == [
        "text",
        "tool_use",
        "tool_use",
        "text",
    ]
    # assistant and user lines carry parent_tool_use_id (system lines do not)
    conversation = [line for line in run.lines if line["type"] in ("assistant", "user")]
    assert all(line["parent_tool_use_id"] is None for line in conversation)
    (result,) = run.results
    assert result["subtype"] == "success"
    assert result["is_error"] is False
    assert result["result"] == "Seen."
    assert result["session_id"] == run.session_id


async def test_tool_use_result_carries_structured_data(cli: CliSandbox) -> None:
    run = await cli.script(
        [
            tool("Read", file_path=cli.path("hello.py")),
            tool("Edit", file_path=cli.path("hello.py"), old_string="world", new_string="there"),
            tool("Bash", command="cat hello.py", description="Show the file"),
            text("Changed."),
        ]
    )
    assert run.exit_code == 0
    assert (cli.workspace / "hello.py").read_text() == 'print("hello there")\n'
    uses = {block["name"]: block["id"] for _, block in run.blocks("tool_use")}
    results = tool_results(run)
    read_line, _ = results[uses["Read"]]
    assert read_line["tool_use_result"]["file"]["filePath"] == cli.path("hello.py")
    edit_line, _ = results[uses["Edit"]]
    patch = edit_line["tool_use_result"]["structuredPatch"]
    assert any('+print("hello there")' in hunk["lines"] for hunk in patch)
    bash_line, bash_block = results[uses["Bash"]]
    assert bash_line["tool_use_result"]["stdout"] == 'print("hello there")'
    assert bash_block["is_error"] is False


async def test_permission_denied_shape_in_accept_edits(cli: CliSandbox) -> None:
    run = await cli.script(
        [
            tool("Bash", command="python3 -c 'print(6 * 7)'", description="Compute"),
            tool("Bash", command="echo hi", description="Say hi"),
            text("python3 was denied."),
        ]
    )
    assert run.exit_code == 0
    python_id, echo_id = [block["id"] for _, block in run.blocks("tool_use")]
    (denied,) = run.of_type("system", "permission_denied")
    assert denied["tool_name"] == "Bash"
    assert denied["tool_use_id"] == python_id
    assert denied["message"]
    results = tool_results(run)
    assert results[python_id][1]["is_error"] is True
    assert results[echo_id][1]["is_error"] is False
    assert result_text(results[echo_id][1]) == "hi"
    (denial,) = run.result["permission_denials"]
    assert denial["tool_name"] == "Bash"
    assert denial["tool_use_id"] == python_id
    assert denial["tool_input"]["command"].startswith("python3")


async def test_manual_mode_denies_write(cli: CliSandbox) -> None:
    stub = Stub([tool("Write", file_path=cli.path("new.txt"), content="x\n"), text("Denied.")])
    run = await cli.run(stub, mode="manual")
    assert run.of_type("system", "init")[0]["permissionMode"] == "default"
    (denied,) = run.of_type("system", "permission_denied")
    assert denied["tool_name"] == "Write"
    assert not (cli.workspace / "new.txt").exists()
    assert [d["tool_name"] for d in run.result["permission_denials"]] == ["Write"]


async def test_operator_allow_rule_lets_a_command_family_run(cli: CliSandbox) -> None:
    stub = Stub([tool("Bash", command="python3 -c 'print(6 * 7)'", description="Compute")])
    run = await cli.run(stub, extra=["--allowed-tools", "Bash(python3:*)"])
    assert not run.of_type("system", "permission_denied")
    ((_, block),) = run.blocks("tool_result")
    assert result_text(block) == "42"


async def test_subagent_lines_carry_parent_tool_use_id(cli: CliSandbox) -> None:
    stub = Stub(
        [
            tool(
                "Agent",
                description="Read hello.py",
                prompt=f"{SUB} What does hello.py print?",
                subagent_type="general-purpose",
                run_in_background=False,
            ),
            text("It prints hello world."),
        ]
    )
    stub.subagent(SUB, [tool("Read", file_path=cli.path("hello.py")), text("hello world")])
    run = await cli.run(stub)
    assert run.exit_code == 0
    agent_id = run.blocks("tool_use")[0][1]["id"]
    assert run.blocks("tool_use")[0][1]["name"] == "Agent"
    sub_lines = [line for line in run.lines if line.get("parent_tool_use_id")]
    assert sub_lines
    assert {line["parent_tool_use_id"] for line in sub_lines} == {agent_id}
    sub_read = [
        b for line, b in run.blocks("tool_use") if line.get("parent_tool_use_id") == agent_id
    ]
    assert [b["name"] for b in sub_read] == ["Read"]
    assert all(line.get("agent_id") for line in sub_lines)
    (started,) = run.of_type("system", "task_started")
    assert started["task_type"] == "local_agent"
    assert started["tool_use_id"] == agent_id
    assert run.of_type("system", "task_progress")
    (notification,) = run.of_type("system", "task_notification")
    assert notification["tool_use_id"] == agent_id
    assert notification["status"] == "completed"
    # the foreground Agent's tool_result comes after the subagent finished
    agent_result_at = run.lines.index(tool_results(run)[agent_id][0])
    assert agent_result_at > run.lines.index(notification)
    assert len(stub.requests_of(SUB)) == 2


async def test_background_subagent_gives_two_results_and_a_second_init(cli: CliSandbox) -> None:
    stub = Stub(
        [
            tool(
                "Agent", description="Read", prompt=f"{SUB} Read hello.py.", subagent_type="Explore"
            ),
            text("Started a subagent."),
            text("The subagent is done."),
        ]
    )
    stub.subagent(SUB, [tool("Read", file_path=cli.path("hello.py")), text("hello world")])
    run = await cli.run(stub)
    assert run.exit_code == 0
    agent_id = run.blocks("tool_use")[0][1]["id"]
    launched_line, launched = tool_results(run)[agent_id]
    assert result_text(launched).startswith("Async agent launched")
    (started,) = run.of_type("system", "task_started")
    assert started["is_backgrounded"] is True
    (notification,) = run.of_type("system", "task_notification")
    assert notification["tool_use_id"] == agent_id
    assert notification["status"] == "completed"
    # the subagent works after its Task's "launched" tool_result
    sub_lines = [line for line in run.lines if line.get("parent_tool_use_id") == agent_id]
    assert sub_lines
    assert min(run.lines.index(line) for line in sub_lines) > run.lines.index(launched_line)
    results = run.results
    assert [r["result_index"] for r in results] == [0, 1]
    assert results[-1]["result"] == "The subagent is done."
    inits = run.of_type("system", "init")
    assert len(inits) == 2
    assert inits[0]["session_id"] == inits[1]["session_id"] == run.session_id


async def test_background_bash_is_a_local_bash_task(cli: CliSandbox) -> None:
    command = "python3 -c 'import time; time.sleep(0.3); print(1)'"
    stub = Stub(
        [
            tool("Bash", command=command, description="Nap", run_in_background=True),
            text("Started."),
            text("Finished."),
        ]
    )
    run = await cli.run(stub, extra=["--allowed-tools", "Bash(python3:*)"])
    assert run.exit_code == 0
    bash_id = run.blocks("tool_use")[0][1]["id"]
    (started,) = run.of_type("system", "task_started")
    assert started["task_type"] == "local_bash"
    assert started["tool_use_id"] == bash_id
    (notification,) = run.of_type("system", "task_notification")
    assert notification["tool_use_id"] == bash_id
    assert notification["status"] == "completed"
    # the Bash card's own tool_result came first, at once
    bash_result_line = tool_results(run)[bash_id][0]
    assert run.lines.index(bash_result_line) < run.lines.index(notification)
    assert [r["result_index"] for r in run.results] == [0, 1]


async def test_bash_runs_commands_in_their_own_session(cli: CliSandbox) -> None:
    probe = "python3 -c 'import os; print(os.getsid(0), os.getpgid(0))'"
    stub = Stub([tool("Bash", command=probe, description="Show session"), text("ok")])
    run = await cli.run(stub, extra=["--allowed-tools", "Bash(python3:*)"])
    ((_, block),) = run.blocks("tool_result")
    sid, pgid = (int(v) for v in result_text(block).split())
    # The CLI was started in a new session (its sid and pgid are its pid, the group a
    # supervisor signals); the Bash command sits in yet another session and group of its own.
    assert sid not in (run.pid, os.getsid(0))
    assert pgid != run.pid


async def test_api_error_is_success_subtype_with_is_error(cli: CliSandbox) -> None:
    run = await cli.script([error(400, "stub: invalid request", times=50)])
    assert run.exit_code == 1
    result = run.result
    assert result["subtype"] == "success"
    assert result["is_error"] is True
    assert result["api_error_status"] == 400
    assert result["terminal_reason"] == "api_error"


async def test_api_retry_line_then_success(cli: CliSandbox) -> None:
    run = await cli.script([error(500, "internal"), text("Recovered.")])
    assert run.exit_code == 0
    (retry,) = run.of_type("system", "api_retry")
    assert retry["error_status"] == 500
    assert retry["attempt"] == 1
    assert run.result["result"] == "Recovered."


async def test_resume_unknown_id_fails_during_execution(cli: CliSandbox) -> None:
    unknown = str(uuid.uuid4())
    run = await cli.run(Stub(), resume=unknown)
    assert run.exit_code == 1
    (result,) = run.lines
    assert result["type"] == "result"
    assert result["subtype"] == "error_during_execution"
    assert result["is_error"] is True
    assert "No conversation found" in run.stderr


async def test_resume_continues_the_session(cli: CliSandbox) -> None:
    stub = Stub([text("First answer."), text("Second answer.")])
    first = await cli.run(stub, "Remember the word pelican.")
    assert first.exit_code == 0
    second = await cli.run(stub, "What was the word?", resume=first.session_id)
    assert second.exit_code == 0
    assert second.session_id == first.session_id
    assert second.result["session_id"] == first.session_id
    history = stub.requests_of("main")[-1].history_text()
    assert "Remember the word pelican." in history
    assert "First answer." in history


async def test_partial_messages_add_stream_events(cli: CliSandbox) -> None:
    stub = Stub([Turn([Thinking("Hmm."), ToolUse("Read", {"file_path": cli.path("hello.py")})])])
    run = await cli.run(stub)  # partial messages: a fixed flag of every run
    events = Counter(line["event"]["type"] for line in run.of_type("stream_event"))
    assert events["message_start"] == events["message_stop"] == 2
    assert events["content_block_start"] == events["content_block_stop"] == 3
    deltas = {
        line["event"]["delta"]["type"]
        for line in run.of_type("stream_event")
        if line["event"]["type"] == "content_block_delta"
    }
    assert {"thinking_delta", "input_json_delta", "text_delta"} <= deltas
    assert run.of_type("assistant")


async def test_partial_messages_start_each_block_then_its_deltas_then_its_full_line(
    cli: CliSandbox,
) -> None:
    # What the translator builds on: a card opens at content_block_start, text grows with the
    # text deltas, and the block's full assistant line (one block per line) comes after its
    # deltas and before content_block_stop, blocks of one message in order.
    long_text = "A text long enough to be streamed in more than one delta, " * 3
    stub = Stub(
        [
            Turn(
                [
                    Text(long_text),
                    ToolUse("Write", {"file_path": cli.path("a.py"), "content": "x = 1\n" * 40}),
                ]
            ),
            text("Done."),
        ]
    )
    run = await cli.run(stub)  # partial messages: a fixed flag of every run
    assert run.exit_code == 0
    seen: list[tuple[str, int | None]] = []
    index = None
    for line in run.lines:
        if line["type"] == "stream_event":
            event = line["event"]
            if event["type"] in (
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
            ):
                index = event["index"]
                seen.append((event["type"], index))
            assert line["parent_tool_use_id"] is None
        elif line["type"] == "assistant":
            (block,) = line["message"]["content"]
            seen.append(("assistant:" + block["type"], index))
    starts = [i for i, (kind, _) in enumerate(seen) if kind == "content_block_start"]
    blocks = [seen[a:b] for a, b in zip(starts, [*starts[1:], len(seen)], strict=True)]
    kinds = [[kind for kind, _ in block] for block in blocks]
    for block in kinds:
        assert block[0] == "content_block_start"
        assert block[-2].startswith("assistant:")
        assert block[-1] == "content_block_stop"
        assert set(block[1:-2]) == {"content_block_delta"}
    assert [block[-2] for block in kinds] == [
        "assistant:text",
        "assistant:tool_use",
        "assistant:text",
    ]
    assert len(kinds[0]) > 4  # the text came in several deltas


async def test_env_dump_shows_credentials(cli: CliSandbox) -> None:
    run = await cli.run(
        Stub([tool("Bash", command="env", description="Show env"), text("ok")]),
        extra=["--allowed-tools", "Bash(env:*)"],
    )
    ((line, block),) = run.blocks("tool_result")
    shown = result_text(block)
    assert f"ANTHROPIC_API_KEY={API_KEY}" in shown
    assert "CLAUDE_CODE_MESSAGING_TOKEN=" in shown
    assert API_KEY in line["tool_use_result"]["stdout"]


async def test_env_is_denied_in_accept_edits_without_a_rule(cli: CliSandbox) -> None:
    run = await cli.script([tool("Bash", command="env", description="Show env"), text("ok")])
    (denied,) = run.of_type("system", "permission_denied")
    assert denied["tool_name"] == "Bash"
    assert API_KEY not in run.stdout.decode()


async def test_large_outputs_whole_then_persisted(cli: CliSandbox) -> None:
    run = await cli.script(
        [
            tool("Bash", command="seq -w 1 4800", description="24 KB"),
            tool("Bash", command="seq -w 100000 199999", description="684 KB"),
            text("Counted."),
        ]
    )
    small, large = (block for _, block in run.blocks("tool_result"))
    assert len(result_text(small)) == 4800 * 5 - 1
    assert result_text(large).startswith("<persisted-output>")
    assert len(result_text(large)) < 30_000
    assert max(len(raw) for raw in run.stdout.splitlines()) < 100_000


async def test_safe_mode_ignores_claude_md_and_state_goes_to_home(cli: CliSandbox) -> None:
    (cli.workspace / "CLAUDE.md").write_text("Always answer in pirate speak. MARKER-7731\n")
    stub = Stub([text("Hello.")])
    run = await cli.run(stub)
    assert run.exit_code == 0
    assert all("MARKER-7731" not in json.dumps(r.body) for r in stub.requests)
    assert (cli.home / ".claude").is_dir()
    assert session_files(cli.home, run.session_id)


async def test_bare_sleep_is_refused_by_the_cli_itself(cli: CliSandbox) -> None:
    run = await cli.script([tool("Bash", command="sleep 120", description="Wait"), text("ok")])
    assert run.exit_code == 0
    assert not run.of_type("system", "permission_denied")  # not a permission decision
    ((line, block),) = run.blocks("tool_result")
    assert block["is_error"] is True
    assert "<tool_use_error>Blocked: standalone sleep" in result_text(block)
    assert isinstance(line["tool_use_result"], str)  # not the usual structured object
