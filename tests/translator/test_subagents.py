"""Subagents, background tasks and progress (DESIGN "Stream facts", card invariant 4)."""

from __future__ import annotations

from typing import Any

from codelegate.translator import Limits
from tests.translator.helpers import (
    CWD,
    as_data,
    assistant,
    context,
    init_line,
    line,
    of_type,
    result_line,
    run,
    system,
    tool_result,
    tool_use,
)


def task_started(task_id: str, tool_use_id: str, task_type: str) -> bytes:
    """The CLI's line when a task (a subagent, a Bash in the background) starts for a tool call."""
    return system("task_started", task_id=task_id, tool_use_id=tool_use_id, task_type=task_type)


def task_notification(task_id: str, tool_use_id: str, status: str, **fields: Any) -> bytes:
    """The CLI's line when that task ends (``fields``: its summary, say)."""
    return system(
        "task_notification", task_id=task_id, tool_use_id=tool_use_id, status=status, **fields
    )


def test_subagent_lines_carry_parent_tool_id() -> None:
    frames = run(
        [
            assistant(tool_use("task", "Agent", description="Look around")),
            assistant(tool_use("t1", "Read", file_path=f"{CWD}/a"), parent="task"),
            assistant({"type": "text", "text": "sub says"}, parent="task"),
            tool_result("t1", parent="task"),
            tool_result("task", "report"),
        ]
    )
    calls = of_type(frames, "tool_call")
    assert calls[0]["summary"] == "Agent: Look around"
    assert calls[1]["parent_tool_id"] == "claude:task"
    assert of_type(frames, "provider_message")[0]["parent_tool_id"] == "claude:task"
    assert of_type(frames, "tool_result")[0]["parent_tool_id"] == "claude:task"
    assert of_type(frames, "tool_result")[1]["result"] == "report"


def test_subagent_lines_before_their_task_are_held_then_shown() -> None:
    early = [
        assistant(tool_use("t1", "Read"), parent="task"),
        tool_result("t1", parent="task"),
    ]
    frames = as_data(
        run([*early, assistant(tool_use("task", "Agent"))], context(parent_tool_call_id=None))
    )
    assert [(f["type"], f.get("tool_id")) for f in frames[:-1]] == [
        ("tool_call", "claude:task"),
        ("tool_call", "claude:t1"),
        ("tool_result", "claude:t1"),
        ("tool_result", "claude:task"),
    ]


def test_a_result_whose_synthetic_card_is_closed_by_held_lines_closes_it_once() -> None:
    # A result line claiming to be inside its own (unknown) subagent is held under that id;
    # the plain result for the same id then opens a synthetic card, which replays the held
    # line, which closes it: the plain result must not close it a second time.
    frames = as_data(
        run([tool_result("x", "held", parent="x"), tool_result("x", "late")], context())
    )
    assert [(f["type"], f.get("tool_id")) for f in frames if "tool" in f["type"]] == [
        ("tool_call", "claude:x"),
        ("tool_result", "claude:x"),
    ]
    assert of_type(frames, "tool_result")[0]["result"] == "held"


def test_held_lines_are_bounded_and_never_dropped() -> None:
    early = [assistant(tool_use(f"t{i}", "Read"), parent="task") for i in range(4)]
    frames = run(early, context(parent_tool_call_id=None), limits=Limits(held_lines=2))
    calls = of_type(frames, "tool_call")
    assert [c["tool_id"] for c in calls] == ["claude:t2", "claude:t3", "claude:t0", "claude:t1"]
    assert all(c["parent_tool_id"] == "claude:task" for c in calls)
    user = tool_result("t9", parent="other")
    frames = run([user, *early], context(parent_tool_call_id=None), limits=Limits(held_lines=1))
    assert len(of_type(frames, "tool_result")) == 5


def test_background_subagent_stays_open_until_its_notification() -> None:
    launched = {"status": "async_launched", "agentId": "a1"}
    frames = run(
        [
            assistant(tool_use("task", "Agent", description="bg")),
            task_started("a1", "task", "local_agent"),
            tool_result("task", "Async agent launched", extra=launched),
            system(
                "task_progress",
                task_id="a1",
                description="Reading",
                usage={"total_tokens": 9, "tool_uses": 1, "duration_ms": 50},
                last_tool_name="Read",
            ),
            system("task_progress", task_id="a1"),
            result_line("first"),
            system("task_updated", task_id="a1", patch={"status": "completed"}),
            system("task_updated", task_id="a1", patch={"end_time": 5}),
            task_notification("a1", "task", "completed", summary="all good"),
            task_notification("a1", "task", "completed"),
            init_line(),
            result_line("second"),
        ]
    )
    progress = of_type(frames, "tool_progress")
    assert [p.get("summary") for p in progress] == ["Running in the background", "Reading", None]
    assert (progress[1]["tool_uses"], progress[1]["total_tokens"], progress[1]["elapsed_ms"]) == (
        1,
        9,
        50,
    )
    results = of_type(frames, "tool_result")
    assert [(r["tool_id"], r["status"], r["result"]) for r in results] == [
        ("claude:task", "completed", "all good")
    ]
    assert as_data(frames)[-1]["result"]["result"] == "second"


def test_background_subagent_failures_and_a_missing_notification() -> None:
    def scenario(*tail: bytes) -> dict[str, Any]:
        frames = run(
            [
                assistant(tool_use("task", "Task")),
                tool_result("task", "launched", extra={"status": "async_launched"}),
                *tail,
            ]
        )
        return of_type(frames, "tool_result")[0]

    failed = scenario(system("task_notification", tool_use_id="task", status="failed"))
    assert (failed["status"], failed["error_type"], failed["error"]) == (
        "failed",
        "tool_error",
        "subagent failed",
    )
    stopped = scenario(system("task_notification", tool_use_id="task", status="stopped"))
    assert stopped["error_type"] == "cancelled"
    ended = scenario(
        system("task_started", task_id="k", tool_use_id="task"),
        system("task_updated", task_id="k", patch={"status": "completed"}),
    )
    assert ended["status"] == "completed"
    unknown = scenario(system("task_notification", tool_use_id="task", status="weird"))
    assert (unknown["status"], unknown["error_type"]) == ("failed", "interrupted")


def test_bash_tasks_and_foreground_subagents_close_on_their_tool_result_only() -> None:
    frames = run(
        [
            assistant(tool_use("b", "Bash", command="sleep 3")),
            task_started("k", "b", "local_bash"),
            task_notification("k", "b", "completed"),
            system("task_updated", task_id="k", patch={"status": "completed"}),
            tool_result("b", "done"),
            task_notification("k", "b", "completed"),
            assistant(tool_use("a", "Agent")),
            tool_result("a", "report", extra={"status": "completed"}),
        ]
    )
    results = of_type(frames, "tool_result")
    assert [(r["tool_id"], r["result"]) for r in results] == [
        ("claude:b", "done"),
        ("claude:a", "report"),
    ]


def test_tool_progress_lines_and_heartbeats() -> None:
    frames = run(
        [
            assistant(tool_use("b", "Bash")),
            line(type="tool_progress", tool_use_id="b", tool_name="Bash", elapsed_time_seconds=2.5),
            line(
                type="tool_progress",
                tool_use_id="b-heartbeat-0",
                parent_tool_use_id="b",
                elapsed_time_seconds=30,
            ),
            line(
                type="tool_progress",
                tool_use_id="hook-x",
                parent_tool_use_id=None,
                elapsed_time_seconds=1,
            ),
        ]
    )
    assert [p["elapsed_ms"] for p in of_type(frames, "tool_progress")] == [2500, 30000]


def test_odd_shapes_in_system_lines_are_tolerated() -> None:
    frames = run(
        [
            assistant(tool_use("t1", "Agent")),
            tool_result("t1", "launched", extra={"status": "async_launched"}),
            system("task_progress", tool_use_id="t1", usage=[1], description=5),
            system("task_updated", tool_use_id="t1", patch="done"),
            system("task_updated", tool_use_id="t1", patch=None),
            system("task_notification", tool_use_id=7, status="completed"),
        ]
    )
    progress = of_type(frames, "tool_progress")
    assert progress[-1].get("summary") is None
    assert of_type(frames, "tool_result")[0]["error_type"] == "interrupted"
