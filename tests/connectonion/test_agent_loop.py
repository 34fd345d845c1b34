"""A ConnectOnion agent delegates through ``claude_code``: live cards in its IO, the review
evidence in the model's next request, Stop per invocation and global, a Work Room follow-up."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from typing import Any

import pytest

from tests.connectonion.conftest import Loop, call, say, tool_messages
from tests.e2e.conftest import frames_until, is_run_result
from tests.stub.anthropic import Turn, text, tool

pytestmark = pytest.mark.e2e

INVOCATION = "claude_code:call_1"


def envelope_of(request: dict[str, Any]) -> dict[str, Any]:
    """The claude_code envelope the model was given (the last tool message of its request)."""
    result: dict[str, Any] = json.loads(tool_messages(request)[-1]["content"])
    return result


def is_card(event: dict[str, Any], kind: str, name: str) -> bool:
    return event.get("type") == kind and event.get("name") == f"Claude Code › {name}"


def result_of(name: str) -> Callable[[dict[str, Any]], bool]:
    """Whether an event is the tool_result of a card whose tool_call named ``name`` (events are
    seen in order: the call first; a result names no tool)."""
    ids: set[str] = set()

    def seen(event: dict[str, Any]) -> bool:
        if is_card(event, "tool_call", name):
            ids.add(event["tool_id"])
        return event.get("type") == "tool_result" and event.get("tool_id") in ids

    return seen


def is_invocation(status: str) -> Any:
    return lambda event: (
        event.get("type") == "provider_invocation"
        and event.get("invocationId") == INVOCATION
        and event.get("status") == status
    )


def is_tool_result_of_claude_code(event: dict[str, Any]) -> bool:
    return event.get("type") == "tool_result" and event.get("name") == "claude_code"


async def test_cards_reach_the_agents_io_live_and_the_model_reviews_the_diff_from_the_result(
    loop: Loop,
) -> None:
    workspace = loop.e2e.workspace
    # The agent keeps its audit record (ConnectOnion's approvals.jsonl) here.
    record = loop.e2e.home / "record"
    record.mkdir()
    loop.agent.record_dir = record
    hold = asyncio.Event()
    loop.e2e.stub.main.turns = [
        tool("Read", file_path=str(workspace / "hello.py")),
        tool(
            "Edit",
            file_path=str(workspace / "hello.py"),
            old_string="world",
            new_string="there",
        ),
        tool("Bash", command="python3 hello.py", description="Run it"),
        Turn(text("Edited and ran hello.py.").blocks, hold=hold),
    ]
    loop.model.replies = [
        call("claude_code", prompt="Make hello.py say hello there, then run it.", cwd=""),
        lambda request: say("Done: " + envelope_of(request)["status"]),
    ]
    asking = asyncio.ensure_future(loop.ask("Make hello.py greet 'there'."))

    # While Claude Code still works (its last answer is held), the agent's IO has the cards.
    ran = await loop.until(result_of("Bash"))
    assert ran["status"] == "completed"
    assert ran["invocationId"] == INVOCATION
    assert not any(is_tool_result_of_claude_code(e) for e in loop.events())
    assert not asking.done()
    # A card opens at its block's start and a second tool_call fills its args: one per card.
    cards = {
        e.get("tool_id") or e.get("id"): e["name"]
        for e in loop.events()
        if e.get("type") == "tool_call"
    }
    names = list(cards.values())
    assert names[:4] == [
        "claude_code",
        "Claude Code › Read",
        "Claude Code › Edit",
        "Claude Code › Bash",
    ]
    await loop.until(is_invocation("running"))
    hold.set()

    answer = await asking
    assert answer == "Done: completed"
    events = loop.events()
    assert not any(e.get("type") in ("run_result", "diagnostic") for e in events)
    # The Work Room's conversation opens with the prompt, as ConnectOnion's own tool does it.
    (asked,) = {
        e["text"] for e in events if e.get("type") == "provider_message" and e["role"] == "user"
    }
    assert asked == "Make hello.py say hello there, then run it."
    # The model got the envelope, review evidence included: no other tool call was needed.
    envelope = envelope_of(loop.model.requests[-1])
    assert envelope["provider"] == "claude_code"
    assert envelope["status"] == "completed"
    assert envelope["result"] == "Edited and ran hello.py."
    assert envelope["error"] == ""
    assert envelope["files_changed"] == ["hello.py"]
    assert '-print("hello world")' in envelope["changes"]
    assert '+print("hello there")' in envelope["changes"]
    assert envelope["commands"] == [
        {"command": "python3 hello.py", "outcome": "completed", "error": None}
    ]
    assert envelope["session_id"]
    assert (workspace / "hello.py").read_text() == 'print("hello there")\n'
    # The schema ConnectOnion built is its own tool's: no mode for the model to pick.
    (schema,) = loop.model.requests[0]["tools"]
    params = set(schema["function"]["parameters"]["properties"])
    assert {"prompt", "session_id", "cwd", "model", "timeout"} <= params
    assert "mode" not in params
    # The agent's audit record holds its own one tool call, not Claude Code's inner ones.
    audited = [json.loads(line) for line in (record / "approvals.jsonl").read_text().splitlines()]
    assert [(entry["tool"], entry["decision"]) for entry in audited] == [("claude_code", "done")]
    # The agent's trace holds the Work Room's invocation, ended, with the session to resume.
    trace = loop.agent.current_session["trace"]
    ended = [e for e in trace if is_invocation("completed")(e)]
    assert ended
    assert ended[-1]["sessionId"] == envelope["session_id"]


async def test_a_stop_aimed_at_the_invocation_cancels_the_run_and_the_model_gets_the_session(
    loop: Loop,
) -> None:
    loop.e2e.stub.main.turns = [Turn(text("never sent").blocks, hold=asyncio.Event())]
    loop.model.replies = [
        call("claude_code", prompt="Think about it for a long time.", cwd=""),
        lambda request: say("Stopped; resume " + envelope_of(request)["session_id"]),
    ]
    asking = asyncio.ensure_future(loop.ask("Think."))
    await loop.until(is_invocation("running"))
    # The CLI has asked the model, which holds its answer: the run is live.
    await asyncio.wait_for(loop.e2e.stub.wait_for_requests(1), 30)
    accepted = loop.io.request_provider_interrupt(INVOCATION)
    assert accepted.accepted, accepted.reason

    answer = await asking
    envelope = envelope_of(loop.model.requests[-1])
    assert envelope["status"] == "cancelled"
    assert envelope["session_id"]
    assert answer == f"Stopped; resume {envelope['session_id']}"
    await loop.until(is_invocation("cancelled"))


async def test_a_global_stop_cancels_the_run_though_connectonion_drops_the_result(
    loop: Loop,
) -> None:
    loop.e2e.stub.main.turns = [Turn(text("never sent").blocks, hold=asyncio.Event())]
    loop.model.replies = [call("claude_code", prompt="Think about it for a long time.", cwd="")]
    asking = asyncio.ensure_future(loop.ask("Think."))
    running = await loop.until(is_invocation("running"))
    await asyncio.wait_for(loop.e2e.stub.wait_for_requests(1), 30)
    assert loop.io.request_interrupt()

    answer = await asking
    # ConnectOnion abandons the tool on a global Stop (run_interruptible): the model is told
    # "Interrupted by user" and the turn ends; the tool's own envelope is never committed.
    assert answer == "What would you like me to do?"
    assert (
        tool_messages({"messages": loop.agent.current_session["messages"]})[-1]["content"]
        == "Interrupted by user"
    )
    # The tool still cancelled the run, and the Work Room's cancelled state (sent by
    # ConnectOnion's lease from the last live invocation frame) keeps the session id.
    async with loop.e2e.ws(running["run_id"]) as ws:
        frames = await frames_until(ws, is_run_result)
    result = frames[-1]["result"]
    assert result["status"] == "cancelled"
    cancelled = await loop.until(is_invocation("cancelled"))
    assert cancelled["sessionId"] == result["session_id"]


async def test_a_work_room_follow_up_resumes_the_session_under_the_same_invocation(
    loop: Loop,
) -> None:
    from connectonion.network.host.provider_workroom import _direct_session, _provider_source

    loop.e2e.stub.main.turns = [text("First answer."), text("Second answer.")]
    loop.model.replies = [
        call("claude_code", prompt="Remember the word walnut.", cwd=""),
        say("Asked."),
    ]
    await loop.ask("Start.")
    first = envelope_of(loop.model.requests[-1])
    assert first["status"] == "completed"

    # What ConnectOnion's Host does with a follow-up typed into the Work Room
    # (network/host/provider_workroom.py): find the session in the trace, then run the tool.
    source = _provider_source(loop.agent.current_session, INVOCATION)
    assert source["sessionId"] == first["session_id"]
    loop.agent.current_session = _direct_session(
        "agent-session",
        loop.agent.current_session,
        source.get("workroomId") or INVOCATION,
        INVOCATION,
        "What was the word?",
        "request-1",
        source["stateRevision"],
        "claude_code",
    )
    done = await asyncio.to_thread(
        loop.agent.execute_tool,
        "claude_code",
        {"prompt": "What was the word?", "cwd": "", "session_id": source["sessionId"]},
    )
    second = json.loads(done["result"])
    assert second["status"] == "completed"
    assert second["resumed"] is True
    assert second["session_id"] == first["session_id"]
    assert second["result"] == "Second answer."
    assert "Remember the word walnut." in loop.e2e.stub.requests_of("main")[-1].history_text()
    # Its frames continue the same Work Room, and the Host hears the turn started.
    followed = [e for e in loop.events() if e.get("run_id") == second["run_id"]]
    assert followed
    assert {e.get("invocationId") for e in followed} == {INVOCATION}
    typed = [e for e in loop.events() if e.get("messageId") == "user:request-1"]
    assert typed
    assert {(e["invocationId"], e["role"], e["text"]) for e in typed} == {
        (INVOCATION, "user", "What was the word?")
    }
    ack = await loop.until(lambda e: e.get("type") == "PROVIDER_INPUT_ACK")
    assert (ack["requestId"], ack["accepted"]) == ("request-1", True)
    assert loop.agent.current_session.get("_provider_direct_acknowledged") is True


async def test_secrets_a_run_plants_reach_neither_the_io_nor_the_model(loop: Loop) -> None:
    key = "sk-ant-api03-" + secrets.token_hex(24)
    bearer = secrets.token_hex(20)
    workspace = loop.e2e.workspace
    loop.e2e.stub.main.turns = [
        tool(
            "Edit",
            file_path=str(workspace / "hello.py"),
            old_string='print("hello world")',
            new_string=f'KEY = "{key}"\nprint("hello world")',
        ),
        tool("Bash", command=f"python3 -c 'print(1)' # Authorization: Bearer {bearer}"),
        text("Done."),
    ]
    loop.model.replies = [
        call("claude_code", prompt="Add the key to hello.py.", cwd=""),
        say("Reviewed."),
    ]
    assert await loop.ask("Add the key.") == "Reviewed."
    envelope = envelope_of(loop.model.requests[-1])
    assert "[redacted]" in envelope["changes"]
    assert [c["outcome"] for c in envelope["commands"]] == ["completed"]
    assert key in (workspace / "hello.py").read_text()  # the edit itself happened
    seen = json.dumps([loop.events(), loop.model.requests, loop.agent.current_session["trace"]])
    assert key not in seen
    assert bearer not in seen


async def test_a_local_agent_without_an_io_shows_each_card_on_its_terminal(
    loop: Loop, capsys: pytest.CaptureFixture[str]
) -> None:
    from connectonion import Agent

    from codelegate.daemon.clients.tool import ClaudeCode

    local = Agent(
        "local",
        tools=[ClaudeCode(mode="accept_edits")],
        model="scripted-model",
        base_url=loop.model.url,
        api_key="dummy",
        log=False,
        co_dir=loop.e2e.home / ".co",
    )
    assert local.io is None
    loop.e2e.stub.main.turns = [
        tool("Read", file_path=str(loop.e2e.workspace / "hello.py")),
        text("It prints hello world."),
    ]
    loop.model.replies = [
        call("claude_code", prompt="What does hello.py print?", cwd=""),
        say("It prints hello world."),
    ]
    assert await asyncio.to_thread(local.input, "Explain hello.py.") == "It prints hello world."
    out = capsys.readouterr().err  # ConnectOnion's console writes to stderr
    assert "⎿ Claude Code › Read" in out
    assert "✓ Claude Code › Read" in out
    assert "Claude Code: It prints hello world." in out
