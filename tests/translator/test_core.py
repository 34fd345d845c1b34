"""The card state machine, rule by rule (DESIGN "Frames", "Stream facts", card invariants)."""

from __future__ import annotations

from typing import Any

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
    tool_result,
    tool_use,
)
from translator import Limits, Outcome, Translator
from translator.frames import ToolCall

ID_RE = r"^[A-Za-z0-9._:-]{1,512}$"


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
                tool_use("t1", "Edit", file_path=f"{CWD}/README.md", old_string="a", new_string="b")
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
            2,
            "file_change",
            "completed",
            "Update workspace files",
            "Workspace files updated",
        ),
        (
            "claude:t2",
            1,
            "search",
            "running",
            "Search for context",
            "Searching for relevant context",
        ),
        ("claude:t2", 2, "search", "failed", "Search for context", "Context search failed"),
        ("claude:t3", 1, "tool", "running", "Use a provider tool", "Using a provider tool"),
        ("claude:t3", 2, "tool", "failed", "Use a provider tool", "Provider tool failed"),
    ]
    assert of_type(frames, "provider_activity")[0]["files"] == ["README.md"]
    titles = [c["summary"] for c in of_type(frames, "tool_call")]
    assert titles == ["Edit README.md", 'Search "TODO" in src', "Mystery"]


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
            line(
                type="system",
                subtype="permission_denied",
                tool_name="Bash",
                tool_use_id="t1",
                message="needs approval: touch",
            ),
            tool_result("t1", "Permission denied long text", is_error=True),
            line(
                type="system",
                subtype="permission_denied",
                tool_name="Write",
                tool_use_id="t9",
                decision_reason="denied",
            ),
            line(type="system", subtype="permission_denied", tool_name="Write"),
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
            line(type="system", subtype="permission_denied", tool_use_id="t1"),
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
        "tool_call",
        "provider_activity",
    ]
    assert frames[2]["name"] == "Claude Code › unknown"
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


def test_subagent_lines_carry_parent_tool_id() -> None:
    frames = run(
        [
            assistant(tool_use("task", "Agent", description="Look around")),
            assistant(tool_use("t1", "Read", file_path=f"{CWD}/a"), parent="task"),
            assistant({"type": "text", "text": "sub says"}, parent="task"),
            tool_result("t1", parent="task"),
            tool_result("task", "report"),
        ]
    )
    calls = of_type(frames, "tool_call")
    assert calls[0]["summary"] == "Agent: Look around"
    assert calls[1]["parent_tool_id"] == "claude:task"
    assert of_type(frames, "provider_message")[0]["parent_tool_id"] == "claude:task"
    assert of_type(frames, "tool_result")[0]["parent_tool_id"] == "claude:task"
    assert of_type(frames, "tool_result")[1]["result"] == "report"


def test_subagent_lines_before_their_task_are_held_then_shown() -> None:
    early = [
        assistant(tool_use("t1", "Read"), parent="task"),
        tool_result("t1", parent="task"),
    ]
    frames = as_data(
        run([*early, assistant(tool_use("task", "Agent"))], context(parent_tool_call_id=None))
    )
    assert [(f["type"], f.get("tool_id")) for f in frames[:-1]] == [
        ("tool_call", "claude:task"),
        ("tool_call", "claude:t1"),
        ("tool_result", "claude:t1"),
        ("tool_result", "claude:task"),
    ]


def test_held_lines_are_bounded_and_never_dropped() -> None:
    early = [assistant(tool_use(f"t{i}", "Read"), parent="task") for i in range(4)]
    frames = run(early, context(parent_tool_call_id=None), limits=Limits(held_lines=2))
    calls = of_type(frames, "tool_call")
    assert [c["tool_id"] for c in calls] == ["claude:t2", "claude:t3", "claude:t0", "claude:t1"]
    assert all(c["parent_tool_id"] == "claude:task" for c in calls)
    user = tool_result("t9", parent="other")
    frames = run([user, *early], context(parent_tool_call_id=None), limits=Limits(held_lines=1))
    assert len(of_type(frames, "tool_result")) == 5


def test_background_subagent_stays_open_until_its_notification() -> None:
    launched = {"status": "async_launched", "agentId": "a1"}
    frames = run(
        [
            assistant(tool_use("task", "Agent", description="bg")),
            line(
                type="system",
                subtype="task_started",
                task_id="a1",
                tool_use_id="task",
                task_type="local_agent",
            ),
            tool_result("task", "Async agent launched", extra=launched),
            line(
                type="system",
                subtype="task_progress",
                task_id="a1",
                description="Reading",
                usage={"total_tokens": 9, "tool_uses": 1, "duration_ms": 50},
                last_tool_name="Read",
            ),
            line(type="system", subtype="task_progress", task_id="a1"),
            result_line("first"),
            line(
                type="system", subtype="task_updated", task_id="a1", patch={"status": "completed"}
            ),
            line(type="system", subtype="task_updated", task_id="a1", patch={"end_time": 5}),
            line(
                type="system",
                subtype="task_notification",
                task_id="a1",
                tool_use_id="task",
                status="completed",
                summary="all good",
            ),
            line(
                type="system",
                subtype="task_notification",
                task_id="a1",
                tool_use_id="task",
                status="completed",
            ),
            init_line(),
            result_line("second"),
        ]
    )
    progress = of_type(frames, "tool_progress")
    assert [p.get("summary") for p in progress] == ["Running in the background", "Reading", None]
    assert (progress[1]["tool_uses"], progress[1]["total_tokens"], progress[1]["elapsed_ms"]) == (
        1,
        9,
        50,
    )
    results = of_type(frames, "tool_result")
    assert [(r["tool_id"], r["status"], r["result"]) for r in results] == [
        ("claude:task", "completed", "all good")
    ]
    assert as_data(frames)[-1]["result"]["result"] == "second"


def test_background_subagent_failures_and_a_missing_notification() -> None:
    def scenario(*tail: bytes) -> dict[str, Any]:
        frames = run(
            [
                assistant(tool_use("task", "Task")),
                tool_result("task", "launched", extra={"status": "async_launched"}),
                *tail,
            ]
        )
        return of_type(frames, "tool_result")[0]

    failed = scenario(
        line(type="system", subtype="task_notification", tool_use_id="task", status="failed")
    )
    assert (failed["status"], failed["error_type"], failed["error"]) == (
        "failed",
        "tool_error",
        "subagent failed",
    )
    stopped = scenario(
        line(type="system", subtype="task_notification", tool_use_id="task", status="stopped")
    )
    assert stopped["error_type"] == "cancelled"
    ended = scenario(
        line(type="system", subtype="task_started", task_id="k", tool_use_id="task"),
        line(type="system", subtype="task_updated", task_id="k", patch={"status": "completed"}),
    )
    assert ended["status"] == "completed"
    unknown = scenario(
        line(type="system", subtype="task_notification", tool_use_id="task", status="weird")
    )
    assert (unknown["status"], unknown["error_type"]) == ("failed", "interrupted")


def test_bash_tasks_and_foreground_subagents_close_on_their_tool_result_only() -> None:
    frames = run(
        [
            assistant(tool_use("b", "Bash", command="sleep 3")),
            line(
                type="system",
                subtype="task_started",
                task_id="k",
                tool_use_id="b",
                task_type="local_bash",
            ),
            line(
                type="system",
                subtype="task_notification",
                task_id="k",
                tool_use_id="b",
                status="completed",
            ),
            line(type="system", subtype="task_updated", task_id="k", patch={"status": "completed"}),
            tool_result("b", "done"),
            line(
                type="system",
                subtype="task_notification",
                task_id="k",
                tool_use_id="b",
                status="completed",
            ),
            assistant(tool_use("a", "Agent")),
            tool_result("a", "report", extra={"status": "completed"}),
        ]
    )
    results = of_type(frames, "tool_result")
    assert [(r["tool_id"], r["result"]) for r in results] == [
        ("claude:b", "done"),
        ("claude:a", "report"),
    ]


def test_tool_progress_lines_and_heartbeats() -> None:
    frames = run(
        [
            assistant(tool_use("b", "Bash")),
            line(type="tool_progress", tool_use_id="b", tool_name="Bash", elapsed_time_seconds=2.5),
            line(
                type="tool_progress",
                tool_use_id="b-heartbeat-0",
                parent_tool_use_id="b",
                elapsed_time_seconds=30,
            ),
            line(
                type="tool_progress",
                tool_use_id="hook-x",
                parent_tool_use_id=None,
                elapsed_time_seconds=1,
            ),
        ]
    )
    assert [p["elapsed_ms"] for p in of_type(frames, "tool_progress")] == [2500, 30000]


def test_stream_events_never_make_duplicate_cards() -> None:
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
            assistant(tool_use("t1", "Read")),
            event,
            line(type="rate_limit_event", rate_limit_info={}),
        ]
    )
    assert len(of_type(frames, "tool_call")) == 1
    assert of_type(frames, "diagnostic") == []


def test_bad_input_becomes_diagnostics_with_counts_never_content() -> None:
    bad = [
        b"{not json\n",
        b"[1, 2, 3]\n",
        b"\xff\xfe garbage\n",
        b'{"type": "brand_new", "secret": "sk-ant-api03-zzzzzzzzzz"}\n',
        line(type="system", subtype="brand_new_subtype"),
        line(type="assistant"),
        line(type="keep_alive"),
        b'{"no_type": 1}\n',
        line(type="system", subtype="status"),
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
    assert isinstance(frames[1], ToolCall)


def test_summary_is_cut_at_240_characters() -> None:
    frames = run([assistant(tool_use("t1", "Bash", command="echo " + "a" * 1000))])
    assert 230 <= len(of_type(frames, "tool_call")[0]["summary"]) <= 240


def test_odd_shapes_in_system_lines_are_tolerated() -> None:
    frames = run(
        [
            assistant(tool_use("t1", "Agent")),
            tool_result("t1", "launched", extra={"status": "async_launched"}),
            line(
                type="system", subtype="task_progress", tool_use_id="t1", usage=[1], description=5
            ),
            line(type="system", subtype="task_updated", tool_use_id="t1", patch="done"),
            line(type="system", subtype="task_updated", tool_use_id="t1", patch=None),
            line(type="system", subtype="task_notification", tool_use_id=7, status="completed"),
        ]
    )
    progress = of_type(frames, "tool_progress")
    assert progress[-1].get("summary") is None
    assert of_type(frames, "tool_result")[0]["error_type"] == "interrupted"


def test_a_lone_newline_chunk() -> None:
    translator = Translator(context(parent_tool_call_id=None))
    assert translator.receive_data(b"\n", 1.0) == []
    assert translator.receive_data(b"\n\n", 1.0) == []


def test_an_absurd_tool_name_is_bounded() -> None:
    frames = run([assistant(tool_use("t1", "X" * 5000))])
    assert len(of_type(frames, "tool_call")[0]["name"]) == len("Claude Code › ") + 128


def test_a_bad_line_sends_its_chunk_line_by_line_with_the_same_outcome() -> None:
    lines = [line(type="system", subtype="status"), b"{bad\n", assistant(tool_use("t1", "Read"))]
    frames = run([b"".join(lines)])
    assert [f["type"] for f in of_type(frames, "tool_call")] == ["tool_call"]
    assert of_type(frames, "diagnostic")[0]["code"] == "malformed_line"
