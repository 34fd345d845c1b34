"""The frames of real CLI runs, as O Chat shows them: through O Chat's own normalizer.

O Chat renders frames with ``mapEventToChatItem`` of ``@connectonion/react``, a fail-closed
normalizer that silently drops what breaks its rules; ``show`` (tests/contract/ochat.py) runs
it on frames as O Chat's ``RemoteAgent`` feeds it. The frames
are the translator's for the transcripts captured from the real CLI, and the assertions are what
a user sees in the Work Room: rows in opening order at every step, no raw command or path in a
row, every assistant message once, the final answer, the same items after a reconnect, and a
follow-up run under the same parent tool call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from codelegate.translator import Outcome, RunContext, Translator
from codelegate.translator.frames import Frame, encode_frame
from tests.contract.ochat import Items, Show
from tests.translator.helpers import CWD
from tests.translator.test_golden import CASES, SETS, _launch, _manifest

INVOCATION = "claude_code:call_1"  # the parent tool call of tests.translator.helpers.context
# Tool arguments that name a command or a path: none may reach a Work Room row.
RAW_KEYS = ("command", "file_path", "notebook_path", "path", "pattern", "url", "description")


def _translate(ctx: RunContext, data: bytes, outcome: Outcome) -> tuple[list[Frame], Translator]:
    translator = Translator(ctx)
    frames = translator.start(ctx.started_at)
    frames += translator.receive_data(data, ctx.started_at + 1)
    frames += translator.close(outcome, ctx.started_at + 2)
    return frames, translator


def _frames(path: Path, entry: dict[str, Any]) -> list[Frame]:
    ctx, outcome = _launch(entry)
    return _translate(ctx, path.read_bytes(), outcome)[0]


def _data(frames: Sequence[Frame]) -> list[dict[str, Any]]:
    return [msgspec.json.decode(encode_frame(frame)) for frame in frames]


def _invocation(items: Items) -> dict[str, Any] | None:
    return next((item for item in items if item.get("id") == INVOCATION), None)


def _opened(frames: list[dict[str, Any]]) -> list[str]:
    """Card ids in the order the cards opened."""
    order: dict[str, None] = {}
    for frame in frames:
        card = frame.get("tool_id") if frame["type"] == "tool_call" else frame.get("activityId")
        if card is not None:
            order.setdefault(card, None)
    return list(order)


def _raw_texts(frames: list[dict[str, Any]]) -> set[str]:
    """Commands and paths the cards' arguments name, and the run's absolute folders."""
    raw = {CWD, "/home/demo", "/tmp/claude"}
    for frame in frames:
        args = frame.get("args")
        if frame["type"] == "tool_call" and isinstance(args, dict):
            raw.update(args[key] for key in RAW_KEYS if isinstance(args.get(key), str))
    return {text for text in raw if len(text) >= 6}


def _check_rows(frames: list[dict[str, Any]], steps: list[Items]) -> None:
    """At every step: one row per opened card, in opening order, none holding a raw text."""
    raw = _raw_texts(frames)
    for n, items in enumerate(steps, 1):
        invocation = _invocation(items)
        rows = invocation["activities"] if invocation else []
        assert [row["id"] for row in rows] == _opened(frames[:n]), f"after frame {n}"
        for row in rows:
            shown = json.dumps(row)
            assert row.get("legacy") is False, f"after frame {n}: a raw tool row {shown}"
            leaked = [text for text in raw if text in shown]
            assert not leaked, f"after frame {n}: {leaked} in {shown}"


def _messages(frames: list[dict[str, Any]]) -> list[str]:
    """Each message's last text, in the order the messages began (a streamed one grows)."""
    texts: dict[str, str] = {}
    for frame in frames:
        if frame["type"] == "provider_message" and frame["text"].strip():
            texts[frame["messageId"]] = frame["text"].strip()
    return list(texts.values())


@pytest.fixture(params=[pytest.param(each.values, id=each.id) for each in CASES])
def case(request: pytest.FixtureRequest) -> tuple[Path, dict[str, Any]]:
    """One golden transcript (either set) and its manifest entry."""
    _, path, entry = request.param
    return path, entry


@pytest.fixture
def frames(case: tuple[Path, dict[str, Any]]) -> list[Frame]:
    """The frames the translator makes of ``case``."""
    return _frames(*case)


def test_o_chat_shows_every_row_in_opening_order_and_no_raw_command_or_path(
    show: Show, frames: list[Frame]
) -> None:
    (steps,) = show(frames)
    _check_rows(_data(frames), steps)


def test_o_chat_shows_every_assistant_message_once_and_the_final_answer(
    show: Show, frames: list[Frame]
) -> None:
    data = _data(frames)
    (steps,) = show(frames)
    invocation = _invocation(steps[-1])
    assert invocation is not None
    shown = [message["text"] for message in invocation["messages"]]
    assert shown == _messages(data)
    (final,) = (f["result"] for f in data if f["type"] == "run_result")
    if final["status"] == "completed" and final["result"].strip():
        assert final["result"].strip() in shown
    assert invocation["status"] == ("completed" if final["status"] == "completed" else "failed")


def test_o_chat_shows_the_same_items_after_a_reconnect(show: Show, frames: list[Frame]) -> None:
    data = _data(frames)
    middle = len(frames) // 2
    feeds = [
        frames,
        frames[:middle] + frames,  # reconnected mid-run with after=0: everything again
        frames[:middle] + frames[middle // 2 :],  # with after=N below what it had seen
        frames[:1] + frames,
    ]
    live, *reconnects = show(*feeds)
    for feed, steps in zip(feeds[1:], reconnects, strict=True):
        assert steps[-1] == live[-1]
        _check_rows(_data(feed), steps)
    shown = _invocation(live[-1])
    assert shown is not None
    assert [m["text"] for m in shown["messages"]] == _messages(data)


def test_o_chat_shows_a_follow_up_run_under_the_same_parent(show: Show) -> None:
    # resume_1 then resume_2: a Work Room continued with a second prompt under the same parent
    # tool call, as the ConnectOnion host does.
    folder = SETS["captured"]
    manifest = _manifest(folder)
    ctx1, outcome1 = _launch(manifest["resume_1.jsonl"])
    first, translator = _translate(ctx1, (folder / "resume_1.jsonl").read_bytes(), outcome1)
    ctx2, outcome2 = _launch(manifest["resume_2.jsonl"])
    ctx2 = msgspec.structs.replace(
        ctx2,
        run_id="run-golden-2",
        started_at=ctx1.started_at + 60,
        revision_base=translator.revision,
        sequence_base=translator.activity_sequence,
    )
    second = _translate(ctx2, (folder / "resume_2.jsonl").read_bytes(), outcome2)[0]
    data = _data(first + second)
    revisions = [f["stateRevision"] for f in data if f["type"] == "provider_invocation"]
    assert revisions == sorted(set(revisions))
    (steps,) = show(first + second)
    _check_rows(data, steps)
    # The second run's start shows: the Work Room is running again, not a stale frame.
    restarted = _invocation(steps[len(first)])
    assert restarted is not None
    assert restarted["status"] == "running"
    final = _invocation(steps[-1])
    assert final is not None
    assert final["status"] == "completed"
    second_texts = _messages(_data(second))
    assert second_texts
    assert [m["text"] for m in final["messages"]] == _messages(_data(first)) + second_texts


def test_o_chat_cards_without_a_work_room_show_progress_then_their_result(
    show: Show, case: tuple[Path, dict[str, Any]]
) -> None:
    path, entry = case
    ctx, outcome = _launch(entry)
    ctx = msgspec.structs.replace(ctx, parent_tool_call_id=None)
    frames = _translate(ctx, path.read_bytes(), outcome)[0]
    data = _data(frames)
    (steps,) = show(frames)
    for n, items in enumerate(steps, 1):
        cards = {item["id"]: item for item in items if item.get("type") == "tool_call"}
        expected: dict[str, tuple[str, str | None]] = {}
        for frame in data[:n]:
            if frame["type"] == "tool_call":
                expected.setdefault(frame["tool_id"], ("running", None))
            elif frame["type"] == "tool_call_update":
                expected[frame["tool_id"]] = ("running", frame["result"])
            elif frame["type"] == "tool_result":
                done = "done" if frame["status"] == "completed" else "error"
                expected[frame["tool_id"]] = (done, frame["result"])
        assert list(cards) == list(expected), f"after frame {n}"
        for tool_id, (status, result) in expected.items():
            assert cards[tool_id]["status"] == status, f"after frame {n}"
            assert cards[tool_id].get("result") == result, f"after frame {n}"
