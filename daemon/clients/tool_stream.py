"""A run's NDJSON frames over a plain Unix socket, for the ``claude_code`` tool.

Standard library only, like :mod:`.tool`. Read with ``select`` so that a caller can look at its
Stop between frames (``http.client`` buffers behind the socket, and a timed-out read leaves its
file object unusable). The request is HTTP/1.0: the daemon then streams the body as it is and
closes at the end, no chunking to undo. Two readers use it: the follower that relays the frames
(tool_follow) and the watch that sees a request end while the tool waits for its answer
(tool_wait).
"""

from __future__ import annotations

import json
import select
import socket
from typing import Any, Final

CONNECT_TIMEOUT_S: Final = 10.0
_MAX_LINE: Final = 16 * 1024 * 1024
_MAX_HEAD: Final = 64 * 1024
_READ: Final = 256 * 1024


class StreamRefused(Exception):
    """The daemon answered the events request with an error status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class EventStream:
    """``GET /v1/runs/{id}/events?after=N`` over a Unix socket, one frame at a time."""

    def __init__(self, path: str, run_id: str, after: int, connect_timeout: float) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(connect_timeout)
            self._sock.connect(path)
            request = (
                f"GET /v1/runs/{run_id}/events?after={after} HTTP/1.0\r\nHost: codelegate\r\n\r\n"
            )
            self._sock.sendall(request.encode("ascii"))
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._buf = bytearray()
        self._head = True
        self._eof = False

    def close(self) -> None:
        self._sock.close()

    def frames(self, wait_s: float) -> list[dict[str, Any]] | None:
        """The frames that arrive within ``wait_s`` (maybe none); None once the stream ended."""
        if self._eof:
            return None
        readable, _, _ = select.select([self._sock], [], [], wait_s)
        if not readable:
            return []
        try:
            data = self._sock.recv(_READ)
        except BlockingIOError:
            return []
        except ConnectionError:
            # A daemon killed with our request unread resets the socket: the stream ended, as
            # at EOF (the reader reconnects, or finds the daemon gone).
            data = b""
        if not data:
            self._eof = True
        self._buf += data
        if self._head and not self._parse_head():
            return []
        out = self._lines()
        if self._eof and not out:
            return None
        return out

    def _parse_head(self) -> bool:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if self._eof or len(self._buf) > _MAX_HEAD:
                raise StreamRefused(0, bytes(self._buf[:512]))
            return False
        head = bytes(self._buf[:end]).decode("latin-1")
        del self._buf[: end + 4]
        self._head = False
        parts = head.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status != 200:
            rest = bytes(self._buf)
            raise StreamRefused(status, rest)
        return True

    def _lines(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            end = self._buf.find(b"\n")
            if end < 0:
                if len(self._buf) > _MAX_LINE:
                    self._buf.clear()  # not a frame the daemon sends; never grow without bound
                if self._eof and self._buf:
                    end = len(self._buf)
                else:
                    return out
            raw = bytes(self._buf[:end])
            del self._buf[: end + 1]
            try:
                frame = json.loads(raw) if raw.strip() else None
            except ValueError:
                frame = None
            if isinstance(frame, dict):
                out.append(frame)
