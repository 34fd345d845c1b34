"""Progress O Chat can render: a running tool_call_update replaces an open card's text.

O Chat ignores ``tool_progress``; outside a Work Room a ``tool_call_update`` with a running status
and a ``result`` is the only way it shows an open card moving (inside one, typed rows ignore it,
so none is sent there). At most one a second per card; ``tool_progress`` stays for the others.
"""

from __future__ import annotations

from typing import Any

from codelegate.translator import Translator
from tests.translator.helpers import (
    EXITED,
    as_data,
    assistant,
    context,
    line,
    of_type,
    run,
    system,
    tool_result,
    tool_use,
)

PLAIN = context(parent_tool_call_id=None)


def heartbeat(use_id: str, seconds: float) -> bytes:
    return line(
        type="tool_progress",
        tool_use_id=f"{use_id}-heartbeat-0",
        parent_tool_use_id=use_id,
        elapsed_time_seconds=seconds,
    )


def timed(ctx: Any, steps: list[tuple[float, bytes]]) -> list[dict[str, Any]]:
    translator = Translator(ctx)
    frames = translator.start(1000.0)
    for now, data in steps:
        frames += translator.receive_data(data, now)
    return as_data(frames + translator.close(EXITED, 2000.0))


def test_a_long_bash_card_shows_it_is_still_running_at_most_once_a_second() -> None:
    frames = timed(
        PLAIN,
        [
            (1001.0, assistant(tool_use("b1", "Bash", command="sleep 60"))),
            (1031.0, heartbeat("b1", 30)),
            (1031.5, heartbeat("b1", 30.5)),  # within a second of the last: not sent
            (1061.0, heartbeat("b1", 60)),
            (1062.0, tool_result("b1", "done")),
        ],
    )
    updates = [f for f in frames if f["type"] == "tool_call_update"]
    assert [(u["tool_id"], u["status"], u["result"]) for u in updates] == [
        ("claude:b1", "in_progress", "Still running after 30 s"),
        ("claude:b1", "in_progress", "Still running after 60 s"),
    ]
    kinds = [f["type"] for f in frames if f.get("tool_id") == "claude:b1"]
    assert kinds.index("tool_result") > kinds.index("tool_call_update")
    assert len(of_type_data(frames, "tool_progress")) == 3  # the other clients get every one


def of_type_data(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == kind]


def test_a_subagent_is_not_a_silent_box() -> None:
    task = "a1"
    frames = timed(
        PLAIN,
        [
            (1001.0, assistant(tool_use(task, "Agent", description="Read the parser"))),
            (1002.0, assistant({"type": "text", "text": "Reading the parser."}, parent=task)),
            (
                1004.0,
                system(
                    "task_progress",
                    task_id="k1",
                    tool_use_id=task,
                    description="Reading src/parser.py",
                    last_tool_name="Read",
                    usage={"tool_uses": 2, "total_tokens": 10, "duration_ms": 3000},
                ),
            ),
            (1006.0, tool_result(task, "The parser has one TODO.")),
        ],
    )
    updates = [(u["tool_id"], u["result"]) for u in of_type_data(frames, "tool_call_update")]
    assert updates == [
        ("claude:a1", "Reading the parser."),
        ("claude:a1", "Reading src/parser.py · 2 tool uses · last: Read"),
    ]
    (said,) = of_type_data(frames, "provider_message")
    assert said["parent_tool_id"] == "claude:a1"


def test_a_background_subagent_says_so_and_progress_is_redacted() -> None:
    progress = {"type": "system", "subtype": "task_progress", "tool_use_id": "a1", "task_id": "k"}
    frames = timed(
        PLAIN,
        [
            (1001.0, assistant(tool_use("a1", "Agent", description="x"))),
            (1001.0, tool_result("a1", "launched", extra={"status": "async_launched"})),
            (1003.0, line(**progress)),  # nothing to say: nothing sent
            (1004.0, line(**progress, usage={"tool_uses": 1})),
        ],
    )
    assert [u["result"] for u in of_type_data(frames, "tool_call_update")] == [
        "Running in the background",
        "1 tool use",
    ]
    secret_frames = as_data(
        run(
            [
                assistant(tool_use("a1", "Agent", description="x")),
                assistant(
                    {"type": "text", "text": "key sk-ant-api03-abcdefghijklmnop"}, parent="a1"
                ),
            ],
            PLAIN,
        )
    )
    (update,) = of_type_data(secret_frames, "tool_call_update")
    assert update["result"] == "key [redacted]"


def test_inside_a_work_room_no_update_is_sent() -> None:
    frames = run(
        [assistant(tool_use("b1", "Bash", command="sleep 60")), heartbeat("b1", 30)], context()
    )
    assert of_type(frames, "tool_call_update") == []
    assert len(of_type(frames, "tool_progress")) == 1
