"""Intake: any input, any chunking, bad lines, the run's start and end (sans-IO contract)."""

from __future__ import annotations

import msgspec

import codelegate.translator.wire as wire
from codelegate.translator import Limits, Outcome, Translator
from codelegate.translator.frames import ToolCall
from tests.translator.helpers import (
    assistant,
    context,
    line,
    of_type,
    result_line,
    run,
    system,
    tool_result,
    tool_use,
)


def test_a_card_opens_at_its_blocks_start_and_fills_in_place_never_twice() -> None:
    event = line(
        type="stream_event",
        event={
            "type": "content_block_start",
            "content_block": {"type": "tool_use", "id": "t1", "name": "Read"},
        },
    )
    frames = run(
        [
            event,
            assistant(tool_use("t1", "Read", file_path="/srv/workspaces/demo/a.py")),
            event,
            assistant(tool_use("t1", "Read", file_path="/srv/workspaces/demo/b.py")),
            line(type="rate_limit_event", rate_limit_info={}),
        ]
    )
    calls = of_type(frames, "tool_call")
    # Opened with what is known (its name), then its arguments, once, in the same card.
    assert [(c["tool_id"], c["args"], c["summary"]) for c in calls] == [
        ("claude:t1", {}, "Read"),
        ("claude:t1", {"file_path": "/srv/workspaces/demo/a.py"}, "Read a.py"),
    ]
    assert of_type(frames, "diagnostic") == []
    assert of_type(frames, "run_result")[0]["result"]["tools"]["started"] == 1


def test_bad_input_becomes_diagnostics_with_counts_never_content() -> None:
    bad = [
        b"{not json\n",
        b"[1, 2, 3]\n",
        b"\xff\xfe garbage\n",
        b'{"type": "brand_new", "secret": "sk-ant-api03-zzzzzzzzzz"}\n',
        system("brand_new_subtype"),
        line(type="assistant"),
        line(type="keep_alive"),
        b'{"no_type": 1}\n',
        system("status"),
    ]
    frames = run(bad * 3, limits=Limits(line_bytes=1 << 20))
    diagnostics = of_type(frames, "diagnostic")
    assert all(set(d) >= {"code", "count"} and "detail" not in d for d in diagnostics)
    totals: dict[str, int] = {}
    for d in diagnostics:
        totals[d["code"]] = d["count"]
    assert totals == {"malformed_line": 15, "unknown_type": 6}
    assert b"sk-ant" not in b"".join(str(d).encode() for d in diagnostics)
    counts = [d["count"] for d in diagnostics if d["code"] == "malformed_line"]
    assert counts == [1, 2, 4, 8, 15]


def test_oversized_lines_are_skipped_and_reported() -> None:
    big = line(type="assistant", message={"content": [{"type": "text", "text": "x" * 500}]})
    frames = run([big, assistant({"type": "text", "text": "after"})], limits=Limits(line_bytes=200))
    assert of_type(frames, "diagnostic")[0]["code"] == "oversized_line"
    assert [m["text"] for m in of_type(frames, "provider_message")] == ["after"]


def test_stderr_diagnostics_at_powers_of_two_and_the_total_at_the_end() -> None:
    translator = Translator(context(parent_tool_call_id=None))
    sent = []
    for count in [1, 1, 2, 3, 5, 9]:
        sent += [f.count for f in translator.stderr_seen(count, 1.0)]  # type: ignore[attr-defined]
    assert sent == [1, 2, 5, 9]
    last = [f for f in translator.close(Outcome(reason="exited", exit_code=0), 2.0)]
    assert all(f.__class__.__name__ != "Diagnostic" for f in last)
    assert translator.stderr_seen(20, 3.0) == []


def test_frames_not_stored_is_said_at_the_first_and_the_total_at_the_end() -> None:
    translator = Translator(context(parent_tool_call_id=None))
    first = translator.frames_not_stored(1, 1.0)
    assert [(f.code, f.count) for f in first] == [("frames_not_stored", 1)]  # type: ignore[attr-defined]
    assert translator.frames_not_stored(7, 1.5) == []
    last = translator.close(Outcome(reason="exited", exit_code=0, frames_not_stored=7), 2.0)
    totals = [f.count for f in last if f.__class__.__name__ == "Diagnostic"]  # type: ignore[attr-defined]
    assert totals == [7]
    assert translator.frames_not_stored(9, 3.0) == []
    # And in the final result; a run that lost nothing has no such field at all.
    assert translator.result is not None
    assert msgspec.json.decode(msgspec.json.encode(translator.result))["frames_not_stored"] == 7
    other = Translator(context(parent_tool_call_id=None))
    other.close(Outcome(reason="exited", exit_code=0), 2.0)
    assert b"frames_not_stored" not in msgspec.json.encode(other.result)


def test_close_is_final_and_closes_open_cards_with_the_reason() -> None:
    for reason, error_type in [
        ("cancelled", "cancelled"),
        ("timeout", "timeout"),
        ("interrupted", "interrupted"),
        ("exited", "interrupted"),
        ("spawn_failed", "interrupted"),
    ]:
        translator = Translator(context())
        translator.start(1.0)
        translator.receive_data(assistant(tool_use("t1", "Bash"))[:-1], 1.0)  # no newline yet
        frames = translator.close(Outcome(reason=reason), 2.0)  # type: ignore[arg-type]
        done = of_type(frames, "tool_result")[0]
        assert (done["status"], done["error_type"]) == ("failed", error_type)
        assert done["error"] == "the run ended before the tool finished"
        assert frames[-1].__class__.__name__ == "RunResult"
        assert translator.result is not None
        assert translator.close(Outcome(reason="exited"), 3.0) == []
        assert translator.receive_data(b"{}\n", 3.0) == []
        assert translator.start(3.0) == []


def test_start_is_sent_once_and_eof_flushes_a_last_line() -> None:
    translator = Translator(context(session_id="s-1"))
    assert len(translator.start(1.0)) == 1
    assert translator.start(1.0) == []
    assert translator.receive_data(result_line()[:-1], 1.0) == []
    flushed = translator.receive_data(b"", 1.0)
    assert flushed == []  # the result line is recorded, no frame yet
    final = translator.close(Outcome(reason="exited", exit_code=0), 2.0)
    assert final[-1].result.status == "completed"  # type: ignore[union-attr]


def test_frame_ids_are_stable_and_seq_gapless() -> None:
    frames = run([assistant(tool_use("t1", "Read")), tool_result("t1")])
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    assert frames[0].id == "run-1:1"
    assert isinstance(frames[2], ToolCall)  # after the invocation and the card's row


def test_a_lone_newline_chunk() -> None:
    translator = Translator(context(parent_tool_call_id=None))
    assert translator.receive_data(b"\n", 1.0) == []
    assert translator.receive_data(b"\n\n", 1.0) == []


def test_a_bad_line_sends_its_chunk_line_by_line_with_the_same_outcome() -> None:
    lines = [system("status"), b"{bad\n", assistant(tool_use("t1", "Read"))]
    frames = run([b"".join(lines)])
    assert [f["type"] for f in of_type(frames, "tool_call")] == ["tool_call"]
    assert of_type(frames, "diagnostic")[0]["code"] == "malformed_line"


def test_a_tool_use_without_an_id_opens_no_card() -> None:
    frames = run([assistant({"type": "tool_use", "name": "Read", "input": {}})])
    assert of_type(frames, "tool_call") == []


def test_a_block_holding_lines_of_every_quiet_type_is_decoded_in_one_call() -> None:
    # A line the union did not know failed the whole block, which was then read line by line:
    # the answer to initialize, in every run, cost its chunk the fast path.
    tags = [cls.__struct_config__.tag for cls in wire.QUIET_LINES]
    assert {"control_response", "keep_alive", "rate_limit_event"} <= set(tags)
    said = assistant({"type": "text", "text": "hi"})
    quiet = [line(type=tag, response={"subtype": "success"}) for tag in tags]
    decoded = wire.decode_lines(b"".join([*quiet, said]))
    assert [type(msg) for msg in decoded] == [*wire.QUIET_LINES, wire.Assistant]
    frames = run([*quiet, said])
    assert [m["text"] for m in of_type(frames, "provider_message")] == ["hi"]
    assert of_type(frames, "diagnostic") == []
    # The base of the quiet Structs is no type of the CLI's: a line naming it is unknown.
    frames = run([line(type=wire.Quiet.__name__), said])
    assert [(d["code"], d["count"]) for d in of_type(frames, "diagnostic")] == [("unknown_type", 1)]
