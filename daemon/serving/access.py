"""Who may talk to the daemon: SO_PEERCRED on the Unix socket, a bearer token on TCP.

Unix peers are checked against ``[server] allowed_uids`` / ``allowed_gids`` (empty lists: the
daemon's own uid only), and a peer that is a process of a run is refused whatever its uid: a
command a run executes has the daemon's uid, and through the API it could start runs in any
root with any allowed mode (widening its own policy), cancel or read every other run. TCP
requests must carry ``Authorization: Bearer <token>`` (compared in constant time) and, when a
browser sends an ``Origin``, that origin must be listed in ``allowed_origins`` — a page on
another site must not drive runs through a local listener.
"""

from __future__ import annotations

import errno
import hmac
import os
import platform
import signal
import socket
import struct
import weakref
from typing import Any, Final

from aiohttp import web

from codelegate.daemon.supervision import cgroups, procs
from codelegate.policy.codes import (
    ORIGIN_NOT_ALLOWED,
    PEER_IS_A_RUN,
    PEER_NOT_ALLOWED,
    PEER_UNKNOWN,
    UNAUTHORIZED,
)
from codelegate.policy.config import ServerConfig
from codelegate.policy.errors import PolicyError

_UCRED: Final = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}

# How far up its parent chain a peer is followed. A client's chain is a handful deep (terminal,
# shell, client); a longer one is not told apart, and is refused for the daemon's uid.
MAX_ANCESTORS: Final = 64
# SO_PEERPIDFD (Linux 6.5+) is not in the socket module; its number is the generic one, which
# these machines use (others have their own numbers: no pidfd there, see _peer_pidfd).
_SO_PEERPIDFD: Final = 77
_GENERIC_SOCKOPTS: Final = platform.machine() in ("x86_64", "aarch64", "riscv64", "i686")

# One verdict per Unix connection: the peer's credentials are those of its connect() and do not
# change, and walking /proc on every request of a kept-alive connection would be wasted work.
_verdicts: weakref.WeakKeyDictionary[Any, PolicyError | None] = weakref.WeakKeyDictionary()
# The TCP connections (transports) on which a request has passed the check: when the listener
# is full, only the others may be closed to make room (listeners.Gate).
_authenticated: weakref.WeakSet[Any] = weakref.WeakSet()


def authenticated(transport: Any) -> bool:
    """Whether a request on this TCP connection has presented the token (and been let in)."""
    return transport in _authenticated


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def _supplementary_groups(pid: int) -> set[int]:
    """The peer's supplementary groups, from /proc (best effort: empty when unreadable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:] if g.isdigit()}
    except OSError:
        pass
    return set()


def ids_allowed(pid: int, uid: int, gid: int, server: ServerConfig) -> bool:
    """Whether the peer's uid or one of its groups is allowed."""
    if not server.allowed_uids and not server.allowed_gids:
        return uid == os.getuid()
    if uid in server.allowed_uids or gid in server.allowed_gids:
        return True
    return bool(server.allowed_gids) and bool(_supplementary_groups(pid) & set(server.allowed_gids))


def run_signal(pid: int) -> str | None:
    """What says ``pid`` is a process of a run ("run marker", "run cgroup", "descendant of the
    daemon"), or None. OSError when the process cannot be inspected or its ancestry is not
    resolved (deeper than MAX_ANCESTORS, an ancestor that vanished meanwhile).

    Ancestry is the proof (see ``procs.run_ancestry``: it holds for ``env -i``, ``setsid`` and
    double forks, as long as the daemon is a child subreaper); the marker (cheap, but a run can
    scrub it) and the run cgroup (where runs get one) also catch a process of a run of another
    daemon of the same uid, and orphans of a daemon that could not become a subreaper.
    """
    if procs.carries_a_marker(pid):
        return "run marker"
    if cgroups.in_a_run_cgroup(pid):
        return "run cgroup"
    descends = procs.run_ancestry(pid, MAX_ANCESTORS)
    if descends is None:
        raise OSError(errno.ELOOP, f"the ancestry of pid {pid} is not resolved")
    return "descendant of the daemon" if descends else None


def _peer_pidfd(sock: socket.socket) -> int | None:
    """A pidfd of the peer that connected (it pins that process, whatever its pid becomes), or
    None where the kernel has none. OSError when the peer is gone already."""
    if not _GENERIC_SOCKOPTS:
        return None
    try:
        return int(sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD))
    except OSError as exc:
        if exc.errno == errno.ENOPROTOOPT:  # before Linux 6.5
            return None
        raise


def _still_alive(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except PermissionError:  # another uid's process: alive, not ours to signal
        return True
    except OSError:
        return False
    return True


def unix_refusal(sock: socket.socket, server: ServerConfig) -> PolicyError | None:
    """None when the Unix peer may proceed; else the refusal to answer with."""
    pid, uid, gid = peer_credentials(sock)
    if not ids_allowed(pid, uid, gid, server):
        return PolicyError(PEER_NOT_ALLOWED, "this user may not use the daemon's socket")
    if pid == os.getpid():  # the daemon itself (in-process clients, tests)
        return None
    try:
        pidfd = _peer_pidfd(sock)
        try:
            why = run_signal(pid)
            # /proc was read by pid: if the peer has been reaped meanwhile, what was read may
            # belong to a process that got its pid since, so nothing read can be trusted.
            if pidfd is not None and not _still_alive(pidfd):
                raise ProcessLookupError(pid)
        finally:
            if pidfd is not None:
                os.close(pidfd)
    except OSError:
        if uid != os.getuid():
            return None  # another allowed uid, its /proc hidden from us: runs have our uid
        return PolicyError(PEER_UNKNOWN, "cannot tell whether the peer is a process of a run")
    if why is not None:
        return PolicyError(PEER_IS_A_RUN, f"a run's processes may not use the daemon ({why})")
    return None


def bearer_ok(header: str | None, token: bytes | None) -> bool:
    """Whether ``Authorization`` carries the token (constant-time compare)."""
    if token is None or header is None:
        return False
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # aiohttp decodes header bytes with surrogateescape: this gives back the bytes sent, so a
    # stray non-UTF-8 byte is a wrong token (401), not an encoding error (a 500 whose repr
    # carried the token into the log).
    return hmac.compare_digest(presented.strip().encode("utf-8", "surrogateescape"), token)


def check_access(
    request: web.Request, server: ServerConfig, token: bytes | None
) -> PolicyError | None:
    """None when the request may proceed; else the refusal to answer with."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return PolicyError(PEER_UNKNOWN, "cannot identify the peer")
    if sock.family == socket.AF_UNIX:
        if transport not in _verdicts:
            _verdicts[transport] = unix_refusal(sock, server)
        return _verdicts[transport]
    if not bearer_ok(request.headers.get("Authorization"), token):
        return PolicyError(UNAUTHORIZED, "send Authorization: Bearer <token>")
    origin = request.headers.get("Origin")
    if origin is not None and origin not in server.allowed_origins:
        return PolicyError(ORIGIN_NOT_ALLOWED, f"origin {origin[:200]!r} is not allowed")
    _authenticated.add(transport)
    return None
