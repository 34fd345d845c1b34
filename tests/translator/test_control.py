"""The control channel: the stdin lines a run writes, and when the run is over (stdin closes)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec
import pytest

from codelegate.translator import Translator
from codelegate.translator.control import (
    Channel,
    ResultWatch,
    control_request,
    opening,
    user_message,
)
from codelegate.translator.wire import task_ids
from tests.translator.helpers import assistant, chunked, context, init_line, line, result_line

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "golden" / "transcripts"


def test_the_opening_is_initialize_then_the_prompt_as_whole_json_lines() -> None:
    data = opening('Fix "it"\nplease ü \ud800')
    first, second = data.split(b"\n")[:2]
    assert data.count(b"\n") == 2
    assert data.endswith(b"\n")
    assert json.loads(first) == {
        "type": "control_request",
        "request_id": "initialize",
        "request": {"subtype": "initialize"},
    }
    # A lone surrogate travels as a JSON escape: the line is ASCII, and reads back whole.
    assert second.isascii()
    assert json.loads(second)["message"] == {
        "role": "user",
        "content": 'Fix "it"\nplease ü \ud800',
    }
    assert user_message('Fix "it"\nplease ü \ud800') == second + b"\n"


def test_an_interrupt_is_one_control_request_line() -> None:
    raw = control_request("interrupt:r1", "interrupt")
    assert raw.endswith(b"\n")
    assert raw.count(b"\n") == 1
    assert json.loads(raw) == {
        "type": "control_request",
        "request_id": "interrupt:r1",
        "request": {"subtype": "interrupt"},
    }


@pytest.mark.parametrize(
    ("raw", "ids"),
    [
        (b'[{"task_id":"a","task_type":"local_bash"},{"task_id":"b"}]', ("a", "b")),
        (b"[]", ()),
        (b"null", None),
        (b'"x"', None),
        (b"[1]", None),
        (b"[{", None),
    ],
)
def test_task_ids_reads_the_list_of_open_tasks(raw: bytes, ids: tuple[str, ...] | None) -> None:
    assert task_ids(msgspec.Raw(raw)) == ids


def test_a_stop_task_request_names_its_task() -> None:
    line = control_request("stop_task:t1", "stop_task", task_id="t1")
    assert line.endswith(b"\n")
    assert json.loads(line) == {
        "type": "control_request",
        "request_id": "stop_task:t1",
        "request": {"subtype": "stop_task", "task_id": "t1"},
    }


def test_the_channel_is_over_at_a_result_with_no_background_task_open() -> None:
    channel = Channel()
    assert not channel.over
    channel.tasks(("b1",))
    channel.result()
    assert not channel.over  # a background task still runs: its own turn and result follow
    channel.tasks(None)  # a line that lists nothing readable changes nothing
    assert channel.background == ("b1",)
    channel.tasks(())
    assert not channel.over
    channel.result()
    assert channel.over
    channel.tasks(("b2",))  # a task started after that result: wait for the next one
    assert not channel.over


def _channel_after(name: str, kinds: tuple[str, ...] = ("result",)) -> list[tuple[str, Channel]]:
    """The transcript ``name`` read line by line: after each line of ``kinds``, its kind and
    the channel's facts then (a copy)."""
    translator = Translator(context())
    seen = []
    for raw in (TRANSCRIPTS / f"{name}.jsonl").read_bytes().splitlines(keepends=True):
        translator.receive_data(raw, 1.0)
        kind = json.loads(raw)["type"]
        if kind in kinds:
            channel = copy.copy(translator.channel)
            seen.append((kind, channel))
    return seen


def _over_after_each_result(name: str) -> list[bool]:
    return [channel.over for _, channel in _channel_after(name)]


def test_a_background_bash_keeps_stdin_open_until_the_result_after_its_notification() -> None:
    assert _over_after_each_result("bash_background") == [False, True]


def test_a_background_subagent_keeps_stdin_open_until_the_result_after_its_notification() -> None:
    # Over the control channel the first result comes while the subagent still works (listed
    # by background_tasks_changed); a one-shot CLI (stdin closed at once) held both results
    # until the subagent was done, so that each of them looked like the end.
    assert _over_after_each_result("subagent_background") == [False, True]


def test_the_channel_is_idle_from_a_result_until_the_next_turn_of_the_main_agent() -> None:
    translator = Translator(context())
    channel = translator.channel
    assert not channel.idle  # the prompt's turn runs from the start
    translator.receive_data(init_line() + result_line(), 1.0)
    assert channel.idle
    # A subagent's words (a background one may still talk) are not a turn of the main agent.
    subagent = {"type": "text", "text": "still working"}
    translator.receive_data(assistant(subagent, parent="toolu_bg"), 1.0)
    assert channel.idle
    translator.receive_data(init_line(), 1.0)  # a turn of its own, after a background task
    assert not channel.idle
    translator.receive_data(result_line(), 1.0)
    translator.receive_data(assistant({"type": "text", "text": "hello"}), 1.0)
    assert not channel.idle
    channel.result()
    channel.input_written("steer")  # the CLI takes a steering message in as a turn
    assert not channel.idle


def test_unread_counts_the_messages_written_mid_run_until_an_echo_spells_them() -> None:
    channel = Channel()
    channel.input_written("early")  # before the prompt's echo, which takes in nothing else
    channel.replayed("Prompt ending in\nearly?")
    assert channel.unread == 1
    channel.replayed("early")  # at a tool boundary: each message on its own
    assert channel.unread == 0
    for text in ("one", "two\nlines", "three"):
        channel.input_written(text)
    # After a turn, every message the CLI queued meanwhile comes back as one, joined.
    channel.replayed("one\ntwo\nlines")
    assert channel.unread == 1
    channel.result()
    assert not channel.over
    channel.replayed("three")
    channel.result()
    assert channel.over


def test_unread_bytes_are_the_utf8_bytes_of_the_messages_not_taken_in_yet() -> None:
    channel = Channel()
    channel.replayed("Do it.")  # the prompt's echo
    channel.input_written("ascii")
    channel.input_written("dé\ud800")  # two bytes for é, three for a lone surrogate
    assert (channel.unread, channel.unread_bytes) == (2, 5 + 6)
    channel.replayed("ascii")
    assert (channel.unread, channel.unread_bytes) == (1, 6)
    channel.replayed("dé\ud800")
    assert (channel.unread, channel.unread_bytes) == (0, 0)


def test_a_turn_of_its_own_that_calls_no_model_and_echoes_nothing_took_the_oldest_in() -> None:
    # A local command's answer (num_turns 0) is never echoed: it must not keep the run open.
    channel = Channel()
    channel.replayed("Do it.")
    channel.input_written("early")
    channel.result(0)  # the prompt's own turn: it took no steering message in
    assert (channel.unread, channel.over) == (1, False)
    channel.result(0)
    assert (channel.unread, channel.unread_bytes, channel.over) == (0, 0, True)
    for message in ("a", "b"):
        channel.input_written(message)
    channel.replayed("a")  # an echo in this turn: the echoes say what it took in
    channel.result(0)
    assert channel.unread == 1
    channel.result(1)  # a model turn with no echo takes nothing in
    channel.result(None)
    assert channel.unread == 1
    channel.result(0)
    assert (channel.unread, channel.unread_bytes, channel.over) == (0, 0, True)


def test_the_first_echo_may_carry_messages_written_before_the_cli_took_the_prompt_in() -> None:
    channel = Channel()
    channel.input_written("a")
    channel.input_written("a")
    channel.replayed("Do it.\na\na")
    assert channel.unread == 0


def test_an_echo_that_spells_no_unread_message_still_takes_one_in_after_the_prompts() -> None:
    channel = Channel()
    channel.input_written("steer")
    channel.replayed([])  # a first echo is the prompt's, whatever it holds
    channel.replayed("Do it.")  # an echo of nothing the daemon knows: the oldest one went
    assert channel.unread == 0
    channel.replayed([])
    assert channel.unread == 0
    channel.input_written("short")
    channel.input_written("x")
    channel.replayed("shorter")  # longer than one, shorter than both joined: spells none
    assert channel.unread == 1


def test_a_background_bash_leaves_the_channel_idle_between_its_two_turns() -> None:
    seen = [
        (kind, c.idle) for kind, c in _channel_after("bash_background", ("result", "assistant"))
    ]
    assert seen[-1] == ("result", True)
    first = seen.index(("result", True))
    # After the first result, the next turn's words make it busy again until its own result.
    assert ("assistant", False) in seen[first:]
    assert all(idle for kind, idle in seen if kind == "result")


def test_a_plain_run_is_over_at_its_result_whatever_the_chunking() -> None:
    data = init_line() + line(type="system", subtype="background_tasks_changed", tasks=[])
    data += result_line()
    for sizes in ([len(data)], [1] * len(data), [7, 300]):
        translator = Translator(context())
        for chunk in chunked(data, sizes):
            translator.receive_data(chunk, 1.0)
        assert translator.channel.over


def test_the_result_watch_finds_a_result_line_in_any_chunking() -> None:
    data = b'ial half line"}\nnot json\n{"type":"user"}\n[1]\n' + result_line() + b"{}\n"
    for sizes in ([len(data)], [1] * len(data), [5, 40]):
        watch = ResultWatch(1 << 16)
        seen = [watch.feed(chunk) for chunk in chunked(data, sizes)]
        assert seen[-1]
        assert seen.count(True) == len(chunked(data, sizes)) - seen.index(True)
        assert len(sizes) == 1 or not seen[0]
        assert watch.feed(b"more") is True  # stays seen


def test_the_result_watch_ignores_everything_but_a_result() -> None:
    watch = ResultWatch(1 << 16)
    assert not watch.feed(init_line() + b'{"type":"control_response"}\n')
    assert not watch.feed(b"")


def test_control_lines_of_the_cli_are_read_without_a_diagnostic() -> None:
    translator = Translator(context())
    answers = line(
        type="control_response",
        response={"subtype": "success", "request_id": "initialize", "response": {}},
    )
    answers += line(type="control_cancel_request", request_id="r")
    # With approvals off (no config) a prompt is denied at once, with no frame: as before.
    request = {"subtype": "can_use_tool", "tool_name": "Bash", "input": {}, "tool_use_id": "t"}
    answers += line(type="control_request", request_id="r", request=request)
    translator.receive_data(init_line(), 1.0)
    assert translator.receive_data(answers, 1.0) == []
    assert translator.receive_data(answers[:-1], 1.0) == []  # line by line, not as a block
    assert translator.receive_data(b"\n", 1.0) == []
    (deny,) = translator.approvals.take_control()
    assert json.loads(deny)["response"]["response"]["behavior"] == "deny"
