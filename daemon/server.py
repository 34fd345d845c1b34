"""Listening and stopping: the Unix socket (and optional TCP), systemd integration, signals.

``start_server(config)`` brings the app up on its listeners and returns a :class:`ServerHandle`
(tests and the e2e suite use it in-process); ``serve(config)`` runs until SIGTERM/SIGINT, then
drains: intake stops (503), running runs get ``drain_s`` to finish and are then cancelled,
WebSockets are closed with GOING_AWAY, and the store is flushed and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import structlog
from aiohttp import web

from daemon.app import STATE, create_app, manager_of
from daemon.supervisor import become_subreaper
from daemon.tasks import spawn
from policy.checks import token_problem
from policy.config import Config, socket_mode_bits

_log = structlog.get_logger("codelegate.server")

SD_LISTEN_FDS_START: Final = 3
DRAIN_S: Final = 10.0  # how long running runs may finish on SIGTERM before they are cancelled
SHUTDOWN_S: Final = 5.0  # then how long open requests get before aiohttp cancels them


class ServerError(Exception):
    """The daemon cannot listen (socket in use, not a socket, token missing …)."""


def sd_notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (e.g. ``READY=1``) to systemd when NOTIFY_SOCKET is set."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        _log.warning("sd_notify_failed", error=str(exc))
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Half the systemd watchdog period, when this process is the one being watched."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000


async def _watchdog(interval: float) -> None:
    while True:
        sd_notify("WATCHDOG=1")
        await asyncio.sleep(interval)


def inherited_socket(environ: Mapping[str, str] | None = None) -> socket.socket | None:
    """The listening Unix socket systemd passed (socket activation), if any."""
    env = os.environ if environ is None else environ
    if env.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = env.get("LISTEN_FDS", "0")
    if not count.isdigit() or int(count) < 1:
        return None
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.family != socket.AF_UNIX:
        sock.detach()
        raise ServerError("socket activation passed a socket that is not a Unix socket")
    os.set_inheritable(SD_LISTEN_FDS_START, False)
    return sock


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file nobody listens on; refuse anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServerError(f"{path} exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # a socket left by a daemon that died: nobody is listening
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ServerError(f"cannot tell whether {path} is in use: {exc}") from exc
    raise ServerError(f"another daemon is listening on {path}")


def bind_unix_socket(path: str, mode: int) -> socket.socket:
    """A Unix stream socket bound at ``path`` with permission bits ``mode``."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    _remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The umask makes the socket appear with at most ``mode``: no window where it is wider.
    old = os.umask(0o777 & ~mode)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ServerError(f"cannot bind {path}: {exc}") from exc
    finally:
        os.umask(old)
    os.chmod(path, mode)
    return sock


def read_token(path: str) -> bytes:
    """The TCP bearer token from ``token_file`` (surrounding whitespace dropped)."""
    try:
        with open(path, "rb") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise ServerError(f"cannot read server.token_file: {exc}") from exc
    problem = token_problem(token)  # the same check doctor makes
    if problem:
        raise ServerError(problem)
    return token


def absolute(path: str) -> str:
    """``path`` made absolute against the daemon's cwd."""
    return os.path.abspath(path)


def _tcp_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class ServerHandle:
    """A running daemon in this process: its app, listeners and how to stop it."""

    app: web.Application
    runner: web.AppRunner
    socket_path: str | None
    tcp_port: int | None
    _owned_socket: tuple[str, int] | None  # (path, inode) we created and must remove

    async def close(self, drain_s: float = 0.0) -> None:
        """Stop intake, let runs finish for ``drain_s``, cancel the rest, close everything."""
        state = self.app[STATE]
        state.stopping = True
        with contextlib.suppress(web.HTTPException):
            await manager_of(self.app).drain(drain_s)
        await self.runner.cleanup()
        if self._owned_socket is not None:
            path, inode = self._owned_socket
            with contextlib.suppress(OSError):
                if os.lstat(path).st_ino == inode:
                    os.unlink(path)


async def start_server(
    config: Config,
    *,
    environ: Mapping[str, str] | None = None,
    shutdown_timeout: float = SHUTDOWN_S,
    activation: bool = False,
) -> ServerHandle:
    """Start the app on the configured Unix socket (or the inherited one) and optional TCP."""
    tcp_token: bytes | None = None
    if config.server.tcp is not None:
        if not config.server.token_file:
            raise ServerError("server.tcp needs server.token_file")
        tcp_token = read_token(config.server.token_file)
    app = create_app(config, environ=environ, tcp_token=tcp_token)
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout, access_log=None)
    await runner.setup()
    owned: tuple[str, int] | None = None
    try:
        sock = inherited_socket() if activation else None
        socket_path: str | None
        if sock is not None:
            socket_path = sock.getsockname() or None
        else:
            socket_path = absolute(config.server.socket)
            sock = bind_unix_socket(socket_path, socket_mode_bits(config.server))
            owned = (socket_path, os.lstat(socket_path).st_ino)
        # SockSite, not UnixSite: the socket is bound here so that its mode is right from the
        # first moment (umask), a stale one is replaced safely, and an inherited one works.
        await web.SockSite(runner, sock).start()
        tcp_port: int | None = None
        if config.server.tcp is not None:
            host, port = _tcp_address(config.server.tcp)
            tcp_sock = socket.create_server((host, port))
            tcp_port = tcp_sock.getsockname()[1]
            await web.SockSite(runner, tcp_sock).start()
    except BaseException:
        await runner.cleanup()
        if owned is not None:
            with contextlib.suppress(OSError):
                os.unlink(owned[0])
        raise
    return ServerHandle(app, runner, socket_path, tcp_port, owned)


async def serve(config: Config, *, drain_s: float = DRAIN_S) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the process exit code."""
    if become_subreaper():
        _log.info("subreaper", enabled=True)
    try:
        handle = await start_server(config, activation=True)
    except ServerError as exc:
        _log.error("cannot_listen", error=str(exc))
        print(f"codelegate: {exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)  # handlers only set a flag; shutdown is here
    where = [f"unix:{handle.socket_path}"]
    if handle.tcp_port is not None:
        where.append(f"tcp:{config.server.tcp}")
    _log.info("listening", on=where, cli_version=handle.app[STATE].cli_version)
    print(f"codelegate listening on {', '.join(where)}", file=sys.stderr, flush=True)
    # Everything allocated so far (modules, config, the app) lives as long as the daemon: keep
    # it out of the collector's scans, whose full passes otherwise pause the fan-out for tens
    # of milliseconds (bench/RESULTS.md).
    gc.freeze()
    sd_notify("READY=1\nSTATUS=listening")
    interval = watchdog_interval()
    dog = spawn(_watchdog(interval), name="watchdog") if interval else None
    try:
        await stop.wait()
    finally:
        _log.info("stopping", drain_s=drain_s)
        sd_notify("STOPPING=1")
        await handle.close(drain_s)
        if dog is not None:
            dog.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        _log.info("stopped")
    return 0


def run(config: Config, *, drain_s: float = DRAIN_S) -> int:
    """Run :func:`serve` on uvloop (as a loop factory, not a global policy)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(serve(config, drain_s=drain_s))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(config, drain_s=drain_s))
