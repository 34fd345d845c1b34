"""Cards, rule by rule: titles, results, denials, edits, args, the Work Room (DESIGN "Frames")."""

from __future__ import annotations

import secrets

from codelegate.translator import Limits, Outcome, Redactor, Translator
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


def test_a_card_opens_and_closes_with_titles_and_names() -> None:
    frames = run(
        [
            init_line(),
            assistant(tool_use("t1", "Read", file_path=f"{CWD}/src/app.py")),
            tool_result("t1", "contents"),
            result_line(),
        ]
    )
    call = of_type(frames, "tool_call")[0]
    assert call["tool_id"] == "claude:t1"
    assert call["name"] == "Claude Code › Read"
    assert call["status"] == "in_progress"
    assert call["summary"] == "Read src/app.py"
    assert call.get("parent_tool_id") is None
    done = of_type(frames, "tool_result")[0]
    assert done["status"] == "completed"
    assert done["result"] == "contents"
    assert done["timing_ms"] == 0
    data = as_data(frames)
    assert all(f["provider"] == "claude_code" for f in data)
    assert all(f["child_session_id"] == "s-1" for f in data if f["seq"] > 1)


def test_every_frame_carries_invocation_ids_when_a_parent_is_named() -> None:
    data = as_data(run([assistant(tool_use("t1", "Bash", command="ls"))]))
    assert all(f["invocationId"] == "claude_code:call_1" for f in data)
    assert all(f["parentToolCallId"] == "call_1" for f in data)


def test_without_a_parent_there_is_no_work_room() -> None:
    frames = run(
        [assistant(tool_use("t1", "Bash", command="ls")), tool_result("t1")],
        context(parent_tool_call_id=None),
    )
    kinds = {f["type"] for f in as_data(frames)}
    assert kinds == {"tool_call", "tool_result", "run_result"}
    assert all("invocationId" not in f for f in as_data(frames))


def test_a_parent_id_o_chat_would_reject_is_not_used() -> None:
    frames = run([], context(parent_tool_call_id="bad id with spaces"))
    assert [f["type"] for f in as_data(frames)] == ["run_result"]


def test_invocation_lifecycle_and_permission_modes() -> None:
    for mode, expected in [
        ("safe", "manual"),
        ("plan", "manual"),
        ("accept_edits", "auto_approve"),
        ("auto", "auto_approve"),
    ]:
        frames = run(
            [init_line("s-9"), result_line(session_id="s-9")], context(mode=mode, session_id="s-1")
        )
        invocations = of_type(frames, "provider_invocation")
        assert [i["status"] for i in invocations] == ["running", "running", "completed"]
        assert [i["stateRevision"] for i in invocations] == [1, 2, 3]
        assert {i["permissionMode"] for i in invocations} == {expected}
        assert invocations[0]["sessionId"] == "s-1"
        assert invocations[1]["sessionId"] == "s-9"
        assert invocations[-1]["resultSummary"] == "The provider completed its run"
        assert invocations[-1]["elapsedMs"] == 2000
        assert {i["taskTitle"] for i in invocations} == {"Complete the requested task"}
        assert invocations[0]["currentSummary"] == "Working in the selected workspace"


def test_invocation_end_texts() -> None:
    cases = {
        "cancelled": ("cancelled", "The provider stopped"),
        "timeout": ("failed", "The provider stopped"),
        "interrupted": ("failed", "The provider stopped"),
        "spawn_failed": ("failed", "The provider reported an error"),
    }
    for reason, (status, text) in cases.items():
        last = of_type(run([], outcome=Outcome(reason=reason)), "provider_invocation")[-1]  # type: ignore[arg-type]
        assert (last["status"], last["errorSummary"]) == (status, text)


def test_activities_mirror_cards_with_allowlisted_texts() -> None:
    frames = run(
        [
            assistant(
                tool_use(
                    "t1", "Edit", file_path=f"{CWD}/docs/README.md", old_string="a", new_string="b"
                )
            ),
            tool_result("t1", "ok"),
            assistant(tool_use("t2", "Grep", pattern="TODO", path=f"{CWD}/src")),
            tool_result("t2", "boom", is_error=True),
            assistant(tool_use("t3", "Mystery")),
        ]
    )
    rows = [
        (a["activityId"], a["sequence"], a["kind"], a["status"], a["title"], a["summary"])
        for a in of_type(frames, "provider_activity")
    ]
    assert rows == [
        (
            "claude:t1",
            1,
            "file_change",
            "running",
            "Update workspace files",
            "Preparing workspace file changes",
        ),
        (
            "claude:t1",
            1,
            "file_change",
            "completed",
            "Update workspace files",
            "Workspace files updated",
        ),
        (
            "claude:t2",
            2,
            "search",
            "running",
            "Search for context",
            "Searching for relevant context",
        ),
        ("claude:t2", 2, "search", "failed", "Search for context", "Context search failed"),
        ("claude:t3", 3, "tool", "running", "Use a provider tool", "Using a provider tool"),
        ("claude:t3", 3, "tool", "failed", "Use a provider tool", "Provider tool failed"),
    ]
    # A row's number is its card's place in the Work Room, the same on all its frames.
    # Only file names, never the workspace's layout.
    assert of_type(frames, "provider_activity")[0]["files"] == ["README.md"]
    titles = [c["summary"] for c in of_type(frames, "tool_call")]
    assert titles == ["Edit docs/README.md", 'Search "TODO" in src', "Mystery"]


def test_a_row_goes_out_before_its_card_opens_and_before_it_closes() -> None:
    # O Chat makes a raw row (the command, a path) of a tool_call that comes before its row.
    frames = as_data(
        run([assistant(tool_use("t1", "Bash", command="ls /etc")), tool_result("t1", "ok")])
    )
    kinds = [f["type"] for f in frames if f["type"] not in ("provider_invocation", "run_result")]
    assert kinds == ["provider_activity", "tool_call", "provider_activity", "tool_result"]
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))


def test_a_follow_up_run_continues_the_work_room_numbers() -> None:
    frames = run(
        [assistant(tool_use("t1", "Read", file_path="a")), tool_result("t1", "ok")],
        context(revision_base=7, sequence_base=4),
    )
    assert [f["stateRevision"] for f in of_type(frames, "provider_invocation")] == [8, 9]
    assert {f["sequence"] for f in of_type(frames, "provider_activity")} == {5}
    translator = Translator(context(revision_base=7, sequence_base=4))
    assert (translator.revision, translator.activity_sequence) == (7, 4)
    translator.start(1000.0)
    translator.receive_data(assistant(tool_use("t1", "Read", file_path="a")), 1000.5)
    assert (translator.revision, translator.activity_sequence) == (8, 5)


def test_the_translator_tells_the_daemon_its_redactor_and_the_last_result_line() -> None:
    redactor = Redactor([secrets.token_hex(16)])
    translator = Translator(context(), redactor=redactor)
    assert translator.redactor is redactor
    assert translator.last_result is None
    translator.receive_data(init_line() + result_line("first") + result_line("second"), 1000.5)
    assert translator.last_result is not None
    assert translator.last_result.result == "second"


def test_a_failed_tool_result_carries_the_first_line_as_error() -> None:
    frames = run(
        [
            assistant(tool_use("t1", "Bash", command="false")),
            tool_result("t1", "\n  \nExit code 1\nmore", is_error=True),
        ]
    )
    done = of_type(frames, "tool_result")[0]
    assert (done["status"], done["error_type"], done["error"]) == (
        "failed",
        "tool_error",
        "Exit code 1",
    )
    empty = of_type(
        run([assistant(tool_use("t1", "Bash")), tool_result("t1", "", is_error=True)]),
        "tool_result",
    )[0]
    assert empty["error"] == "tool error"
    assert empty["result"] == "tool error"  # O Chat shows a card's result, not its error


def test_result_content_lists_and_images() -> None:
    parts = [
        {"type": "text", "text": "one"},
        {"type": "image", "source": {}},
        {"type": "text", "text": "two"},
    ]
    frames = run([assistant(tool_use("t1", "Read", file_path="/x.png")), tool_result("t1", parts)])
    assert of_type(frames, "tool_result")[0]["result"] == "one\n[image]\ntwo"
    frames = run([assistant(tool_use("t1", "Read")), tool_result("t1", None)])
    assert of_type(frames, "tool_result")[0]["result"] == ""


def test_permission_denied_closes_failed_with_the_reason_and_lists_the_denial() -> None:
    frames = run(
        [
            assistant(tool_use("t1", "Bash", command="touch x", token="s3cr3t")),
            system(
                "permission_denied",
                tool_name="Bash",
                tool_use_id="t1",
                message="needs approval: touch",
            ),
            tool_result("t1", "Permission denied long text", is_error=True),
            system(
                "permission_denied",
                tool_name="Write",
                tool_use_id="t9",
                decision_reason="denied",
            ),
            # The same denial said twice is listed once.
            system(
                "permission_denied",
                tool_name="Write",
                tool_use_id="t9",
                decision_reason="denied",
            ),
            system("permission_denied", tool_name="Write"),
            result_line(
                permission_denials=[
                    {"tool_name": "Bash", "tool_use_id": "t1", "tool_input": {}},
                    {"tool_name": "Edit", "tool_use_id": "t7", "tool_input": {"password": "p"}},
                ]
            ),
        ]
    )
    done = of_type(frames, "tool_result")[0]
    assert (done["status"], done["error_type"], done["error"]) == (
        "failed",
        "permission_denied",
        "needs approval: touch",
    )
    denials = as_data(frames)[-1]["result"]["permission_denials"]
    assert denials == [
        {
            "tool_id": "claude:t1",
            "name": "Bash",
            "input": {"command": "touch x", "token": "[redacted]"},
        },
        {"tool_id": "claude:t9", "name": "Write", "input": None},
        {"tool_id": "claude:t7", "name": "Edit", "input": {"password": "[redacted]"}},
    ]
    assert of_type(frames, "diagnostic") == [
        {**of_type(frames, "diagnostic")[0], "code": "malformed_line", "count": 1}
    ]


def test_a_denied_card_left_open_closes_as_denied() -> None:
    frames = run(
        [
            assistant(tool_use("t1", "Bash")),
            system("permission_denied", tool_use_id="t1"),
        ]
    )
    done = of_type(frames, "tool_result")[0]
    assert (done["error_type"], done["error"]) == ("permission_denied", "permission denied")


def test_repeated_tool_use_and_repeated_result() -> None:
    frames = run(
        [
            assistant(tool_use("t1", "Read")),
            assistant(tool_use("t1", "Read")),
            tool_result("t1"),
            tool_result("t1"),
        ]
    )
    assert len(of_type(frames, "tool_call")) == 1
    assert len(of_type(frames, "tool_result")) == 1
    assert of_type(frames, "diagnostic")[0]["code"] == "orphan_line"


def test_a_result_for_an_unknown_id_gets_a_synthetic_call_first() -> None:
    frames = as_data(run([tool_result("t5", "late")]))
    assert [f["type"] for f in frames[:4]] == [
        "provider_invocation",
        "diagnostic",
        "provider_activity",
        "tool_call",
    ]
    assert frames[3]["name"] == "Claude Code › unknown"
    assert [f["type"] for f in frames if f["type"] == "tool_result"] == ["tool_result"]


def test_assistant_text_is_a_bounded_redacted_message() -> None:
    text = "key sk-ant-api03-abcdefghijkl " + "x" * 20_000
    frames = run(
        [
            assistant(
                {"type": "text", "text": text},
                {"type": "thinking", "thinking": "hm"},
                {"type": "text", "text": ""},
            )
        ]
    )
    messages = of_type(frames, "provider_message")
    assert len(messages) == 1
    assert messages[0]["role"] == "assistant"
    assert len(messages[0]["text"]) <= 16_000
    assert "sk-ant" not in messages[0]["text"]
    plain = line(type="assistant", message={"content": "plain string"}, parent_tool_use_id=None)
    assert of_type(run([plain]), "provider_message")[0]["text"] == "plain string"
    empty = line(type="assistant", message={"content": ""})
    assert of_type(run([empty]), "provider_message") == []


def test_user_prompt_lines_and_other_blocks_are_ignored() -> None:
    frames = run(
        [
            line(type="user", message={"role": "user", "content": "do it"}),
            line(type="user", message={"content": [{"type": "text", "text": "hi"}]}),
        ]
    )
    kinds = [f["type"] for f in as_data(frames)]
    assert kinds == ["provider_invocation", "provider_invocation", "run_result"]


def test_args_are_redacted_and_bounded() -> None:
    frames = run(
        [
            assistant(
                tool_use(
                    "t1",
                    "Bash",
                    command="curl -H 'Authorization: Bearer abcdefghijk' x",
                    env={"API_KEY": "v"},
                )
            ),
            assistant(tool_use("t2", "Write", file_path=f"{CWD}/big", content="y" * 10_000)),
            assistant(tool_use("t3", "Write", **{f"k{i}": "z" * 200 for i in range(60)})),
            assistant(tool_use("t4", "Write", **{f"k{i}": i for i in range(2000)})),
            assistant(tool_use("t5", "Write", **{"k" * 5000: 1})),
        ],
        limits=Limits(items=5000),
    )
    calls = of_type(frames, "tool_call")
    assert calls[0]["args"] == {
        "command": "curl -H 'Authorization: Bearer [redacted]' x",
        "env": {"API_KEY": "[redacted]"},
    }
    assert "Bearer [redacted]" in calls[0]["summary"]
    for call in calls:
        from msgspec import json

        assert len(json.encode(call["args"])) <= 4096
    assert calls[3]["args"]["..."] == "[...1985 keys cut]"
    assert isinstance(calls[4]["args"], str)


def test_edit_and_write_results_carry_a_bounded_diff_and_files_changed() -> None:
    patch = [
        {
            "oldStart": 1,
            "oldLines": 1,
            "newStart": 1,
            "newLines": 1,
            "lines": ["-a", "+password=hunter2"],
        }
    ]
    frames = run(
        [
            assistant(tool_use("t1", "Edit", file_path=f"{CWD}/src/a.py")),
            tool_result(
                "t1", "ok", extra={"filePath": f"{CWD}/src/a.py", "structuredPatch": patch}
            ),
            assistant(tool_use("t2", "Write", file_path=f"{CWD}/new.txt", content="l1\nl2\n")),
            tool_result("t2", "ok", extra={"type": "create", "structuredPatch": []}),
            assistant(tool_use("t3", "MultiEdit", file_path="/elsewhere/b.py")),
            tool_result("t3", "ok", extra="not an object"),
            assistant(tool_use("t4", "Edit", file_path=f"{CWD}/failed.py")),
            tool_result("t4", "no", is_error=True),
            assistant(tool_use("t5", "NotebookEdit", notebook_path=f"{CWD}/n.ipynb")),
            tool_result("t5", "ok", extra={"type": "update"}),
            assistant(tool_use("t6", "Write", file_path=f"{CWD}/x", content=5)),
            tool_result("t6", "ok", extra={"type": "create", "structuredPatch": []}),
            assistant(tool_use("t7", "Edit")),
            tool_result("t7", "ok", extra={"structuredPatch": patch}),
        ]
    )
    results = of_type(frames, "tool_result")
    assert (
        results[0]["diff"]
        == "--- a/src/a.py\n+++ b/src/a.py\n@@ -1,1 +1,1 @@\n-a\n+password=[redacted]\n"
    )
    assert results[1]["diff"] == "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+l1\n+l2\n"
    assert "diff" not in results[2]
    assert "diff" not in results[4]
    assert "diff" not in results[5]
    assert "diff" not in results[6]
    final = as_data(frames)[-1]["result"]
    assert final["files_changed"] == ["src/a.py", "new.txt", "/elsewhere/b.py", "n.ipynb", "x"]


def test_summary_is_cut_at_240_characters() -> None:
    frames = run([assistant(tool_use("t1", "Bash", command="echo " + "a" * 1000))])
    assert 230 <= len(of_type(frames, "tool_call")[0]["summary"]) <= 240


def test_an_absurd_tool_name_is_bounded() -> None:
    frames = run([assistant(tool_use("t1", "X" * 5000))])
    assert len(of_type(frames, "tool_call")[0]["name"]) == len("Claude Code › ") + 128
