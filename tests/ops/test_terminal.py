"""``codelegate run`` / ``watch`` against the stand-in daemon: what is drawn, what is sent."""

from __future__ import annotations

import argparse
import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from rich.console import Console

from codelegate.daemon.clients import terminal
from codelegate.daemon.clients.terminal import EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, Renderer
from codelegate.translator.frames import Frame, encode_frame

from .conftest import FakeDaemon
from .frames import RUN, SESSION, T0, Hostile, Script, subagent_run


def _console() -> Console:
    return Console(record=True, width=100, color_system=None, file=io.StringIO())


def _run_args(socket: str, **extra: Any) -> argparse.Namespace:
    args = {"task": "fix it", "cwd": "/srv/ws", "mode": None, "resume": None, "model": None}
    return argparse.Namespace(socket=socket, **{**args, **extra})


def _accept() -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"run_id": RUN, "status": "running"}, status=202)

    return handler


def _stream(*batches: list[Frame], hold: asyncio.Event | None = None) -> Any:
    """An events endpoint answering the n-th request with the n-th batch of frames."""
    calls = iter(batches)

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        batch = next(calls)
        for frame in batch:
            if hold is not None and frame.seq == batch[-1].seq and len(batch) > 1:
                await hold.wait()  # the last frames wait for the test (e.g. for a cancel)
            await response.write(encode_frame(frame) + b"\n")
        await response.write_eof()
        return response

    return handler


async def test_run_draws_the_cards_and_the_result(fake_daemon: FakeDaemon) -> None:
    fake_daemon.post_run = _accept()
    fake_daemon.events = _stream(subagent_run())
    console = _console()

    code = await terminal.run_async(
        _run_args(fake_daemon.socket, mode="accept_edits", resume=SESSION),
        Renderer(console, json_out=None, many=False),
        interrupt=asyncio.Event(),
    )

    assert code == EXIT_OK
    text = console.export_text()
    assert f"run {RUN} · /srv/ws" in text
    assert "  ✓ Read src/parser.py  0.6s" in text
    assert "✓ completed" in text
    assert f"session {SESSION}" in text
    body = fake_daemon.requests[0][2]
    assert body == {
        "task": "fix it",
        "cwd": "/srv/ws",
        "mode": "accept_edits",
        "resume": SESSION,
        "wait": False,
    }
    assert fake_daemon.requests[1][1] == f"/v1/runs/{RUN}/events?after=0"


async def test_json_prints_the_frames_as_ndjson(fake_daemon: FakeDaemon) -> None:
    fake_daemon.post_run = _accept()
    frames = subagent_run()
    fake_daemon.events = _stream(frames)
    out = io.BytesIO()

    code = await terminal.run_async(
        _run_args(fake_daemon.socket),
        Renderer(_console(), json_out=out, many=False),
        interrupt=asyncio.Event(),
    )

    assert code == EXIT_OK
    assert out.getvalue() == b"".join(encode_frame(f) + b"\n" for f in frames)


async def test_a_dropped_stream_is_resumed_after_the_last_seq(fake_daemon: FakeDaemon) -> None:
    fake_daemon.post_run = _accept()
    frames = subagent_run()
    fake_daemon.events = _stream(frames[:4], frames[4:])
    console = _console()

    code = await terminal.run_async(
        _run_args(fake_daemon.socket),
        Renderer(console, json_out=None, many=False),
        interrupt=asyncio.Event(),
    )

    assert code == EXIT_OK
    paths = [path for method, path, _ in fake_daemon.requests if method == "GET"]
    assert paths == [f"/v1/runs/{RUN}/events?after=0", f"/v1/runs/{RUN}/events?after=4"]
    assert console.export_text().count("✓ Explore the parser") == 1


async def test_ctrl_c_cancels_the_run_and_exits_130(fake_daemon: FakeDaemon) -> None:
    s = Script()
    fake_daemon.post_run = _accept()
    fake_daemon.events = _stream(
        [
            s.call("claude:b", "Bash", "Run: sleep 100", 0),
            s.done("claude:b", "Bash", 5, 5000, error="cancelled", error_type="cancelled"),
            s.result(5.1, status="cancelled"),
        ],
        hold=fake_daemon.cancel_seen,
    )
    console = _console()
    interrupt = asyncio.Event()

    class FirstFrame(Renderer):
        def line(self, raw: bytes, frame: Frame | None) -> None:
            super().line(raw, frame)
            interrupt.set()  # Ctrl-C as soon as the first card is up

    code = await terminal.run_async(
        _run_args(fake_daemon.socket),
        FirstFrame(console, json_out=None, many=False),
        interrupt=interrupt,
    )

    assert code == EXIT_INTERRUPTED
    assert fake_daemon.cancelled == [RUN]
    text = console.export_text()
    assert "cancelling the run" in text
    assert "✗ Run: sleep 100" in text


async def test_refusal_is_reported(fake_daemon: FakeDaemon) -> None:
    async def refuse(request: web.Request) -> web.StreamResponse:
        error = {"error": {"code": "mode_not_allowed", "message": "auto is not enabled"}}
        return web.json_response(error, status=403)

    fake_daemon.post_run = refuse
    console = _console()
    code = await terminal.run_async(
        _run_args(fake_daemon.socket, mode="auto"),
        Renderer(console, json_out=None, many=False),
        interrupt=asyncio.Event(),
    )
    assert code == EXIT_REFUSED
    assert "refused: mode_not_allowed: auto is not enabled" in console.export_text()


async def test_watch_follows_one_run_to_its_end(fake_daemon: FakeDaemon) -> None:
    fake_daemon.events = _stream(subagent_run())
    fake_daemon.states[RUN] = {"cwd": "/srv/ws", "created_at": T0 - 10}
    console = _console()
    code = await terminal.watch_async(
        argparse.Namespace(socket=fake_daemon.socket, run=RUN, all=False),
        Renderer(console, json_out=None, many=False),
        interrupt=asyncio.Event(),
    )
    assert code == EXIT_OK
    text = console.export_text()
    assert "✓ completed  13.6s" in text  # from the run's creation, not its first frame
    assert f"resume: codelegate run --cwd /srv/ws --resume {SESSION} TASK" in text
    assert fake_daemon.cancelled == []


async def test_watch_of_an_unknown_run_says_so(fake_daemon: FakeDaemon) -> None:
    with pytest.raises(terminal.DaemonError, match="run_not_found"):
        await terminal.watch_async(
            argparse.Namespace(socket=fake_daemon.socket, run="nope", all=False),
            Renderer(_console(), json_out=None, many=False),
            interrupt=asyncio.Event(),
        )


async def test_ctrl_c_in_watch_keeps_the_cards_it_showed(fake_daemon: FakeDaemon) -> None:
    s = Script()
    fake_daemon.states[RUN] = {"cwd": "/srv/ws", "created_at": T0}
    never = asyncio.Event()
    fake_daemon.events = _stream(
        [s.call("claude:b", "Bash", "Run: make test", 0), s.result(1)], hold=never
    )
    console = _console()
    interrupt = asyncio.Event()

    class FirstFrame(Renderer):
        def line(self, raw: bytes, frame: Frame | None) -> None:
            super().line(raw, frame)
            interrupt.set()  # Ctrl-C once the card is up

    code = await terminal.watch_async(
        argparse.Namespace(socket=fake_daemon.socket, run=RUN, all=False),
        FirstFrame(console, json_out=None, many=False),
        interrupt=interrupt,
    )
    assert code == EXIT_OK
    assert "… Run: make test" in console.export_text()
    assert fake_daemon.cancelled == []  # watching never cancels


def test_unreachable_daemon_and_usage(short_dir: Path) -> None:
    missing = str(short_dir / "missing.sock")
    assert terminal.run_main(["hello", "--socket", missing]) == terminal.EXIT_UNREACHABLE
    assert terminal.watch_main(["some-run", "--socket", missing]) == terminal.EXIT_UNREACHABLE
    assert terminal.main([]) == EXIT_REFUSED


async def test_watch_all_follows_every_run_over_the_websocket(fake_daemon: FakeDaemon) -> None:
    a, b = Script("run-a"), Script("run-b")
    fake_daemon.ws_frames = [
        a.call("claude:1", "Read", "Read a", 0),
        b.call("claude:1", "Read", "Read b", 0.1),
        a.done("claude:1", "Read", 0.2, 100),
        b.done("claude:1", "Read", 0.3, 200),
    ]
    console = _console()
    # The stand-in closes the WebSocket as a stopping daemon does (1001): watching does not end
    # quietly with 0, it says so and exits 3 (terminal.main, as a user starts it).
    with pytest.raises(terminal.DaemonError, match=r"daemon_gone.*it is stopping"):
        await terminal.watch_async(
            argparse.Namespace(socket=fake_daemon.socket, run=None, all=True),
            Renderer(console, json_out=None, many=True),
            interrupt=asyncio.Event(),
        )
    code = await asyncio.to_thread(terminal.main, ["watch", "--socket", fake_daemon.socket])
    assert code == terminal.EXIT_UNREACHABLE
    assert fake_daemon.ws_query == {"run": "*"}
    text = console.export_text()
    assert "run run-a" in text
    assert "✓ Read b  0.2s" in text


async def test_watch_and_run_print_no_escape_sequence_a_frame_or_an_error_carries(
    fake_daemon: FakeDaemon, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole client as a user starts it (terminal.main: its own console, a colour terminal,
    # the Live view), in a thread so that the stand-in daemon keeps serving on this loop.
    monkeypatch.setenv("FORCE_COLOR", "1")
    evil = Hostile()
    s = Script()
    fake_daemon.events = _stream(
        [
            s.say(evil.payload("hello"), 0.1),
            s.call("claude:r", "Read", evil.payload("Read notes.txt"), 0.2),
            s.done("claude:r", "Read", 0.3, 100, error=evil.payload("gone"), error_type="timeout"),
            s.result(0.4, result=evil.payload("answer"), files_changed=[evil.payload("a.txt")]),
        ]
    )

    async def refuse(request: web.Request) -> web.StreamResponse:
        error = {"error": {"code": "bad_request", "message": evil.payload("no such dir")}}
        return web.json_response(error, status=400)

    fake_daemon.post_run = refuse
    fake_daemon.states[RUN] = {"cwd": evil.payload("/srv/ws"), "created_at": T0}

    watched = await asyncio.to_thread(terminal.main, ["watch", RUN, "--socket", fake_daemon.socket])
    refused = await asyncio.to_thread(
        terminal.main, ["run", "x", "--cwd", "/", "--socket", fake_daemon.socket]
    )

    out = capsys.readouterr().out
    assert (watched, refused) == (EXIT_OK, EXIT_REFUSED)
    assert evil.leaks(out) == []
    for word in ("hello", "Read notes.txt", "gone", "answer", "a.txt", "no such dir"):
        assert word in out


async def test_no_text_of_the_daemon_a_run_or_the_config_is_read_as_markup(
    fake_daemon: FakeDaemon, capsys: pytest.CaptureFixture[str], short_dir: Path
) -> None:
    # rich takes "[word]" for a style tag and drops it ("[server] allowed_gids" lost its
    # "[server]"), and an unmatched "[/]" raises: the socket's path (config, environment,
    # --socket), the daemon's errors and every text of a run are shown as they are.
    loud, link = "[bold red]loud[/]", "[link=https://example.invalid]here[/link]"
    s = Script()
    fake_daemon.events = _stream(
        [
            s.say(f"say {loud}", 0.1),
            s.call("claude:r", "Read", f"Read {link}", 0.2),
            s.done("claude:r", "Read", 0.3, 100, error="[/] gone", error_type="timeout"),
            s.result(0.4, result="answer [server]", files_changed=["[x].txt"]),
        ]
    )

    async def refuse(request: web.Request) -> web.StreamResponse:
        error = {"error": {"code": "bad_request", "message": "set [server] allowed_gids"}}
        return web.json_response(error, status=400)

    fake_daemon.post_run = refuse
    fake_daemon.states[RUN] = {"cwd": "/srv/[ws]", "created_at": T0}
    other = Script("[bold]other-run")
    fake_daemon.ws_frames = [
        other.call("claude:1", "Read", "Read b", 0),
        other.done("claude:1", "Read", 0.1, 100),
    ]
    missing = str(short_dir / "[server]" / "d.sock")

    codes = [
        await asyncio.to_thread(terminal.main, ["watch", RUN, "--socket", fake_daemon.socket]),
        await asyncio.to_thread(terminal.main, ["run", "x", "--socket", fake_daemon.socket]),
        await asyncio.to_thread(terminal.main, ["watch", "--socket", fake_daemon.socket]),
        await asyncio.to_thread(terminal.main, ["run", "x", "--socket", missing]),
    ]

    out = capsys.readouterr().out
    assert codes == [EXIT_OK, EXIT_REFUSED, terminal.EXIT_UNREACHABLE, terminal.EXIT_UNREACHABLE]
    for shown in (
        f"say {loud}",
        f"Read {link}",
        "[/] gone",
        "answer [server]",
        "files changed: [x].txt",
        "--cwd '/srv/[ws]'",
        "refused: bad_request: set [server] allowed_gids",
        "run [bold]other-run",
        f"no daemon on {missing}",
    ):
        assert shown in out


def test_a_question_without_live_goes_to_stderr_as_plain_text_on_the_reply_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # stdout piped (no Live), stdin a terminal: the question goes where the user reads, with the
    # reply typed after it, "[y]es" as it is and nothing of the model's escapes.
    evil = Hostile()
    renderer = Renderer(_console(), json_out=None, many=False)
    renderer.question(f"Bash: {evil.payload('ls')} · here\n  [y]es / [n]o — expires in 5 s: ")
    err = capsys.readouterr().err
    assert err.endswith("\n  [y]es / [n]o — expires in 5 s: ")
    assert "ls" in err
    assert evil.leaks(err) == []


async def test_a_task_with_a_byte_that_is_not_utf8_is_refused_here_and_posts_nothing(
    fake_daemon: FakeDaemon,
) -> None:
    # printf 'x \x9b y' as argv: Python hands it over as a lone surrogate.
    task = b"fix \x9b it".decode("utf-8", "surrogateescape")
    console = _console()
    code = await terminal.run_async(
        _run_args(fake_daemon.socket, task=task),
        Renderer(console, json_out=None, many=False),
        interrupt=asyncio.Event(),
    )
    assert code == EXIT_REFUSED
    assert "refused: the task is not valid UTF-8" in console.export_text()
    assert fake_daemon.post_run is None  # unscripted: a POST would have been answered 500
