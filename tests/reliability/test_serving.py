"""``codelegate serve`` as operators run it, under what goes wrong around it: a second daemon
started by mistake, a flood of idle TCP connections, a stdout whose reader went away.

Each daemon is a real child process (``tests/reliability/served.py``); waits are bounded polls
on the daemon's own answers or reads until EOF, never sleeps.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import secrets
import struct
import termios
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.polling import until
from tests.procfs import marked_processes
from tests.reliability.conftest import cards_closed, wait_done
from tests.reliability.served import BASE, Served, write_config
from tests.stub.anthropic import Stub, Turn, serve_stub, text
from tests.stub.claude import API_KEY


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace and a HOME (with a TMPDIR for the real CLI)."""
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    (home / "tmp").mkdir(parents=True)
    return workspace, home


async def metric(served: Served, name: str) -> int:
    """One sample of ``GET /metrics`` (0 when absent)."""
    assert served.http is not None
    async with served.http.get(f"{BASE}/metrics") as resp:
        body = await resp.text()
    found = re.search(rf"^{re.escape(name)} (\d+)$", body, re.MULTILINE)
    return int(found.group(1)) if found else 0


# -- item: a second daemon ---------------------------------------------------------------------


@pytest.fixture
async def held() -> AsyncIterator[tuple[Stub, asyncio.Event]]:
    """The stub whose first answer waits for the event: a real CLI run that stays live."""
    release = asyncio.Event()
    stub = Stub([Turn(text("Finished after the second daemon.").blocks, hold=release)])
    async with serve_stub(stub):
        try:
            yield stub, release
        finally:
            release.set()


@pytest.mark.e2e
async def still_serves(served: Served) -> None:
    """The Unix socket answers /healthz and a new run completes."""
    status, health = await served.json("GET", "/healthz")
    assert (status, health["status"]) == (200, "ok")
    status, body = await served.json("POST", "/v1/runs", json={"task": "fake: normal", "cwd": "."})
    assert status == 202, body
    assert (await wait_done(served, body["run_id"]))["status"] == "completed"


async def test_a_second_serve_exits_nonzero_and_touches_nothing(
    claude_bin: str,
    dirs: tuple[Path, Path],
    short_dir: Path,
    held: tuple[Stub, asyncio.Event],
) -> None:
    workspace, home = dirs
    stub, release = held
    env = {
        "LANG": "C.UTF-8",
        "TMPDIR": str(home / "tmp"),
        "ANTHROPIC_BASE_URL": stub.url,
        "ANTHROPIC_API_KEY": API_KEY,
    }
    config = write_config(short_dir, workspace, claude=claude_bin)
    first = Served(config, short_dir, home, env)
    await first.start()
    try:
        status, body = await first.json("POST", "/v1/runs", json={"task": "Say hello."})
        assert status == 202, body
        run_id = body["run_id"]
        # The run is live: its CLI is running and waiting for the model's answer.
        await until(lambda: bool(stub.requests and marked_processes(run_id)), 60, "the CLI waiting")
        pids = set(marked_processes(run_id))
        sock = short_dir / "d.sock"
        inode = os.lstat(sock).st_ino

        # `make run` in a second terminal: the same config.
        second = Served(config, short_dir, home, env, log="second.log")
        assert await second.exits() != 0
        assert "another daemon" in second.log.read_text()
        # Another socket, the same store: refused as well, before it binds anything.
        other = short_dir / "b"
        other.mkdir()
        third_config = write_config(other, workspace, claude_bin, store=short_dir / "store.db")
        third = Served(third_config, other, home, env)
        assert await third.exits() != 0
        assert "is using the store" in third.log.read_text()
        assert not (other / "d.sock").exists()

        # Nothing of the first daemon's was touched: its run's processes, run, socket.
        assert pids <= set(marked_processes(run_id))
        assert os.lstat(sock).st_ino == inode
        status, state = await first.json("GET", f"/v1/runs/{run_id}")
        assert (status, state["status"]) == (200, "running")
        status, health = await first.json("GET", "/healthz")
        assert (status, health["runs_active"]) == (200, 1)

        release.set()
        state = await wait_done(first, run_id)
        assert state["status"] == "completed", state
        cards_closed(await first.events(run_id))
        status, health = await first.json("GET", "/healthz")
        assert (status, health["status"]) == (200, "ok")
    finally:
        release.set()
        assert await first.stop() == 0


# -- item: connection floods -------------------------------------------------------------------

NOFILE = 96  # soft and hard: the daemon uses ~20 descriptors idle
CAP = 16
FLOOD = 160  # more idle connections than the daemon has descriptors


async def tcp_served(
    dirs: tuple[Path, Path],
    short_dir: Path,
    tmp_path: Path,
    port: int,
    more: str,
    nofile: tuple[int, int] | None = None,
) -> tuple[Served, str]:
    """A started daemon with a TCP listener on ``port`` (and ``more`` [server] lines); its
    fresh token."""
    workspace, home = dirs
    token = secrets.token_hex(24)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    server = f'tcp = "127.0.0.1:{port}"\ntoken_file = "{token_file}"\n' + more
    config = write_config(short_dir, workspace, server=server)
    served = Served(config, short_dir, home, nofile=nofile)
    await served.start()
    return served, token


async def test_a_tcp_flood_past_the_cap_leaves_the_unix_socket_runs_and_token_holders_working(
    dirs: tuple[Path, Path], short_dir: Path, tmp_path: Path, unused_tcp_port: int
) -> None:
    more = f"tcp_max_connections = {CAP}\n"
    served, token = await tcp_served(
        dirs, short_dir, tmp_path, unused_tcp_port, more, (NOFILE, NOFILE)
    )
    flood: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    kept = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
    try:
        status, body = await served.json(
            "POST", "/v1/runs", json={"task": "fake: tools n=400 rate=200", "cwd": "."}
        )
        assert status == 202, body
        running = body["run_id"]
        # A caller keeps an authenticated connection open across the flood.
        assert await healthz_over(kept, token) == 200

        # Unauthenticated clients that connect and never send a byte.
        for _ in range(FLOOD):
            flood.append(await asyncio.open_connection("127.0.0.1", unused_tcp_port))
        refused = 'codelegate_connections_refused_total{listener="tcp"}'
        async with asyncio.timeout(60):  # until the daemon has accepted them all
            while True:
                if await metric(served, refused) >= FLOOD - CAP + 1:
                    break
                await asyncio.sleep(0.05)
        assert await metric(served, 'codelegate_connections{listener="tcp"}') == CAP
        # While the flood holds the listener: the kept connection and a new one with the token
        # are answered, the Unix socket too, and a new run completes.
        assert await healthz_over(kept, token) == 200
        flood.append(await asyncio.open_connection("127.0.0.1", unused_tcp_port))
        assert await healthz_over(flood[-1], token) == 200
        # Each new one took the room of the oldest without the token: that one was closed.
        assert await read_to_eof(flood[0][0]) == b""
        await still_serves(served)
        # The run that was going when the flood came finishes with all of its frames.
        assert (await wait_done(served, running))["status"] == "completed"
        frames = await served.events(running)
        cards_closed(frames)
        assert len([f for f in frames if f["type"] == "tool_call"]) == 200
    finally:
        for _, writer in [*flood, kept]:
            writer.close()
        assert await served.stop() == 0
    lines = [line for line in served.log.read_text().splitlines() if "connections_refused" in line]
    # Logged, but not once per connection.
    assert 1 <= len(lines) < (FLOOD - CAP) / 2, lines
    # The operator was told at start-up that the Unix socket's cap does not fit either.
    assert "connection_caps_above_nofile" in served.log.read_text()


async def test_a_tcp_listener_full_of_token_holders_turns_the_next_one_away(
    dirs: tuple[Path, Path], short_dir: Path, tmp_path: Path, unused_tcp_port: int
) -> None:
    """Only connections without the token make room: the cap still bounds the callers."""
    more = "tcp_max_connections = 2\n"
    served, token = await tcp_served(dirs, short_dir, tmp_path, unused_tcp_port, more)
    callers = [await asyncio.open_connection("127.0.0.1", unused_tcp_port) for _ in range(2)]
    try:
        for caller in callers:
            assert await healthz_over(caller, token) == 200
        reader, writer = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
        callers.append((reader, writer))  # closed below
        turned_away = await read_to_eof(reader)
        assert turned_away.startswith(b"HTTP/1.1 503 "), turned_away[:200]
        assert b'"too_many_connections"' in turned_away
        for caller in callers[:2]:  # neither was closed for it
            assert await healthz_over(caller, token) == 200
    finally:
        for _, caller_writer in callers:
            caller_writer.close()
        assert await served.stop() == 0


async def healthz_over(
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], token: str
) -> int:
    """``GET /healthz`` with the token on a kept-alive TCP connection; the answer's status."""
    reader, writer = connection
    writer.write(
        f"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    async with asyncio.timeout(30):
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length: *(\d+)", head)
        assert length is not None, head
        await reader.readexactly(int(length.group(1)))
    return int(head.split(b" ", 2)[1])


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything the daemon sends until it closes (generous bound: a failure, not a wait)."""
    async with asyncio.timeout(30):
        return await reader.read()


async def test_idle_and_half_sent_connections_are_closed_after_the_idle_bound(
    dirs: tuple[Path, Path], short_dir: Path, tmp_path: Path, unused_tcp_port: int
) -> None:
    # A soft descriptor limit below the hard one, as a login shell's often is.
    more = "idle_timeout_s = 0.5\n"
    served, token = await tcp_served(dirs, short_dir, tmp_path, unused_tcp_port, more, (1100, 4096))
    writers: list[asyncio.StreamWriter] = []
    try:
        assert served.proc is not None
        with open(f"/proc/{served.proc.pid}/limits") as fh:  # noqa: ASYNC230 - procfs, instant
            limits = fh.read()
        assert re.search(r"Max open files\s+4096\s+4096", limits), limits  # raised to the hard
        silent, w = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
        writers.append(w)
        half, w = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
        w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
        writers.append(w)
        kept, w = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
        auth = b"Authorization: Bearer " + token.encode()
        w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n\r\n")
        writers.append(w)
        local, w = await asyncio.open_unix_connection(str(short_dir / "d.sock"))
        writers.append(w)

        assert await read_to_eof(silent) == b""
        assert await read_to_eof(half) == b""
        answer = await read_to_eof(kept)  # answered, kept alive, then closed when idle
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        assert await read_to_eof(local) == b""
    finally:
        for writer in writers:
            writer.close()
        assert await served.stop() == 0
    # 1100 descriptors would not have held both caps; the raised limit does.
    assert "connection_caps_above_nofile" not in served.log.read_text()


# -- item: a broken stdout ---------------------------------------------------------------------

PIPE_BYTES = 4096  # the smallest pipe Linux makes
RUNS = 12  # two log lines of ~250 bytes each: more than the pipe holds


@pytest.mark.parametrize("how", ["reader_gone", "descriptor_closed"])
async def test_a_closed_stdout_never_breaks_requests_runs_or_shutdown(
    dirs: tuple[Path, Path], short_dir: Path, how: str
) -> None:
    workspace, home = dirs
    pipe = how == "reader_gone"
    served = Served(
        write_config(short_dir, workspace),
        short_dir,
        home,
        stdout_pipe=pipe,
        stdout_closed=not pipe,  # `codelegate serve >&-`
    )
    await served.start()
    assert served.proc is not None
    if served.proc.stdout is not None:
        served.proc.stdout.close()  # `make run | tee log`, and tee is gone
    try:
        status, body = await served.json(
            "POST", "/v1/runs", json={"task": "fake: normal", "cwd": "."}
        )
        assert status == 202, body
        assert (await wait_done(served, body["run_id"]))["status"] == "completed"
        status, health = await served.json("GET", "/healthz")
        assert (status, health["status"], health["cli_version"]) == (200, "ok", "2.1.332")
        status, error = await served.json("GET", "/v1/runs/nope")
        assert (status, error["error"]["code"]) == (404, "run_not_found")
        dropped = await metric(served, "codelegate_log_lines_dropped_total")
        # A pipe without a reader drops lines; a closed stdout became /dev/null at start-up.
        assert dropped > 0 if pipe else dropped == 0
    finally:
        code = await served.stop()
    assert code == 0, served.log.read_text()[-2000:]
    assert not (short_dir / "d.sock").exists()
    assert "Traceback" not in served.log.read_text()


async def test_a_stdout_nobody_reads_never_stalls_requests_runs_or_shutdown(
    dirs: tuple[Path, Path], short_dir: Path
) -> None:
    workspace, home = dirs
    served = Served(write_config(short_dir, workspace), short_dir, home, stdout_pipe=True)
    await served.start()
    assert served.proc is not None
    assert served.proc.stdout is not None
    out = served.proc.stdout.fileno()
    # `codelegate serve | less`, and nobody scrolls: a small pipe, never read.
    fcntl.fcntl(out, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    try:
        for _ in range(RUNS):  # each run logs its start and its end
            status, body = await served.json(
                "POST", "/v1/runs", json={"task": "fake: normal", "cwd": "."}
            )
            assert status == 202, body
            assert (await wait_done(served, body["run_id"]))["status"] == "completed"
        buffered = struct.unpack("i", fcntl.ioctl(out, termios.FIONREAD, b"\0" * 4))[0]
        assert buffered > PIPE_BYTES // 2, buffered  # the pipe is full: writes would block
        await still_serves(served)
    finally:
        code = await served.stop()
    assert code == 0, served.log.read_text()[-2000:]
    assert not (short_dir / "d.sock").exists()
