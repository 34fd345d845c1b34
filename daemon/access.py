"""Who may talk to the daemon: SO_PEERCRED on the Unix socket, a bearer token on TCP.

Unix peers are checked against ``[server] allowed_uids`` / ``allowed_gids`` (empty lists: the
daemon's own uid only). TCP requests must carry ``Authorization: Bearer <token>`` (compared in
constant time) and, when a browser sends an ``Origin``, that origin must be listed in
``allowed_origins`` — a page on another site must not drive runs through a local listener.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
from typing import Final

from aiohttp import web

from policy.config import ServerConfig

_UCRED: Final = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}

Refusal = tuple[int, str, str]


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


def unix_peer_allowed(sock: socket.socket, server: ServerConfig) -> bool:
    """Whether the peer's uid or one of its groups is allowed."""
    pid, uid, gid = peer_credentials(sock)
    if not server.allowed_uids and not server.allowed_gids:
        return uid == os.getuid()
    if uid in server.allowed_uids or gid in server.allowed_gids:
        return True
    return bool(server.allowed_gids) and bool(_supplementary_groups(pid) & set(server.allowed_gids))


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


def check_access(request: web.Request, server: ServerConfig, token: bytes | None) -> Refusal | None:
    """None when the request may proceed; else (status, code, message)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return (403, "peer_unknown", "cannot identify the peer")
    if sock.family == socket.AF_UNIX:
        if unix_peer_allowed(sock, server):
            return None
        return (403, "peer_not_allowed", "this user may not use the daemon's socket")
    if not bearer_ok(request.headers.get("Authorization"), token):
        return (401, "unauthorized", "send Authorization: Bearer <token>")
    origin = request.headers.get("Origin")
    if origin is not None and origin not in server.allowed_origins:
        return (403, "origin_not_allowed", f"origin {origin[:200]!r} is not allowed")
    return None
