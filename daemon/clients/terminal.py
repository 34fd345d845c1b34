"""``codelegate run`` and ``codelegate watch``: a terminal Agent IO client.

``run`` posts a task, then follows the run's NDJSON event stream and draws its cards live
(daemon/clients/board.py does the drawing); Ctrl-C cancels the run and exits 130, and so do
SIGHUP and SIGTERM (exit 129, 143): a closed terminal leaves no run going unattended. A request
for approval is asked in the terminal (daemon/clients/terminal_ask.py). ``watch RUN``
follows a run already started; ``watch --all`` follows every run over the WebSocket. ``--json``
prints the frames themselves, one per line. The daemon is found through ``--socket``, else
``$CODELEGATE_SOCKET``, else the socket ``make run`` serves (``tool.state_dir()``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import IO, Any, Final

import aiohttp
import msgspec
from rich.console import Console, RenderableType
from rich.live import Live

from codelegate.daemon.clients.board import Board, CleanConsole, MultiBoard
from codelegate.daemon.clients.terminal_ask import Approvals, Ask, Post, terminal_asker
from codelegate.daemon.clients.tool import socket_path, unreachable
from codelegate.policy.codes import HTTP_ERROR
from codelegate.translator.frames import Frame, RunResult, decode_frame

BASE: Final = "http://codelegate"  # the host is a placeholder: the connector picks the socket
EXIT_OK: Final = 0
EXIT_RUN_FAILED: Final = 1
EXIT_REFUSED: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_INTERRUPTED: Final = 130
# A stream that ends without run_result (the daemon dropped a lagging subscriber, or restarted)
# is resumed from the last seq; this many ends in a row without progress and we give up.
_MAX_RESUMES: Final = 5
# After Ctrl-C, how long to keep drawing while the daemon winds the run down.
_CANCEL_WAIT_S: Final = 30.0
# The signals that end ``run`` by cancelling its run first (``watch`` just stops following).
_ENDING_SIGNALS: Final = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)
# What an argv byte the locale cannot decode becomes (surrogateescape).
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class _Head(msgspec.Struct):
    """Enough of any frame to resume a stream, even one of a type this client does not know."""

    seq: int = 0


_head_decoder: Final = msgspec.json.Decoder(_Head)


class DaemonError(Exception):
    """The daemon answered with an error object (or not at all)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code


class Renderer:
    """Where frames go: cards drawn on a console, or raw NDJSON lines (``--json``)."""

    def __init__(self, console: Console, *, json_out: IO[bytes] | None, many: bool) -> None:
        self.console = console
        self.json_out = json_out
        self.board: Board | MultiBoard = MultiBoard() if many else Board()
        self._live: Live | None = None
        # Questions go where the user reads: stderr unless Live draws on this console.
        self._stderr = console if console.stderr else CleanConsole(stderr=True, highlight=False)
        # The terminal went away (after SIGHUP every write fails with EIO): nothing more is
        # drawn, and the client still cancels its run and gives its exit status.
        self._gone = False

    def __enter__(self) -> Renderer:
        if self.json_out is None and self.console.is_terminal:
            self._live = Live(
                _LiveView(self.board),
                console=self.console,
                refresh_per_second=10,
                transient=True,
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            try:
                self._live.stop()  # transient: the live region goes...
            except OSError:
                self._gone = True
        if self.json_out is None:
            # ...and what was still open stays on screen as it stood (Ctrl-C in watch, a lost
            # daemon); without a terminal, this is the only time open cards are printed at all.
            boards = (
                self.board.boards.values() if isinstance(self.board, MultiBoard) else [self.board]
            )
            for board in boards:
                cards = board.open_cards()
                if cards is not None:
                    self._print(self.console, cards)

    def line(self, raw: bytes, frame: Frame | None) -> None:
        """One NDJSON line from the daemon, and the frame in it when this client knows its type."""
        if self.json_out is not None:
            self.json_out.write(raw.rstrip(b"\n") + b"\n")
            self.json_out.flush()
            return
        if frame is not None:
            for renderable in self.board.feed(frame):
                self._print(self.console, renderable)

    def note(self, message: str, style: str = "dim") -> None:
        """A message of this client's own (stderr when stdout carries NDJSON)."""
        self._print(self.console, message, style=style, markup=False, highlight=False)

    def question(self, text: str) -> None:
        """An approval's question, as plain text: "[y]es" is no markup, its summary is the
        model's words. Printed through rich either way: while Live draws, sys.stderr is its
        proxy, which prints an unfinished line as markup (and "[y]es" as "es")."""
        if self._live is not None:  # above the live region, as a whole line
            self._print(self.console, text, markup=False, highlight=False)
        else:  # the reply is typed after it, on the same line
            self._print(self._stderr, text, markup=False, highlight=False, end="")

    def _print(self, console: Console, *objects: Any, **options: Any) -> None:
        if self._gone:
            return
        try:
            console.print(*objects, **options)
        except OSError:
            self._gone = True


class _LiveView:
    """Re-rendered by rich.Live at each refresh, with the clock of that moment."""

    def __init__(self, board: Board | MultiBoard) -> None:
        self.board = board

    def __rich__(self) -> RenderableType:
        return self.board.live(time.time())


def _session(path: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=path),
        # No total timeout: a run lasts as long as it lasts (the daemon bounds it).
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
    )


async def _error_of(response: aiohttp.ClientResponse) -> DaemonError:
    try:
        error = (await response.json(content_type=None))["error"]
        return DaemonError(response.status, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError, aiohttp.ClientError):
        return DaemonError(response.status, HTTP_ERROR, f"HTTP {response.status}")


async def start_run(http: aiohttp.ClientSession, body: dict[str, Any]) -> str:
    """POST the run (without waiting) and return its id."""
    async with http.post(f"{BASE}/v1/runs", json={**body, "wait": False}) as response:
        if response.status != 202:
            raise await _error_of(response)
        return str((await response.json())["run_id"])


async def cancel(http: aiohttp.ClientSession, run_id: str) -> None:
    """Ask the daemon to cancel; a run that already ended (409) is fine too."""
    async with http.post(f"{BASE}/v1/runs/{run_id}/cancel") as response:
        if response.status not in (202, 409):
            raise await _error_of(response)


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    # Split by hand: aiohttp's readline caps a line at its buffer limit, and a run_result
    # frame may be up to the final-result bound (64 KiB by default, more if configured).
    pending = b""
    async for chunk in response.content.iter_any():
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


async def follow(
    http: aiohttp.ClientSession, run_id: str, sink: Callable[[bytes, Frame | None], None]
) -> RunResult:
    """Replay and follow one run's frames until its run_result, resuming dropped streams."""
    after = 0
    idle_ends = 0
    while True:
        async with http.get(f"{BASE}/v1/runs/{run_id}/events", params={"after": after}) as resp:
            if resp.status != 200:
                raise await _error_of(resp)
            progressed = False
            async for raw in _lines(resp):
                after = max(after, _head_decoder.decode(raw).seq)
                progressed = True
                frame = _decode(raw)
                sink(raw, frame)
                if isinstance(frame, RunResult):
                    return frame
        idle_ends = 0 if progressed else idle_ends + 1
        if idle_ends >= _MAX_RESUMES:
            raise DaemonError(0, "stream_ended", "the event stream ended before the run did")


async def follow_all(
    http: aiohttp.ClientSession, sink: Callable[[bytes, Frame | None], None]
) -> None:
    """Every run's frames over the WebSocket; DaemonError when the daemon closes it."""
    async with http.ws_connect(f"{BASE}/v1/ws", params={"run": "*"}) as ws:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                raw = message.data.encode()
                sink(raw, _decode(raw))
        # Only the daemon ends this stream (watching ends with Ctrl-C): it stopped or dropped us.
        code = ws.close_code
        why = "it is stopping" if code == aiohttp.WSCloseCode.GOING_AWAY else f"code {code}"
        raise DaemonError(0, "daemon_gone", f"the daemon closed the stream ({why})")


async def run_state(http: aiohttp.ClientSession, run_id: str) -> dict[str, Any]:
    """``GET /v1/runs/{id}``: the run's cwd and start, for the board."""
    async with http.get(f"{BASE}/v1/runs/{run_id}") as response:
        if response.status != 200:
            raise await _error_of(response)
        state: dict[str, Any] = await response.json()
        return state


def _decode(raw: bytes) -> Frame | None:
    try:
        return decode_frame(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # a frame type from a newer daemon: --json still shows it


class Interrupt(asyncio.Event):
    """Set by a signal that ends the client, instead of it tearing through: Ctrl-C, and SIGHUP
    or SIGTERM (a closed terminal, a dropped SSH session, ``timeout``), which must not leave a
    run going unattended either. ``signum`` is the first of them (exit status 128 + signum)."""

    def __init__(self) -> None:
        super().__init__()
        self.signum: int = signal.SIGINT

    def by(self, signum: int) -> None:
        if not self.is_set():
            self.signum = signum
        self.set()


def _interrupts(loop: asyncio.AbstractEventLoop) -> Interrupt:
    stop = Interrupt()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
        for signum in _ENDING_SIGNALS:
            loop.add_signal_handler(signum, stop.by, signum)
    return stop


def _poster(http: aiohttp.ClientSession) -> Post:
    async def post(path: str, body: dict[str, Any]) -> int:
        try:
            async with http.post(f"{BASE}{path}", json=body) as response:
                return response.status
        except aiohttp.ClientError:
            return 0

    return post


def _sink(renderer: Renderer, approvals: Approvals) -> Callable[[bytes, Frame | None], None]:
    def sink(raw: bytes, frame: Frame | None) -> None:
        renderer.line(raw, frame)
        approvals.feed(frame)

    return sink


async def run_async(
    args: argparse.Namespace,
    renderer: Renderer,
    interrupt: asyncio.Event | None = None,
    ask: Ask | None = None,
) -> int:
    """``codelegate run``: start the task, draw it, cancel it on ``interrupt`` (Ctrl-C, SIGHUP,
    SIGTERM); a request for approval is asked with ``ask`` (default: on the terminal, if stdin
    is one)."""
    stop = interrupt if interrupt is not None else _interrupts(asyncio.get_running_loop())
    ask = ask if ask is not None else terminal_asker(renderer.question)
    body: dict[str, Any] = {"task": args.task, "cwd": args.cwd}
    # A byte the locale cannot decode is a lone surrogate in argv, which no JSON body carries.
    if bad := [name for name, text in body.items() if _SURROGATE.search(text)]:
        renderer.note(f"refused: the {bad[0]} is not valid UTF-8", style="red")
        return EXIT_REFUSED
    if args.mode:
        body["mode"] = args.mode
    if args.resume:
        body["resume"] = args.resume
    if args.model:
        body["model"] = args.model
    if isinstance(renderer.board, Board):
        renderer.board.cwd = args.cwd
        renderer.board.started = time.time()  # the run's clock starts now, not at its first line
    async with _session(args.socket) as http:
        try:
            run_id = await start_run(http, body)
        except DaemonError as exc:
            renderer.note(f"refused: {exc}", style="red")
            return EXIT_REFUSED if 400 <= exc.status < 500 else EXIT_RUN_FAILED
        renderer.note(f"run {run_id} · {args.cwd}")
        approvals = Approvals(_poster(http), ask, renderer.note)
        with renderer, contextlib.closing(approvals):
            following = asyncio.ensure_future(follow(http, run_id, _sink(renderer, approvals)))
            stopped = asyncio.ensure_future(stop.wait())
            await _first(following, stopped)
            if following.done():
                stopped.cancel()
                return _exit_of(following.result())
            stop.clear()
            renderer.note("cancelling the run (Ctrl-C again to leave at once)…", style="yellow")
            await cancel(http, run_id)
            again = asyncio.ensure_future(stop.wait())
            await _first(following, again, limit_s=_CANCEL_WAIT_S)
            for task in (following, again):
                task.cancel()
            return 128 + stop.signum if isinstance(stop, Interrupt) else EXIT_INTERRUPTED


async def _first(*futures: asyncio.Future[Any], limit_s: float | None = None) -> None:
    """Wait until one of ``futures`` is done (or ``limit_s`` seconds pass)."""
    await asyncio.wait(set(futures), timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)


def _exit_of(frame: RunResult) -> int:
    return EXIT_OK if frame.result.status == "completed" else EXIT_RUN_FAILED


async def watch_async(
    args: argparse.Namespace, renderer: Renderer, interrupt: asyncio.Event | None = None
) -> int:
    """``codelegate watch``: follow one run to its end, or every run until Ctrl-C."""
    stop = interrupt if interrupt is not None else _interrupts(asyncio.get_running_loop())
    async with _session(args.socket) as http:
        if args.run and isinstance(renderer.board, Board):
            state = await run_state(http, args.run)
            renderer.board.cwd = str(state.get("cwd") or "") or None
            created = state.get("created_at")
            renderer.board.started = float(created) if isinstance(created, int | float) else None
        sink = _sink(renderer, Approvals(_poster(http), None, renderer.note))  # shown only
        with renderer:
            job: asyncio.Future[RunResult | None] = asyncio.ensure_future(
                follow(http, args.run, sink) if args.run else follow_all(http, sink)
            )
            stopped = asyncio.ensure_future(stop.wait())
            await _first(job, stopped)
            stopped.cancel()
            if not job.done():
                job.cancel()  # watching never cancels the run itself
                return EXIT_OK
            result = job.result()
            return _exit_of(result) if isinstance(result, RunResult) else EXIT_OK


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"codelegate {command}")
    if command == "run":
        parser.description = "Delegate one task to Claude Code and watch its cards live."
        parser.add_argument("task", help="what Claude Code should do")
        parser.add_argument("--cwd", default=".", help="workspace directory (default: .)")
        parser.add_argument("--mode", choices=["safe", "accept_edits", "plan", "auto"])
        parser.add_argument("--resume", metavar="SESSION_ID", help="continue that session")
        parser.add_argument("--model", help="a model the operator allows")
    else:
        parser.description = "Follow runs already started."
        # daemon/cli.py hands a --redis call to daemon/clients/fleet.py, which parses these.
        parser.epilog = "--redis URL [--prefix P] [--new]: follow a fleet through Redis (README)."
        group = parser.add_mutually_exclusive_group()
        group.add_argument("run", nargs="?", help="a run id (default: every run)")
        group.add_argument("--all", action="store_true", help="every run (the default)")
    parser.add_argument("--json", action="store_true", help="print the frames as NDJSON")
    parser.add_argument("--socket", default="", help="the daemon's socket (or $CODELEGATE_SOCKET)")
    return parser


def _main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    args.socket = socket_path(args.socket)
    if command == "run":
        args.cwd = os.path.abspath(args.cwd)  # the daemon has its own cwd
    # With --json, stdout is for frames only; the client's own words go to stderr. Whatever is
    # printed goes through CleanConsole: run text is the model's, and a terminal obeys escapes.
    console = CleanConsole(stderr=args.json, highlight=False)
    renderer = Renderer(
        console,
        json_out=sys.stdout.buffer if args.json else None,
        many=command == "watch" and not args.run,
    )
    job = run_async if command == "run" else watch_async
    try:
        return asyncio.run(job(args, renderer))
    except DaemonError as exc:
        console.print(f"codelegate {command}: {exc}", style="red", markup=False)
        return EXIT_UNREACHABLE if exc.code == "daemon_gone" else EXIT_RUN_FAILED
    except aiohttp.ClientConnectionError as exc:
        cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
        why = unreachable(cause, args.socket)  # names "[server] allowed_gids": no markup
        console.print(f"codelegate {command}: {why}", style="red", markup=False)
        return EXIT_UNREACHABLE
    except aiohttp.ClientError as exc:  # e.g. the WebSocket handshake was refused
        console.print(f"codelegate {command}: {exc}", style="red", markup=False)
        return EXIT_RUN_FAILED


def run_main(argv: list[str]) -> int:
    """``codelegate run TASK [--cwd] [--mode] [--resume ID] [--json] [--socket]``."""
    return _main("run", argv)


def watch_main(argv: list[str]) -> int:
    """``codelegate watch [RUN | --all] [--json] [--socket]``."""
    return _main("watch", argv)


def main(argv: list[str]) -> int:
    """Dispatch ``["run", ...]`` / ``["watch", ...]`` (what daemon/cli.py hands over)."""
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "run":
        return run_main(rest)
    if command == "watch":
        return watch_main(rest)
    print("usage: codelegate {run,watch} ...", file=sys.stderr)
    return EXIT_REFUSED
