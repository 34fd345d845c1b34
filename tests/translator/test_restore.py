"""Restoring a translator from stored frames after a daemon restart."""

from __future__ import annotations

from codelegate.translator import Outcome, Translator
from codelegate.translator.frames import decode_frame, encode_frame
from tests.translator.helpers import (
    CWD,
    as_data,
    assistant,
    context,
    line,
    run,
    system,
    tool_result,
    tool_use,
)


def stored(chunks: list[bytes]) -> list:  # type: ignore[type-arg]
    translator = Translator(context(session_id="s-1"))
    frames = translator.start(1000.0)
    for chunk in chunks:
        frames += translator.receive_data(chunk, 1001.0)
    frames += translator.stderr_seen(3, 1001.0)
    # The store keeps encoded frames: restore from what it gives back.
    return [decode_frame(encode_frame(frame)) for frame in frames]


def test_restore_then_close_interrupted_closes_what_was_open() -> None:
    frames = stored(
        [
            assistant(tool_use("a", "Edit", file_path=f"{CWD}/done.py")),
            tool_result("a"),
            assistant(tool_use("b", "Write", file_path=f"{CWD}/open.py")),
            assistant({"type": "text", "text": "working"}),
            line(type="tool_progress", tool_use_id="b", elapsed_time_seconds=1),
            assistant(tool_use("c", "Bash", command="x")),
            system("permission_denied", tool_use_id="c", tool_name="Bash"),
            tool_result("c", "no", is_error=True),
            assistant(tool_use("d", "Bash", command=5)),
            tool_result("d", "ok"),
            tool_result("zz", "unknown"),
            b"{bad\n",
        ]
    )
    restored = Translator.restore(context(session_id="s-1"), frames)
    assert restored.state.seq == frames[-1].seq
    out = as_data(restored.close(Outcome(reason="interrupted"), 2000.0))
    assert [f["seq"] for f in out] == list(range(frames[-1].seq + 1, frames[-1].seq + 1 + len(out)))
    results = [f for f in out if f["type"] == "tool_result"]
    assert [(r["tool_id"], r["error_type"]) for r in results] == [("claude:b", "interrupted")]
    activity = [f for f in out if f["type"] == "provider_activity"]
    assert activity[0]["sequence"] == 2
    invocation = next(f for f in out if f["type"] == "provider_invocation")
    assert invocation["stateRevision"] == 2
    final = out[-1]["result"]
    assert final["status"] == "interrupted"
    assert final["files_changed"] == ["done.py"]
    assert final["tools"] == {"started": 5, "completed": 3, "failed": 2}
    assert final["permission_denials"] == [
        {"tool_id": "claude:c", "name": "Bash", "input": {"command": "x"}}
    ]
    assert final["session_id"] == "s-1"
    # A diagnostic already sent is not sent again with the same count.
    assert [f for f in out if f["type"] == "diagnostic"] == []


def test_a_finished_run_restores_closed() -> None:
    frames = run([assistant(tool_use("a", "Read"))])
    restored = Translator.restore(context(), frames)
    assert restored.result is not None
    assert restored.close(Outcome(reason="interrupted"), 1.0) == []
    assert restored.receive_data(b"{}\n", 1.0) == []


def test_a_restored_run_keeps_its_work_room_numbers_and_message_ids() -> None:
    frames = stored(
        [
            assistant(tool_use("a", "Read", file_path=f"{CWD}/a.py")),
            assistant({"type": "text", "text": "first"}),
            assistant(tool_use("b", "Read", file_path=f"{CWD}/b.py")),
            tool_result("b"),
        ]
    )
    restored = Translator.restore(context(session_id="s-1"), frames)
    assert restored.activity_sequence == 2
    out = restored.receive_data(
        assistant(tool_use("c", "Bash", command="x"), {"type": "text", "text": "second"}), 1002.0
    )
    out += restored.close(Outcome(reason="interrupted"), 2000.0)
    rows = {(f["activityId"], f["sequence"]) for f in as_data(out) if "activityId" in f}
    assert rows == {("claude:a", 1), ("claude:c", 3)}  # the open card keeps its place
    (message,) = (f for f in as_data(out) if f["type"] == "provider_message")
    assert message["messageId"] == "run-1:message:2"
    closed = {f["tool_id"]: f["result"] for f in as_data(out) if f["type"] == "tool_result"}
    # A card closed without a result says why in its result: O Chat shows no error field.
    assert closed["claude:a"] == "the run ended before the tool finished"
