"""Review evidence in the final result: ``changes`` (diffs) and ``commands`` (Bash outcomes)."""

from __future__ import annotations

import secrets
from typing import Any

from codelegate.translator import Limits, Outcome, Translator
from codelegate.translator.frames import ToolCall, ToolResult
from codelegate.translator.review import _KEEP, Review
from tests.translator.helpers import (
    CWD,
    as_data,
    assistant,
    context,
    result_line,
    run,
    system,
    tool_result,
    tool_use,
)


def patch(path: str, old: str, new: str) -> dict[str, Any]:
    return {
        "filePath": path,
        "structuredPatch": [
            {
                "oldStart": 1,
                "oldLines": 1,
                "newStart": 1,
                "newLines": 1,
                "lines": [f"-{old}", f"+{new}"],
            }
        ],
    }


def edit(use_id: str, name: str, old: str, new: str, *, ok: bool = True) -> list[bytes]:
    path = f"{CWD}/{name}"
    return [
        assistant(tool_use(use_id, "Edit", file_path=path, old_string=old, new_string=new)),
        tool_result(use_id, "edited", extra=patch(path, old, new))
        if ok
        else tool_result(use_id, "String not found", is_error=True),
    ]


def bash(use_id: str, command: str, content: str = "ok", *, is_error: bool = False) -> list[bytes]:
    return [
        assistant(tool_use(use_id, "Bash", command=command)),
        tool_result(use_id, content, is_error=is_error),
    ]


def denied(use_id: str, command: str) -> list[bytes]:
    return [
        assistant(tool_use(use_id, "Bash", command=command)),
        system(
            "permission_denied",
            tool_use_id=use_id,
            tool_name="Bash",
            message="Permission denied. What required approval: touch outside",
        ),
        tool_result(use_id, "denied", is_error=True),
    ]


def final(chunks: list[bytes], **kw: Any) -> dict[str, Any]:
    result: dict[str, Any] = as_data(run([*chunks, result_line()], context(), **kw))[-1]["result"]
    return result


def test_the_result_holds_every_changed_files_diff_and_every_command_with_its_outcome() -> None:
    result = final(
        [
            *edit("e1", "a.py", "one", "two"),
            *edit("e2", "b.py", "x", "y", ok=False),  # failed: nothing changed
            *bash("b1", "pytest -q"),
            *bash("b2", "false", "Exit code 1", is_error=True),
            *denied("b3", "touch ../outside"),
            *edit("e3", "a.py", "two", "three"),
            assistant(tool_use("r1", "Read", file_path=f"{CWD}/a.py")),
            tool_result("r1", "three"),
        ]
    )
    assert result["changes"] == (
        "--- a/a.py\n+++ b/a.py\n@@ -1,1 +1,1 @@\n-one\n+two\n"
        "--- a/a.py\n+++ b/a.py\n@@ -1,1 +1,1 @@\n-two\n+three\n"
    )
    assert result["commands"] == [
        {"command": "pytest -q", "outcome": "completed", "error": None},
        {"command": "false", "outcome": "failed", "error": "Exit code 1"},
        {"command": "touch ../outside", "outcome": "denied", "error": "touch outside"},
    ]
    assert result["commands_omitted"] == 0


def test_a_run_without_changes_or_commands_has_empty_evidence() -> None:
    result = final([assistant({"type": "text", "text": "Nothing to do."})])
    assert (result["changes"], result["commands"], result["commands_omitted"]) == ("", [], 0)


def test_a_change_without_a_diff_is_named() -> None:
    path = f"{CWD}/nb.ipynb"
    result = final(
        [
            assistant(tool_use("n1", "NotebookEdit", notebook_path=path, new_source="x")),
            tool_result("n1", "updated"),
        ]
    )
    assert result["changes"] == "# nb.ipynb: changed; no diff reported\n"


def test_a_command_still_running_when_the_run_is_cancelled_is_interrupted_not_failed() -> None:
    # It may have run (approved, then the run cancelled): "failed" would tell the parent not.
    frames = run(
        [assistant(tool_use("b1", "Bash", command="sleep 100"))],
        context(),
        outcome=Outcome(reason="cancelled"),
    )
    result = as_data(frames)[-1]["result"]
    assert result["commands"] == [
        {
            "command": "sleep 100",
            "outcome": "interrupted",
            "error": "the run ended before the tool finished",
        }
    ]


def test_changes_beyond_their_share_are_cut_with_a_note_naming_what_was_left_out() -> None:
    big = "x" * 3000
    chunks = [*edit("e1", "a.py", "one", "two")]
    for n in range(2, 6):
        chunks += edit(f"e{n}", f"f{n}.py", "old", big)
    result = final(chunks, limits=Limits(final_result_bytes=16384, result_bytes=4096))
    changes: str = result["changes"]
    assert len(changes.encode()) <= 16384 * 3 // 8
    assert changes.startswith("--- a/a.py\n")
    note = changes.splitlines()[-1]
    assert note.startswith("# codelegate: ")
    assert "of 5 file changes not shown (f" in note
    assert "files_changed lists every file" in note
    # Whatever was cut, the kept diffs are whole, in order.
    assert "f5.py" in note
    assert result["files_changed"] == ["a.py", "f2.py", "f3.py", "f4.py", "f5.py"]


def test_commands_beyond_their_share_keep_the_newest_and_count_the_rest() -> None:
    chunks: list[bytes] = []
    for n in range(40):
        chunks += bash(f"b{n}", f"echo {n} " + "y" * 200)
    result = final(chunks, limits=Limits(final_result_bytes=16384))
    kept = result["commands"]
    assert 0 < len(kept) < 40
    assert result["commands_omitted"] == 40 - len(kept)
    assert kept[-1]["command"].startswith("echo 39 ")
    assert kept[0]["command"].startswith(f"echo {40 - len(kept)} ")


def test_a_planted_secret_never_reaches_the_evidence() -> None:
    secret = "sk-ant-api03-" + secrets.token_hex(24)
    env_secret = secrets.token_hex(16)
    result = final(
        [
            *edit("e1", "conf.py", "KEY = ''", f"KEY = '{secret}'"),
            *bash("b1", f"curl -H 'Authorization: Bearer {secret}' http://x"),
            *bash("b2", "env", f"API_TOKEN={env_secret}", is_error=True),
        ]
    )
    text = repr(result)
    assert secret not in text
    assert env_secret not in text
    assert "[redacted]" in result["changes"]


def test_a_restored_translator_rebuilds_the_evidence() -> None:
    chunks = [*edit("e1", "a.py", "one", "two"), *bash("b1", "pytest -q")]
    live = Translator(context())
    frames = live.start(1000.0)
    for chunk in chunks:
        frames += live.receive_data(chunk, 1001.0)
    restored = Translator.restore(context(), frames)
    outcome = Outcome(reason="interrupted")
    before = as_data(live.close(outcome, 1002.0))[-1]["result"]
    after = as_data(restored.close(outcome, 1002.0))[-1]["result"]
    assert after["changes"] == before["changes"] != ""
    assert after["commands"] == before["commands"] != []


def _call(tool_id: str, name: str, args: Any) -> ToolCall:
    return ToolCall(
        id="r:1", run_id="r", seq=1, ts=0.0, provider="claude_code",
        tool_id=tool_id, name=f"Claude Code › {name}", args=args, status="in_progress",
    )  # fmt: skip


def _result(tool_id: str, name: str, diff: str | None = None) -> ToolResult:
    return ToolResult(
        id="r:2", run_id="r", seq=2, ts=0.0, provider="claude_code",
        tool_id=tool_id, name=f"Claude Code › {name}", status="completed", result="", diff=diff,
    )  # fmt: skip


def test_cards_the_review_cannot_use_are_ignored() -> None:
    review = Review(CWD)
    review.observe(_call("claude:1", "Bash", {"command": 3}))  # not a string: redacted away
    review.observe(_call("claude:2", "Bash", "not an object"))
    review.observe(_call("claude:3", "Edit", {"old_string": "x"}))  # no path
    for n in (1, 2, 3, 4):
        review.observe(_result(f"claude:{n}", "Bash"))
    assert review.evidence(65536) == ("", [], 0)


def test_a_run_of_many_changes_and_commands_stays_bounded_while_it_goes() -> None:
    review = Review(CWD)
    for n in range(_KEEP + 3):
        review.observe(_call(f"claude:e{n}", "Edit", {"file_path": f"{CWD}/f{n}.py"}))
        review.observe(_result(f"claude:e{n}", "Edit", diff=f"--- a/f{n}.py\n"))
        review.observe(_call(f"claude:b{n}", "Bash", {"command": f"echo {n}"}))
        review.observe(_result(f"claude:b{n}", "Bash"))
    changes, commands, omitted = review.evidence(1 << 30)
    assert changes.splitlines()[-1].startswith(f"# codelegate: 3 of {_KEEP + 3} file changes")
    assert len(commands) == _KEEP
    assert commands[-1].command == f"echo {_KEEP + 2}"
    assert omitted == 3
