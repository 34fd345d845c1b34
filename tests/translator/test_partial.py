"""Partial messages (``--include-partial-messages``): cards at their block's start, text as it
streams, under one messageId, coalesced, never showing half a credential."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from codelegate.translator import Translator
from codelegate.translator.frames import encode_frame
from tests.translator.helpers import (
    EXITED,
    as_data,
    assistant,
    context,
    line,
    of_type,
    run,
    tool_result,
    tool_use,
)


def event(parent: str | None = None, **body: Any) -> bytes:
    return line(type="stream_event", event=body, parent_tool_use_id=parent, session_id="s-1")


def start_text(index: int = 0, parent: str | None = None) -> bytes:
    return event(parent, type="content_block_start", index=index, content_block={"type": "text"})


def delta(text: str, index: int = 0, parent: str | None = None) -> bytes:
    body = {"type": "text_delta", "text": text}
    return event(parent, type="content_block_delta", index=index, delta=body)


def text_line(text: str, parent: str | None = None) -> bytes:
    return assistant({"type": "text", "text": text}, parent=parent)


def feed(timed: list[tuple[float, bytes]], close: bool = True) -> list[dict[str, Any]]:
    translator = Translator(context())
    frames = translator.start(1000.0)
    for now, data in timed:
        frames += translator.receive_data(data, now)
    if close:
        frames += translator.close(EXITED, 1100.0)
    return as_data(frames)


def messages(frames: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [
        (f["messageId"], f["text"], f.get("partial", False))
        for f in frames
        if f["type"] == "provider_message"
    ]


def test_a_text_grows_under_one_message_id_at_most_ten_times_a_second() -> None:
    frames = feed(
        [
            (1001.0, start_text()),
            (1001.0, delta("The answer ")),
            (1001.05, delta("is forty ")),  # within 0.1 s of the last update: coalesced
            (1001.2, delta("two, as ")),
            (1001.2, delta("computed.")),
            (1001.3, text_line("The answer is forty two, as computed.")),
        ]
    )
    assert messages(frames) == [
        ("run-1:message:1", "The answer", True),
        ("run-1:message:1", "The answer is forty two, as", True),
        ("run-1:message:1", "The answer is forty two, as computed.", False),
    ]


def test_a_credential_is_never_shown_before_it_is_whole() -> None:
    secret = "sk-ant-api03-" + secrets.token_hex(24)
    pieces = [secret[i : i + 5] for i in range(0, len(secret), 5)]
    timed = [(1001.0, start_text()), (1001.0, delta("Use the key "))]
    timed += [(1001.0 + 0.2 * (n + 1), delta(piece)) for n, piece in enumerate(pieces)]
    timed += [(1010.0, delta(" then stop.")), (1011.0, text_line(f"Use the key {secret} then"))]
    frames = feed(timed)
    shown = [text for _, text, _ in messages(frames)]
    assert len(shown) >= 3
    random = secret.removeprefix("sk-ant-api03-")
    for text in shown:
        assert not any(random[i : i + 6] in text for i in range(len(random) - 5)), text
    assert "[redacted]" in shown[-1]


def test_a_stream_cut_off_ends_its_message_with_what_streamed() -> None:
    frames = feed(
        [
            (1001.0, start_text()),
            (1001.0, delta("half a tho")),
            # The next message begins: the first never got its full line.
            (1002.0, event(type="message_start", message={"id": "m2"})),
            (1002.0, start_text()),
            (1002.0, delta("second")),
        ]
    )
    assert messages(frames) == [
        ("run-1:message:1", "half a", True),
        ("run-1:message:1", "half a tho", False),
        ("run-1:message:2", "second", False),  # ended by the run's end
    ]


def test_texts_of_a_subagent_stream_under_its_task_card_once_it_is_open() -> None:
    frames = feed(
        [
            (1001.0, start_text(parent="task1")),  # before its Task card: not shown
            (1001.0, delta("early words", parent="task1")),
            (1001.0, assistant(tool_use("task1", "Agent", description="look"))),
            (1001.5, start_text(parent="task1")),
            (1001.5, delta("sub text ", parent="task1")),
            (1001.6, text_line("sub text done", parent="task1")),
        ]
    )
    assert [(t, p) for _, t, p in messages(frames)] == [
        ("sub text", True),
        ("sub text done", False),
    ]
    assert {f["parent_tool_id"] for f in of_type_data(frames, "provider_message")} == {
        "claude:task1"
    }


def of_type_data(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == kind]


def test_a_write_opens_at_its_blocks_start_and_its_row_learns_the_file() -> None:
    start = event(
        type="content_block_start",
        index=1,
        content_block={"type": "tool_use", "id": "w1", "name": "Write", "input": {}},
    )
    frames = as_data(
        run(
            [
                start,
                event(type="content_block_delta", index=1, delta={"type": "input_json_delta"}),
                assistant(tool_use("w1", "Write", file_path="/srv/workspaces/demo/src/a.py")),
                tool_result("w1", "written"),
            ]
        )
    )
    kinds = [f["type"] for f in frames if f["type"] not in ("provider_invocation", "run_result")]
    assert kinds == [
        "provider_activity",
        "tool_call",
        "provider_activity",
        "tool_call",
        "provider_activity",
        "tool_result",
    ]
    rows = of_type_data(frames, "provider_activity")
    assert [r.get("files") for r in rows] == [None, ["a.py"], ["a.py"]]
    assert {r["sequence"] for r in rows} == {1}
    calls = of_type_data(frames, "tool_call")
    assert [c["summary"] for c in calls] == ["Write", "Write src/a.py"]


def test_stream_events_of_other_shapes_carry_nothing() -> None:
    frames = run(
        [
            line(type="stream_event"),  # no event at all
            event(type="content_block_start", index=0),  # no block
            event(type="content_block_start", index=0, content_block={"type": "thinking"}),
            event(type="content_block_delta", index=5, delta={"type": "text_delta", "text": "x"}),
            event(type="content_block_delta", index=0),
            event(type="message_delta", delta={"stop_reason": "end_turn"}),
            start_text(),
            delta(""),
            delta("   "),
            event(type="message_stop"),
        ]
    )
    assert of_type(frames, "provider_message") == []
    assert of_type(frames, "tool_call") == []
    assert of_type(frames, "diagnostic") == []


def quiet_events(marker: str, known: bool) -> list[bytes]:
    """Two partial events that carry nothing for the text that streams, ``marker`` in each."""
    if known:
        deltas = [
            {"type": "input_json_delta", "partial_json": f'{{"k": "{marker}'},
            {"type": "thinking_delta", "thinking": marker},
        ]
        return [event(type="content_block_delta", index=0, delta=d) for d in deltas]
    new_delta = {"type": "compaction_delta", "text": marker}
    return [
        event(type="content_block_delta", index=0, delta=new_delta),
        event(type="content_block_pause", index=0, text=marker),
    ]


@pytest.mark.parametrize("known", [True, False], ids=["thinking and tool input", "not known yet"])
def test_deltas_that_carry_nothing_do_not_grow_the_text_that_streams(known: bool) -> None:
    # The intake dismisses them while a text streams too (not only while none does); a new CLI
    # may stream types this version does not list: neither shown nor counted.
    marker = secrets.token_hex(8)
    first, second = quiet_events(marker, known)
    frames = feed(
        [
            (1001.0, start_text()),
            (1001.0, delta("The answer ")),
            (1001.05, first),
            (1001.1, second),
            (1001.2, delta("is here.")),
        ],
        close=False,
    )
    assert messages(frames) == [
        ("run-1:message:1", "The answer", True),
        ("run-1:message:1", "The answer is", True),
    ]
    assert marker not in str(frames)
    assert [f for f in frames if f["type"] == "diagnostic"] == []


def test_a_stream_event_of_a_wrong_shape_is_a_malformed_line() -> None:
    frames = run([line(type="stream_event", event={"type": "content_block_start", "index": "x"})])
    assert [(d["code"], d["count"]) for d in of_type(frames, "diagnostic")] == [
        ("malformed_line", 1)
    ]


def test_a_text_delta_whose_text_is_not_a_string_is_a_malformed_line() -> None:
    bad = {"type": "text_delta", "text": 7}
    frames = run([start_text(), event(type="content_block_delta", index=0, delta=bad)])
    assert [(d["code"], d["count"]) for d in of_type(frames, "diagnostic")] == [
        ("malformed_line", 1)
    ]


@pytest.mark.parametrize(
    "odd",
    [b"{not json\n", event(type="content_block_pause", index=0)],
    ids=["malformed", "new event type"],
)
def test_a_block_read_line_by_line_means_what_it_means_read_whole(odd: bytes) -> None:
    # A line the decoder cannot take at once (malformed, or an event of a new type) sends its
    # whole block line by line: a block's end there must not end the text that streams, as it
    # does not in a block read whole, or the full line would show as a second message.
    lines = [
        start_text(),
        delta("Hello "),
        event(type="content_block_stop", index=0),
        delta("there "),
        text_line("Hello there"),
    ]
    whole = as_data(run([b"".join(lines)]))
    by_line = as_data(run([b"".join([*lines[:2], odd, *lines[2:]])]))
    shown = [("run-1:message:1", "Hello", True), ("run-1:message:1", "Hello there", False)]
    assert messages(whole) == shown
    assert messages(by_line) == shown


def test_a_long_stream_is_bounded_and_an_unchanged_text_is_not_sent_again() -> None:
    from codelegate.translator import Limits

    translator = Translator(context(), Limits(text_chars=300))
    frames = translator.start(1000.0)
    frames += translator.receive_data(start_text() + delta("word " * 100), 1001.0)
    frames += translator.receive_data(delta("more " * 100), 1002.0)
    frames += translator.receive_data(delta("tail"), 1003.0)  # no new word: nothing new to show
    frames += translator.receive_data(text_line("word " * 200), 1004.0)
    shown = messages(as_data(frames))
    assert [partial for _, _, partial in shown] == [True, True, False]
    assert all(len(text) <= 300 for _, text, _ in shown)


def test_a_block_without_its_full_line_ends_when_the_next_block_starts() -> None:
    frames = feed(
        [
            (1001.0, start_text()),
            (1001.0, delta("one and ")),
            (1001.5, start_text(1)),  # the first block's full line never came
            (1001.5, delta("two ", 1)),
            (1002.0, text_line("two done")),
        ]
    )
    assert messages(frames) == [
        ("run-1:message:1", "one and", True),
        ("run-1:message:1", "one and ", False),
        ("run-1:message:2", "two", True),
        ("run-1:message:2", "two done", False),
    ]


def test_a_card_opened_at_its_start_is_restored_once_with_its_arguments() -> None:
    from codelegate.translator.frames import decode_frame, encode_frame

    start = event(
        type="content_block_start",
        content_block={"type": "tool_use", "id": "e1", "name": "Edit"},
    )
    translator = Translator(context())
    frames = translator.start(1000.0)
    frames += translator.receive_data(
        start + assistant(tool_use("e1", "Edit", file_path="/srv/workspaces/demo/x.py")), 1001.0
    )
    stored = [decode_frame(encode_frame(frame)) for frame in frames]
    restored = Translator.restore(context(), stored)
    out = as_data(restored.close(EXITED, 1002.0))
    assert out[-1]["result"]["tools"] == {"started": 1, "completed": 0, "failed": 1}
    (row,) = (f for f in out if f["type"] == "provider_activity")
    assert (row["sequence"], row["files"]) == (1, ["x.py"])


def test_a_quoted_credential_of_several_words_never_shows_a_word_of_it() -> None:
    words = [secrets.token_hex(4) for _ in range(4)]
    text = f'The config says password = "{" ".join(words)}" and it\'s old. Done here.'
    pieces = [piece + " " for piece in text.split(" ")]
    timed = [(1001.0, start_text())]
    timed += [(1001.0 + 0.2 * (n + 1), delta(piece)) for n, piece in enumerate(pieces)]
    frames = feed([*timed, (1010.0, text_line(text))])
    shown = [text for _, text, _ in messages(frames)]
    assert len(shown) >= 8
    for text_shown in shown:
        assert not any(word in text_shown for word in words), text_shown
    assert shown[-1] == 'The config says password = "[redacted]" and it\'s old. Done here.'


def test_a_message_cut_off_by_a_restart_ends_with_the_text_it_had_reached() -> None:
    from codelegate.translator.frames import decode_frame, encode_frame

    translator = Translator(context())
    frames = translator.start(1000.0)
    frames += translator.receive_data(start_text() + delta("done ") + text_line("done"), 1001.0)
    agent = assistant(tool_use("a1", "Agent", description="x"))
    frames += translator.receive_data(agent + start_text(1) + delta("main words ", 1), 1001.0)
    frames += translator.receive_data(start_text(0, "a1") + delta("sub words ", 0, "a1"), 1001.0)
    stored = [decode_frame(encode_frame(frame)) for frame in frames]
    restored = Translator.restore(context(), stored)
    out = as_data(restored.close(EXITED, 1002.0))
    ended = [(f["messageId"], f["text"], f.get("parent_tool_id")) for f in out if "messageId" in f]
    assert ended == [
        ("run-1:message:2", "main words", None),
        ("run-1:message:3", "sub words", "claude:a1"),
    ]
    assert all("partial" not in f for f in out)


def test_a_known_credential_of_the_run_is_masked_in_streamed_text_and_progress() -> None:
    from codelegate.translator import Redactor

    known = secrets.token_hex(12)
    translator = Translator(context(parent_tool_call_id=None), redactor=Redactor([known]))
    frames = translator.start(1000.0)
    text = f"the daemon passed {known} to me, and {known} again"
    for n, piece in enumerate([text[i : i + 7] for i in range(0, len(text), 7)]):
        chunk = start_text() + delta(piece) if n == 0 else delta(piece)
        frames += translator.receive_data(chunk, 1001.0 + n)
    frames += translator.receive_data(text_line(text), 1050.0)
    frames += translator.receive_data(assistant(tool_use("a1", "Agent", description="x")), 1051.0)
    frames += translator.receive_data(
        assistant({"type": "text", "text": f"sub says {known}"}, parent="a1"), 1052.0
    )
    frames += translator.close(EXITED, 1060.0)
    data = as_data(frames)
    assert len(messages(data)) >= 4
    assert [f["result"] for f in data if f["type"] == "tool_call_update"] == ["sub says [redacted]"]
    assert known not in b"".join(encode_frame(f) for f in frames).decode()
