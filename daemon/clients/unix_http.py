"""HTTP/1.1 to the daemon over its Unix socket, standard library only (for the tool's modules)."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any, Final

CONNECT_TIMEOUT_S: Final = 10.0


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix stream socket; the Host header is only a placeholder."""

    def __init__(self, socket_path: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
        super().__init__("codelegate", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def post_json(path: str, url: str, body: Any = None) -> tuple[int, Any]:
    """POST ``body`` (JSON; none when None) to ``url``; the status and the decoded answer.

    ``(0, None)`` when the daemon could not be reached or did not answer in JSON.
    """
    return request_json(path, "POST", url, body)


def request_json(path: str, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """``method`` ``url`` with ``body`` (JSON; none when None); as :func:`post_json` answers."""
    conn = UnixHTTPConnection(path)
    try:
        data = b"" if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, url, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, None
    except (OSError, http.client.HTTPException):
        return 0, None
    finally:
        conn.close()
