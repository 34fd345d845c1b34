"""Hypothesis properties: the card invariants of DESIGN hold whatever the CLI prints."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codelegate.translator import Outcome
from codelegate.translator.frames import Frame, RunResult, ToolCall, ToolCallUpdate, ToolResult
from tests.translator.helpers import (
    assistant,
    chunked,
    context,
    init_line,
    line,
    result_line,
    run,
    system,
    tool_result,
    tool_use,
)

IDS = st.sampled_from(["t1", "t2", "t3", "t4"])
TOOLS = st.sampled_from(["Read", "Bash", "Edit", "Agent", "Grep", "Mystery"])


def check_invariants(frames: Sequence[Frame]) -> None:
    """DESIGN card invariants 1-3, gapless seq from 1, run_result last and alone."""
    assert [frame.seq for frame in frames] == list(range(1, len(frames) + 1))
    assert all(frame.id == f"{frame.run_id}:{frame.seq}" for frame in frames)
    assert isinstance(frames[-1], RunResult)
    assert sum(isinstance(frame, RunResult) for frame in frames) == 1
    opened: Counter[str] = Counter()
    closed: Counter[str] = Counter()
    for frame in frames:
        if isinstance(frame, ToolCall):
            # A repeated tool_call updates its open card (a card opened at its block's start
            # gets its arguments); after its result, it would be a second card.
            assert not closed[frame.tool_id], "a second card for one tool_use id"
            opened[frame.tool_id] = 1
        elif isinstance(frame, ToolCallUpdate):
            assert opened[frame.tool_id], "progress of a card never opened"
            assert not closed[frame.tool_id], "progress of a closed card"
        elif isinstance(frame, ToolResult):
            assert opened[frame.tool_id] == 1, "a result without its earlier call"
            closed[frame.tool_id] += 1
            assert closed[frame.tool_id] == 1, "two results for one call"
    assert opened == closed, "a card left open at the end"
    result = frames[-1].result  # type: ignore[attr-defined]
    assert result.tools.started == len(opened)
    assert result.tools.completed + result.tools.failed == len(closed)


def _event(draw: Any) -> bytes:
    kind = draw(st.integers(0, 9))
    use_id = draw(IDS)
    parent = draw(st.one_of(st.none(), IDS))
    if kind <= 2:
        return assistant(
            tool_use(use_id, draw(TOOLS), file_path="/srv/workspaces/demo/a"), parent=parent
        )
    if kind <= 4:
        extra = draw(st.sampled_from([None, {"status": "async_launched"}, "text", [1]]))
        return tool_result(use_id, is_error=draw(st.booleans()), parent=parent, extra=extra)
    if kind == 5:
        return line(
            type="system",
            subtype=draw(st.sampled_from(["task_notification", "task_updated", "task_progress"])),
            task_id="k" + use_id,
            tool_use_id=use_id,
            status=draw(st.sampled_from(["completed", "failed", "stopped"])),
            patch={"status": "completed"},
        )
    if kind == 6:
        return system("permission_denied", tool_use_id=use_id, tool_name="Bash")
    if kind == 7:
        return draw(st.sampled_from([result_line(), init_line(), init_line("s-2")]))
    if kind == 8:
        return line(type="tool_progress", tool_use_id=use_id, elapsed_time_seconds=3)
    return draw(
        st.sampled_from([b"{not json\n", b"[1,2]\n", b'{"type":"new_thing"}\n', b"\xff\xfe\n"])
    )


@st.composite
def transcripts(draw: Any) -> bytes:
    return b"".join(_event(draw) for _ in range(draw(st.integers(0, 25))))


REASONS = st.sampled_from(["exited", "cancelled", "timeout", "interrupted", "spawn_failed"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts(), REASONS, st.lists(st.integers(1, 64), max_size=40), st.booleans())
def test_card_invariants(data: bytes, reason: Any, sizes: list[int], work_room: bool) -> None:
    outcome = Outcome(reason=reason, exit_code=0 if reason == "exited" else None)
    # Without a Work Room, open cards also get progress texts (tool_call_update).
    ctx = context(parent_tool_call_id="call_1" if work_room else None)
    frames = run(chunked(data, sizes), ctx, outcome=outcome)
    check_invariants(frames)
    whole = run([data], ctx, outcome=outcome)
    assert [f.seq for f in whole] == [f.seq for f in frames]
    assert [type(f) for f in whole] == [type(f) for f in frames]


@settings(max_examples=100, deadline=None)
@given(transcripts())
def test_state_revision_only_grows(data: bytes) -> None:
    revisions = [
        frame.stateRevision  # type: ignore[attr-defined]
        for frame in run([data])
        if frame.__class__.__name__ == "ProviderInvocation"
    ]
    assert revisions == sorted(set(revisions))
    assert revisions[0] == 1


def _real_lines() -> list[Any]:
    import json
    from pathlib import Path

    root = Path(__file__).parent.parent
    lines = []
    for folder in (root / "golden" / "transcripts", Path(__file__).parent / "golden" / "reference"):
        for path in sorted(folder.glob("*.jsonl")):
            lines += [json.loads(raw) for raw in path.read_bytes().splitlines() if raw.strip()]
    return lines


REAL_LINES = _real_lines()
ODD_VALUES = st.sampled_from([None, 0, -1, 1.5, True, "", "x", [], [1], {}, {"a": 1}, "toolu_x"])


@st.composite
def mutated(draw: Any) -> bytes:
    """Real CLI lines with values swapped for odd ones at random places (shapes the CLI never
    sent): the translator must neither raise nor break a card invariant."""
    import copy
    import json

    out = []
    for _ in range(draw(st.integers(1, 12))):
        value = copy.deepcopy(draw(st.sampled_from(REAL_LINES)))
        for _ in range(draw(st.integers(0, 3))):
            node = value
            for _ in range(draw(st.integers(0, 4))):
                children = (
                    list(node.items())
                    if isinstance(node, dict)
                    else list(enumerate(node))
                    if isinstance(node, list)
                    else []
                )
                children = [(k, v) for k, v in children if isinstance(v, dict | list)]
                if not children:
                    break
                node = draw(st.sampled_from(children))[1]
            if isinstance(node, dict) and node:
                key = draw(st.sampled_from(sorted(node)))
                if draw(st.booleans()):
                    del node[key]
                else:
                    node[key] = copy.deepcopy(draw(ODD_VALUES))
            elif isinstance(node, list) and node:
                node[draw(st.integers(0, len(node) - 1))] = copy.deepcopy(draw(ODD_VALUES))
        out.append(json.dumps(value).encode() + b"\n")
    return b"".join(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), REASONS)
def test_odd_shapes_of_real_lines_never_raise(data: bytes, reason: Any) -> None:
    outcome = Outcome(reason=reason, exit_code=0 if reason == "exited" else None)
    check_invariants(run([data], outcome=outcome))
    check_invariants(run(data.splitlines(keepends=True), outcome=outcome))
