"""Listening and stopping: the Unix socket (and optional TCP), systemd integration, signals.

``start_server(config)`` brings the app up on its listeners and returns a :class:`ServerHandle`
(tests and the e2e suite use it in-process); ``serve(config)`` runs until SIGTERM/SIGINT, then
drains: intake stops (503), running runs get ``drain_s`` to finish and are then cancelled,
WebSockets are closed with GOING_AWAY, and the store is flushed and closed.

Start-up claims what is the daemon's before it touches anything: an exclusive lock on the store
(``<store>.lock``), then its listening sockets. Only then does the app open the store and close
the runs a dead daemon left running. A second daemon on the same store or socket exits with an
error and has touched nothing: not the first daemon's runs, store or socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import resource
import signal
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import structlog
from aiohttp import web

from codelegate.daemon import logs
from codelegate.daemon.serving.app import create_app
from codelegate.daemon.serving.listeners import GatedSite
from codelegate.daemon.serving.state import METRICS, STATE, manager_of
from codelegate.daemon.store.queries import make_parent
from codelegate.daemon.store.store import StoreError
from codelegate.daemon.supervision.procs import become_subreaper
from codelegate.daemon.tasks import spawn
from codelegate.policy.checks import token_problem
from codelegate.policy.child_env import passed_secrets
from codelegate.policy.config import Config, ServerConfig, parse_tcp, socket_mode_bits

_log = structlog.get_logger("codelegate.server")

SD_LISTEN_FDS_START: Final = 3
SHUTDOWN_DRAIN_S: Final = 10.0  # how long running runs may finish on SIGTERM before cancelled
SHUTDOWN_S: Final = 5.0  # then how long open requests get before aiohttp cancels them
# Descriptors besides client connections: the store, runs' pipes, the loop's own (~20 idle).
FD_RESERVE: Final = 128


class ServerError(Exception):
    """The daemon cannot start: socket in use or not a socket, a folder it cannot create, token
    missing, a store it cannot open … (one line, exit 1)."""


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
    except OSError as exc:  # a folder this uid may not search
        raise ServerError(f"cannot reach {path} for server.socket: {exc.strerror}") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise ServerError(f"{path} exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            try:
                os.unlink(path)  # a socket left by a daemon that died: nobody is listening
            except OSError as exc:
                raise ServerError(
                    f"cannot replace the stale socket {path}: {exc.strerror}"
                ) from exc
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ServerError(f"cannot tell whether {path} is in use: {exc}") from exc
    raise ServerError(f"another daemon is listening on {path}")


def make_folder(path: str, key: str) -> None:
    """Create the folder the file ``path`` of setting ``key`` lives in, if it is missing.

    Named, not a traceback: ``/run/codelegate`` as a uid that may not create it, a path through
    a file. ``doctor`` tells the same beforehand (``cli.folder_problem``).
    """
    try:
        make_parent(path)  # the one place folders of the daemon's files are made
    except OSError as exc:
        folder = os.path.dirname(path)
        raise ServerError(f"cannot create {folder} for {key}: {exc.strerror or exc}") from exc


def bind_unix_socket(path: str, mode: int) -> socket.socket:
    """A Unix stream socket bound at ``path`` with permission bits ``mode``."""
    make_folder(path, "server.socket")
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
    # Listening at once: a daemon started meanwhile sees the socket in use (connecting waits in
    # the backlog until the app serves) rather than a dead one it may replace.
    sock.listen(128)
    return sock


def lock_store(store_path: str) -> int:
    """An exclusive ``flock`` on ``<store>.lock``; its descriptor, held while the store is open.

    The lock is what makes the store one daemon's: two daemons with different sockets but the
    same store are refused as surely as two on one socket. The kernel drops it when the daemon
    dies, however it dies, so a stale lock file never blocks a restart.
    """
    path = absolute(store_path) + ".lock"
    make_folder(path, "store.path")  # the lock is taken before the store opens (and creates it)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ServerError(
            f"cannot open the store lock {path} for store.path: {exc.strerror}"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise ServerError(
            f"another daemon (pid {holder}) is using the store {absolute(store_path)}; "
            "stop it first, or give this one its own [store] path and [server] socket"
        ) from exc
    # Who holds it, for the message above (the lock itself is the flock, not this text).
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def read_token(path: str) -> bytes:
    """The TCP bearer token from ``token_file`` (surrounding whitespace dropped)."""
    try:
        with open(path, "rb") as fh:
            token, mode = fh.read().strip(), os.fstat(fh.fileno()).st_mode
    except OSError as exc:
        raise ServerError(f"cannot read server.token_file: {exc}") from exc
    problem = token_problem(token, mode)  # the same check doctor makes
    if problem:
        raise ServerError(problem)
    return token


def absolute(path: str) -> str:
    """``path`` made absolute against the daemon's cwd."""
    return os.path.abspath(path)


def bind_tcp(value: str) -> socket.socket:
    """A listening TCP socket on ``host:port`` (validated by the config; port 0 in tests)."""
    try:
        return socket.create_server(parse_tcp(value, lowest_port=0))
    except ValueError as exc:
        raise ServerError(f"[server] tcp: {exc}") from exc
    except OSError as exc:
        raise ServerError(f"cannot listen on {value}: {exc.strerror or exc}") from exc


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
    try:
        handle = await start_server(config, activation=True)
    except ServerError as exc:
        _log.error("cannot_start", error=str(exc))  # listeners, store lock or store
        logs.say(f"codelegate: {exc}")
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)  # handlers only set a flag; shutdown is here
    where = [f"unix:{handle.socket_path}"]
    if handle.tcp_port is not None:
        where.append(f"tcp:{config.server.tcp}")
    version = handle.app[STATE].cli_version
    _log.info("listening", on=where, cli_version=version)
    logs.say(f"codelegate listening on {', '.join(where)}")
    if version is None:
        # Serving all the same (the CLI may be installed or mended while it runs), but every run
        # would fail to start until then: said now, not at the first run.
        _log.warning("cli_not_answering", path=config.claude.path)
        logs.say(
            f"codelegate: warning: {config.claude.path} does not answer --version: runs will "
            "fail to start (codelegate doctor tells why)"
        )
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
