"""The terminal card board: frames in, text out, with a fixed clock and a recording console."""

from __future__ import annotations

import io

from rich.console import Console, RenderableType

from codelegate.daemon.cli import translate_stream
from codelegate.daemon.clients.board import (
    Board,
    CleanConsole,
    MultiBoard,
    spinner_frame,
    strip_controls,
)
from codelegate.translator.frames import (
    Frame,
    PermissionDenial,
    ProviderMessage,
    ToolCall,
    decode_frame,
)
from tests.conftest import REFERENCE

from .frames import SESSION, T0, Hostile, Script, subagent_run


def _text(*renderables: RenderableType) -> str:
    console = Console(record=True, width=100, color_system=None, file=io.StringIO())
    for renderable in renderables:
        console.print(renderable)
    return console.export_text()


def _feed_all(board: Board | MultiBoard, frames: list[Frame]) -> str:
    printed: list[RenderableType] = []
    for frame in frames:
        printed.extend(board.feed(frame))
    return _text(*printed)


def test_live_view_nests_subagent_cards_with_spinners_and_elapsed_time() -> None:
    board = Board()
    frames = subagent_run()
    for frame in frames[:5]:  # text, Task open, Read open under it, progress, subagent text
        board.feed(frame)
    now = T0 + 2.0
    spin = spinner_frame(now)
    assert _text(board.live(now)).splitlines() == [
        f"{spin} Explore the parser  1.8s  · 1 tools",
        "    The parser is small.",
        f"  {spin} Read src/parser.py  1.5s",
        f"{spin} Claude Code is working  1.9s",
    ]


def test_settled_output_reads_like_a_transcript() -> None:
    out = _feed_all(Board(cwd="/srv/my ws"), subagent_run())
    assert out.splitlines() == [
        "I'll look around first.",
        "✓ Explore the parser  2.8s  · 1 tools",
        "  ✓ Read src/parser.py  0.6s",
        "  ✓ Grep TODO  0.2s",
        "✗ Run: pytest -q  0.1s  permission_denied: Claude requested permissions to use Bash, but "
        "you haven't",
        "granted it yet.",
        "! 2 × unknown type",
        "Done: the parser has one TODO.",
        "─" * 100,
        "✓ completed  3.6s · 4 tools, 1 failed · $0.0123",
        "The parser has one TODO in src/parser.py.",
        "files changed: src/parser.py",
        "permission denied: Bash (claude:b1)",
        f"session {SESSION}",
        f"resume: codelegate run --cwd '/srv/my ws' --resume {SESSION} TASK",
    ]


def test_a_card_settles_only_when_its_subagent_cards_have() -> None:
    s = Script()
    board = Board()
    board.feed(s.call("claude:t", "Task", "Background agent", 0))
    board.feed(s.call("claude:c", "Read", "Read a.py", 0.1, parent="claude:t"))
    # The Task's own result can come while its subagent still works (background agents).
    assert board.feed(s.done("claude:t", "Task", 0.2, 100)) == []
    assert "Read a.py" in _text(board.live(T0 + 1))
    settled = _text(*board.feed(s.done("claude:c", "Read", 0.3, 50)))
    assert settled.splitlines() == ["✓ Background agent  0.1s", "  ✓ Read a.py  0.1s"]
    assert board.roots == []


def test_repeated_call_updates_and_orphan_result_still_renders() -> None:
    s = Script()
    board = Board()
    board.feed(s.call("claude:x", "Bash", "Run: make", 0))
    board.feed(s.call("claude:x", "Bash", "Run: make test", 0.5))
    assert len(board.cards) == 1
    assert _text(board.live(T0 + 1)).splitlines()[0].endswith("Run: make test  1.0s")
    orphan = _text(*board.feed(s.done("claude:y", "Write", 1, 5)))
    assert orphan.strip() == "✓ Write  0.0s"


def test_failed_run_and_open_cards_at_the_end() -> None:
    s = Script()
    board = Board()
    board.feed(s.call("claude:x", "Bash", "Run: sleep 100", 0))
    end = _text(*board.feed(s.result(65, status="timeout", error="run timed out", exit_code=143)))
    lines = end.splitlines()
    assert lines[0] == "… Run: sleep 100  0.0s"
    assert lines[2] == "✗ timeout  1m05s · exit 143"  # the CLI said no duration: the clock's
    assert lines[3] == "run timed out"
    assert "Claude Code is working" not in _text(board.live(T0 + 70))


def test_watch_all_puts_each_run_under_a_header() -> None:
    a, b = Script("run-a"), Script("run-b")
    board = MultiBoard()
    out = _feed_all(
        board,
        [
            a.call("claude:1", "Read", "Read a", 0),
            b.call("claude:1", "Read", "Read b", 0.1),
            a.done("claude:1", "Read", 0.2, 100),
            b.done("claude:1", "Read", 0.3, 200),
            b.result(0.4),
        ],
    )
    lines = out.splitlines()
    assert lines[0].startswith("run run-a ─")
    assert lines[1] == "✓ Read a  0.1s"
    assert lines[2].startswith("run run-b ─")
    assert lines[3] == "✓ Read b  0.2s"
    live = _text(board.live(T0 + 1))
    assert "run run-a" in live
    assert "run run-b" not in live  # finished runs leave the live view


def test_real_transcripts_settle_every_card() -> None:
    transcripts = sorted(REFERENCE.glob("*.jsonl"))
    assert len(transcripts) >= 4  # an empty glob must not pass
    for transcript in transcripts:
        out = io.BytesIO()
        with transcript.open("rb") as src:
            translate_stream(src, out, cwd="/srv/workspaces/demo", run_id="golden")
        frames = [decode_frame(line) for line in out.getvalue().splitlines()]
        board = Board()
        text = _feed_all(board, frames)
        assert board.roots == [], transcript.name
        assert board.result is not None
        calls = len({f.tool_id for f in frames if isinstance(f, ToolCall)})
        assert text.count("✓ ") + text.count("✗ ") == calls + 1, transcript.name
        # A streamed message is printed once, whole (partial.jsonl streams two).
        messages = [f for f in frames if isinstance(f, ProviderMessage)]
        printed = [_text(*Board().feed(f)) for f in messages]
        assert [p for p in printed if p] == [f"{f.text}\n" for f in messages if not f.partial]


def _terminal(*renderables: RenderableType) -> str:
    """What a colour terminal receives: the bytes of CleanConsole, styles and all."""
    out = io.StringIO()
    console = CleanConsole(file=out, force_terminal=True, color_system="truecolor", width=300)
    for renderable in renderables:
        console.print(renderable)
    return out.getvalue()


def test_escape_sequences_in_any_text_never_reach_the_terminal() -> None:
    evil = Hostile()
    s = Script()
    board = Board()
    printed: list[RenderableType] = []
    frames = [
        s.say(evil.payload("hello"), 0.1),
        s.call("claude:t", "Task", evil.payload("Explore"), 0.2),
        s.progress("claude:t", "Task", 0.3, elapsed_ms=100, summary=evil.payload("reading")),
        s.call("claude:r", evil.payload("Reader"), "", 0.4, parent="claude:t"),
        s.say(evil.payload("subagent"), 0.5, parent="claude:t"),
    ]
    live = ""
    for frame in frames:  # the live view after each frame: a note shows until the next one
        printed.extend(board.feed(frame))
        live += _terminal(board.live(T0 + 1))
    printed.extend(board.feed(s.done("claude:r", "Read", 0.6, 100)))
    printed.extend(board.feed(s.done("claude:t", "Task", 0.7, 500)))
    printed.extend(board.feed(s.call("claude:b", "Bash", "Run: ls", 0.8)))
    printed.extend(
        board.feed(
            s.done("claude:b", "Bash", 0.9, 10, error=evil.payload("boom"), error_type="timeout")
        )
    )
    printed.extend(
        board.feed(
            s.result(
                1.0,
                status="failed",
                error=evil.payload("failed"),
                result=evil.payload("answer"),
                files_changed=[evil.payload("notes.txt")],
                permission_denials=[PermissionDenial(tool_id="b", name=evil.payload("Bash"))],
            )
        )
    )
    settled = _terminal(*printed, evil.payload("a note"))

    assert evil.leaks(live) == []
    assert evil.leaks(settled) == []
    for word in ("hello", "Explore", "reading", "Reader", "subagent"):
        assert word in live + settled
    for word in ("boom", "failed", "answer", "notes.txt", "Bash", "a note"):
        assert word in settled


def test_the_plain_rich_console_would_pass_the_escapes_through() -> None:
    # Why CleanConsole exists: rich prints ESC, BEL and C1 as given.
    evil = Hostile()
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor").print(evil.payload("x"))
    assert evil.leaks(out.getvalue()) != []


def test_stripping_keeps_newlines_tabs_and_ordinary_unicode() -> None:
    text = "line one\n\tindented · ✓ héllo שלום 日本"
    assert strip_controls(text) == text
    assert strip_controls("a\x1b]52;c;unterminated") == "a"
    assert strip_controls("a\x1b[1;31mb\x1b") == "ab"


def test_resume_hint_names_the_workspace_and_only_follows_a_real_session() -> None:
    s = Script()
    refused_early = s.result(0.5, status="failed", error="claude: not found")
    out = _feed_all(Board(cwd="/srv/ws"), [refused_early])
    assert "resume" not in out  # the CLI never started: there is no session to resume
    assert SESSION not in out
    s = Script()
    spoke = [s.say("Looking.", 0.2), s.result(0.5, status="cancelled")]
    out = _feed_all(Board(cwd="/srv/ws"), spoke)
    assert f"resume: codelegate run --cwd /srv/ws --resume {SESSION} TASK" in out
    assert "resume:" not in _feed_all(Board(), spoke)  # the workspace unknown: no hint to paste


def test_a_run_lasts_until_its_background_subagents_end_and_counts_from_its_start() -> None:
    s = Script()
    board = Board(started=T0 - 3)  # posted 3 s before the CLI's first line
    assert _text(board.live(T0 - 1)).strip().endswith("Claude Code is working  2.0s")
    frames = [
        s.call("claude:t", "Task", "Background agent", 0),
        s.done("claude:t", "Task", 0.5, 500),  # the Task returns at once: it runs in background
        s.result(10.0, duration_ms=1600),  # the CLI's own duration ends with its main loop
    ]
    out = _feed_all(board, frames)
    assert "✓ completed  13.0s" in out
    assert "✓ completed  1.6s" not in out
    late = Board()  # nothing known yet: the timer starts when the client first draws
    late.live(T0)
    assert _text(late.live(T0 + 2.5)).strip().endswith("working  2.5s")


def test_open_cards_stay_as_they_stand_when_the_client_leaves() -> None:
    s = Script()
    board = Board()
    assert board.open_cards() is None
    board.feed(s.call("claude:b", "Bash", "Run: make test", 0))
    left = board.open_cards()
    assert left is not None
    assert _text(left).strip() == "… Run: make test  0.0s"
