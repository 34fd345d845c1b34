"""Claiming what is the daemon's before it serves: the store lock and the listening sockets.

The lock on ``<store>.lock`` makes the store one daemon's; the Unix socket is bound with its mode
from the first moment (or taken over from systemd), a stale one replaced only when nobody
listens on it; the optional TCP listener comes with its bearer token. Whatever cannot be had is
a :class:`ServerError`: one line that names the setting and the fix, and ``doctor`` makes the
same checks (the same functions) beforehand.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from collections.abc import Mapping
from typing import Final

from codelegate.daemon.store.queries import make_parent
from codelegate.policy.checks import socket_path_problem, token_problem
from codelegate.policy.config import parse_tcp

SD_LISTEN_FDS_START: Final = 3


class ServerError(Exception):
    """The daemon cannot start: socket in use or not a socket, a folder it cannot create, token
    missing, a store it cannot open … (one line, exit 1)."""


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
    too_long = socket_path_problem(path)  # said before the folder is made for it
    if too_long:
        raise ServerError(f"server.socket: {too_long}")
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


def store_holder(store_path: str) -> str | None:
    """The pid of the daemon holding the store's lock now (as lock_store wrote it), or None
    when none does or this uid cannot tell; creates and takes nothing (for ``doctor``)."""
    try:
        fd = os.open(absolute(store_path) + ".lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    except OSError:
        return None
    finally:
        os.close(fd)  # a shared lock taken goes with it
    return None


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
        host, port = parse_tcp(value, lowest_port=0)
        # An IPv6 literal ("[::1]:8765") needs its family: create_server binds IPv4 by default.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family)
    except ValueError as exc:
        raise ServerError(f"[server] tcp: {exc}") from exc
    except OSError as exc:
        # create_server adds "(while attempting to bind on address …)" to strerror: not again.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.EADDRINUSE:  # doctor says the same (it binds the same way)
            reason += "; stop what listens there (ss -ltnp) or choose another [server] tcp port"
        raise ServerError(f"cannot listen on {value}: {reason}") from exc
