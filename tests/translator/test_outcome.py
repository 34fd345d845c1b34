"""The final result: last result line wins, status rules, bounds (DESIGN "The final result")."""

from __future__ import annotations

from typing import Any

import msgspec

from codelegate.translator import Limits, Outcome
from tests.translator.helpers import (
    as_data,
    assistant,
    context,
    init_line,
    result_line,
    run,
    tool_result,
    tool_use,
)


def final(chunks: list[bytes], outcome: Outcome | None = None, **ctx: Any) -> dict[str, Any]:
    frames = run(chunks, context(**ctx), outcome=outcome or Outcome(reason="exited", exit_code=0))
    return as_data(frames)[-1]["result"]


def test_the_last_result_line_wins() -> None:
    result = final(
        [result_line("first", num_turns=1), init_line(), result_line("second", num_turns=2)]
    )
    assert (result["status"], result["result"], result["num_turns"]) == ("completed", "second", 2)
    assert result["usage"] == {"input_tokens": 1, "output_tokens": 2}
    assert result["session_id"] == "s-1"
    assert result["error"] is None


def test_failures() -> None:
    exited = Outcome(reason="exited", exit_code=0)
    cases: list[tuple[list[bytes], Outcome, str]] = [
        ([], exited, "the Claude Code CLI ended without a result"),
        (
            [result_line("API Error: 500", is_error=True, api_error_status=500)],
            Outcome(reason="exited", exit_code=1),
            "API error 500",
        ),
        (
            [
                result_line(
                    "",
                    subtype="error_during_execution",
                    is_error=True,
                    errors=["No conversation found"],
                )
            ],
            exited,
            "error_during_execution: No conversation found",
        ),
        (
            [result_line("", subtype="error_max_turns", is_error=True, errors=5)],
            exited,
            "error_max_turns",
        ),
        (
            [result_line("partial", subtype="error_max_budget_usd")],
            exited,
            "error_max_budget_usd: partial",
        ),
        ([result_line("", subtype="", is_error=True)], exited, "error"),
        (
            [result_line()],
            Outcome(reason="exited", exit_code=2),
            "the Claude Code CLI exited with code 2",
        ),
        (
            [result_line()],
            Outcome(reason="exited", signal=9),
            "the Claude Code CLI was killed by signal 9",
        ),
        ([result_line()], Outcome(reason="exited"), "the Claude Code CLI exit status is unknown"),
        (
            [result_line()],
            Outcome(reason="spawn_failed"),
            "the Claude Code CLI could not be started",
        ),
    ]
    for chunks, outcome, error in cases:
        result = final(chunks, outcome)
        assert (result["status"], result["error"]) == ("failed", error)


def test_stopped_runs_take_the_reason_as_status() -> None:
    for reason in ("cancelled", "timeout", "interrupted"):
        result = final([result_line()], Outcome(reason=reason))  # type: ignore[arg-type]
        assert result["status"] == reason
        assert result["error"]


def test_a_resumed_run_that_reports_another_session_fails() -> None:
    ok = final([init_line("s-1"), result_line(session_id="s-1")], session_id="s-1", resumed=True)
    assert (ok["status"], ok["resumed"]) == ("completed", True)
    other = final([init_line("s-2"), result_line(session_id="s-2")], session_id="s-1", resumed=True)
    assert other["status"] == "failed"
    assert "different session" in other["error"]
    assert other["session_id"] == "s-2"


def test_tool_counts_and_duration_without_a_result_line() -> None:
    result = final(
        [
            assistant(tool_use("a", "Read")),
            tool_result("a"),
            assistant(tool_use("b", "Bash")),
            tool_result("b", is_error=True),
            assistant(tool_use("c", "Bash")),
        ]
    )
    assert result["tools"] == {"started": 3, "completed": 1, "failed": 2}
    assert result["duration_ms"] == 2000
    assert result["usage"] is None


def test_odd_result_fields_do_not_break_the_result() -> None:
    result = final([result_line(usage="not a dict", permission_denials={"not": "a list"})])
    assert result["usage"] is None
    assert result["permission_denials"] == []
    big_usage = {f"counter_{i}": "x" * 200 for i in range(30)}
    assert final([result_line(usage=big_usage)])["usage"] is None


def test_the_final_result_stays_within_its_bound() -> None:
    limits = Limits(final_result_bytes=3000, arg_bytes=4096)
    denials = [
        {"tool_use_id": f"t{i}", "tool_name": "Bash", "tool_input": {"command": "x" * 900}}
        for i in range(10)
    ]
    frames = run([result_line("y" * 10_000, permission_denials=denials)], limits=limits)
    result = frames[-1].result  # type: ignore[union-attr]
    assert len(msgspec.json.encode(result)) <= 3000
    assert result.permission_denials
    assert all(d.input is None for d in result.permission_denials)
    frames = run([result_line("z" * 10_000)], limits=limits)
    result = frames[-1].result  # type: ignore[union-attr]
    assert len(msgspec.json.encode(result)) <= 3000
    assert result.result.startswith("zzz")
    assert result.result.endswith("bytes cut]")


def test_a_failed_run_carries_the_end_of_stderr_redacted() -> None:
    noisy = (
        "".join(f"line {n}\n" for n in range(1000))
        + "fatal: ANTHROPIC_API_KEY=sk-ant-api03-abcdefghijklmnop\n"
    )
    crashed = Outcome(reason="exited", exit_code=1, signal=None, stderr_tail=noisy)
    result = final([init_line()], crashed)
    assert result["status"] == "failed"
    assert result["stderr"].endswith("fatal: ANTHROPIC_API_KEY=[redacted]")
    assert "line 999" in result["stderr"]
    assert "line 0\n" not in result["stderr"]
    assert len(result["stderr"]) <= Limits().stderr_chars


def test_stderr_is_left_out_of_a_completed_run_and_of_an_empty_tail() -> None:
    chatty = Outcome(reason="exited", exit_code=0, stderr_tail="a warning\n")
    assert final([init_line(), result_line("done")], chatty)["stderr"] is None
    silent = Outcome(reason="exited", exit_code=1, stderr_tail="  \n")
    assert final([init_line()], silent)["stderr"] is None
