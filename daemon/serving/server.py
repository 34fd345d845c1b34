"""Serving and stopping: the app on its listeners, systemd integration, signals.

``start_server(config)`` brings the app up on its listeners and returns a :class:`ServerHandle`
(tests and the e2e suite use it in-process); ``serve(config)`` runs until SIGTERM/SIGINT, then
drains: intake stops (503), running runs get ``drain_s`` to finish and are then cancelled,
WebSockets are closed with GOING_AWAY, and the store is flushed and closed.

Start-up claims what is the daemon's before it touches anything (:mod:`.binding`): an exclusive
lock on the store (``<store>.lock``), then its listening sockets. Only then does the app open
the store and close the runs a dead daemon left running. A second daemon on the same store or
socket exits with an error and has touched nothing: not the first daemon's runs, store or socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import structlog
from aiohttp import web

from codelegate.daemon import logs
from codelegate.daemon.pinned import translator_build
from codelegate.daemon.serving.app import create_app
from codelegate.daemon.serving.binding import (
    ServerError,
    absolute,
    bind_tcp,
    bind_unix_socket,
    inherited_socket,
    lock_store,
    read_token,
)
from codelegate.daemon.serving.listeners import GatedSite
from codelegate.daemon.serving.state import METRICS, STATE, manager_of
from codelegate.daemon.store.store import StoreError
from codelegate.daemon.supervision.procs import become_subreaper
from codelegate.daemon.supervision.supervisor import can_enter
from codelegate.daemon.tasks import spawn
from codelegate.policy.checks import root_problems
from codelegate.policy.child_env import passed_secrets
from codelegate.policy.config import Config, ServerConfig, socket_mode_bits

_log = structlog.get_logger("codelegate.server")

SHUTDOWN_DRAIN_S: Final = 10.0  # how long running runs may finish on SIGTERM before cancelled
SHUTDOWN_S: Final = 5.0  # then how long open requests get before aiohttp cancels them
# Descriptors besides client connections: the store, runs' pipes, the loop's own (~20 idle).
FD_RESERVE: Final = 128


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


@dataclass
class ServerHandle:
    """A running daemon in this process: its app, listeners and how to stop it."""

    app: web.Application
    runner: web.AppRunner
    socket_path: str | None
    tcp_port: int | None
    _owned_socket: tuple[str, int] | None  # (path, inode) we created and must remove
    _store_lock: int | None  # the flock's descriptor, released once the store is closed

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
        if self._store_lock is not None:
            os.close(self._store_lock)
            self._store_lock = None


async def start_server(
    config: Config,
    *,
    environ: Mapping[str, str] | None = None,
    shutdown_timeout: float = SHUTDOWN_S,
    activation: bool = False,
) -> ServerHandle:
    """Start the app on the configured Unix socket (or the inherited one) and optional TCP.

    The store lock and the sockets come first, the app (which opens the store and recovers)
    after: a daemon that cannot have them leaves everything as it found it.
    """
    server = config.server
    environ = dict(os.environ if environ is None else environ)
    tcp_token: bytes | None = None
    if server.tcp is not None:
        if not server.token_file:
            raise ServerError("server.tcp needs server.token_file")
        tcp_token = read_token(server.token_file)
    # The daemon knows these secrets before any run: the TCP token and the credentials every run
    # is passed. Whatever shape or encoding they take, no log line may carry them, also none that
    # belongs to no run (aiohttp's own, a traceback); a run's frames mask them by its own plan.
    logs.mask_known(*passed_secrets(config, environ), *([tcp_token] if tcp_token else []))
    lock = lock_store(config.store.path)
    owned: tuple[str, int] | None = None
    sockets: list[socket.socket] = []
    runner: web.AppRunner | None = None
    try:
        sock = inherited_socket() if activation else None
        socket_path: str | None
        if sock is not None:
            socket_path = sock.getsockname() or None
        else:
            socket_path = absolute(server.socket)
            sock = bind_unix_socket(socket_path, socket_mode_bits(server))
            owned = (socket_path, os.lstat(socket_path).st_ino)
        sockets.append(sock)
        tcp_port: int | None = None
        if server.tcp is not None:
            tcp_sock = bind_tcp(server.tcp)
            sockets.append(tcp_sock)
            tcp_port = tcp_sock.getsockname()[1]
        app = create_app(config, environ=environ, tcp_token=tcp_token)
        # keepalive_timeout also runs from the moment a connection opens (aiohttp): it is the
        # bound on idle time and on the time to send a request head.
        runner = web.AppRunner(
            app,
            shutdown_timeout=shutdown_timeout,
            access_log=None,
            keepalive_timeout=server.idle_timeout_s,
        )
        try:
            await runner.setup()  # the store opens and runs recover: only now that it is ours
        except StoreError as exc:  # a folder, not SQLite, a newer schema: refused, untouched
            raise ServerError(f"store.path: {exc}") from exc
        # The sockets are bound here (not by UnixSite/TCPSite) so that the Unix socket's mode is
        # right from the first moment (umask), a stale one is replaced safely, an inherited one
        # works, and each listener counts its connections under its own cap.
        for listening in sockets:
            cap = (
                server.unix_max_connections
                if listening.family == socket.AF_UNIX
                else server.tcp_max_connections
            )
            await GatedSite(runner, listening, cap=cap, metrics=app[METRICS], config=server).start()
    except BaseException:
        if runner is not None:
            await runner.cleanup()
        for listening in sockets:
            listening.close()
        if owned is not None:
            with contextlib.suppress(OSError):
                os.unlink(owned[0])
        os.close(lock)
        raise
    return ServerHandle(app, runner, socket_path, tcp_port, owned, lock)


def raise_nofile_limit(server: ServerConfig) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (a shell's soft limit is often 1024) and
    warn when the listeners' caps do not fit under it; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    needed = FD_RESERVE + server.unix_max_connections
    if server.tcp is not None:
        needed += server.tcp_max_connections
    if soft != resource.RLIM_INFINITY and needed > soft:
        _log.warning(
            "connection_caps_above_nofile",
            nofile=soft,
            needed=needed,
            hint="lower [server] unix_max_connections / tcp_max_connections or raise LimitNOFILE",
        )
    return soft


async def serve(config: Config, *, drain_s: float = SHUTDOWN_DRAIN_S) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the process exit code."""
    if become_subreaper():
        _log.info("subreaper", enabled=True)
    else:  # orphans of runs then go to pid 1: out of the ancestry that tells a run's processes
        _log.warning("subreaper_unavailable", hint="a run's orphans are told by cgroup or marker")
    raise_nofile_limit(config.server)
    closed = [
        str(p)
        for p in root_problems(config, isdir=os.path.isdir, can_enter=can_enter, uid=os.geteuid())
    ]
    try:
        if closed and len(closed) == len(config.policy.workspaces):  # every run would be refused
            raise ServerError(f"no workspace root is usable: {'; '.join(closed)}")
        handle = await start_server(config, activation=True)
    except ServerError as exc:
        _log.error("cannot_start", error=str(exc))  # roots, listeners, store lock or store
        logs.say(f"codelegate: {exc}")
        return 1
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Handlers only set a flag, shutdown is here: the first signal drains, a second one
        # cuts the drain short.
        loop.add_signal_handler(signum, lambda: (hurry if stop.is_set() else stop).set())
    where = [f"unix:{handle.socket_path}"]
    if handle.tcp_port is not None:
        where.append(f"tcp:{config.server.tcp}")
    version = handle.app[STATE].cli_version
    _log.info("listening", on=where, cli_version=version, translator=translator_build())
    logs.say(f"codelegate listening on {', '.join(where)}")
    if version is None:
        # Serving all the same (the CLI may be installed or mended while it runs), but every run
        # would fail to start until then: said now, not at the first run.
        _log.warning("cli_not_answering", path=config.claude.path)
        logs.say(
            f"codelegate: warning: {config.claude.path} does not answer --version: runs will "
            "fail to start (codelegate doctor tells why)"
        )
    for problem in closed:  # serving the other roots; this one may be mended while it runs
        _log.warning("workspace_unusable", problem=problem)
        logs.say(f"codelegate: warning: {problem}")
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
        await _close(handle, drain_s, hurry)
        if dog is not None:
            dog.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        _log.info("stopped")
    return 0


def drain_notice(running: int, drain_s: float) -> str:
    """The operator's line when a signal starts the drain: what it waits for, how to cut it."""
    if running == 0:
        return "codelegate: stopping; no run to drain"
    runs = _runs(running)
    if drain_s == 0:
        return f"codelegate: stopping; cancelling {runs} (--drain 0)"
    them = "it" if running == 1 else "them"
    return f"codelegate: draining {runs} (up to {drain_s:g} s); Ctrl-C again to cancel {them} now"


def _runs(count: int) -> str:
    return f"{count} run{'s' if count != 1 else ''}"


async def _close(handle: ServerHandle, drain_s: float, hurry: asyncio.Event) -> None:
    """``handle.close(drain_s)``, said on stderr; ``hurry`` (a second signal) cancels the runs
    still draining at once rather than when ``drain_s`` is out."""
    manager = manager_of(handle.app)
    logs.say(drain_notice(manager.active_count, drain_s))
    closing = spawn(handle.close(drain_s), name="close")
    hurried = spawn(hurry.wait(), name="hurry")
    await asyncio.wait((closing, hurried), return_when=asyncio.FIRST_COMPLETED)
    hurried.cancel()
    if not closing.done() and manager.active_count:
        _log.info("drain_cut_short", runs=manager.active_count)
        logs.say(f"codelegate: cancelling {_runs(manager.active_count)} now")
        with contextlib.suppress(web.HTTPException):
            await manager.drain(0)  # the close's own drain ends with them
    await closing


def ensure_standard_fds() -> None:
    """Point a closed stdin, stdout or stderr at /dev/null before anything opens a descriptor.

    Started with ``>&-``, the daemon's next socket would be fd 1: log lines would go to a
    client, and libuv aborts the process when it closes a descriptor below 3.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def run(config: Config, *, drain_s: float | None = None) -> int:
    """Run :func:`serve` on uvloop (as a loop factory, not a global policy); ``drain_s``:
    :data:`SHUTDOWN_DRAIN_S` unless given."""
    ensure_standard_fds()
    drain = SHUTDOWN_DRAIN_S if drain_s is None else drain_s
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(serve(config, drain_s=drain))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(config, drain_s=drain))
