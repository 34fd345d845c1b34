"""A listener with a cap on its open connections: a flood on one cannot starve the others.

Each listener (the Unix socket, the TCP port) counts its own connections. Past its cap a new
connection is answered ``503`` with the API's JSON error shape and closed at once, so that it
holds a descriptor only for that instant; the refusals are counted in /metrics and logged at
most once per :data:`LOG_EVERY_S`. Idle connections are closed by aiohttp's keep-alive bound
(``[server] idle_timeout_s``, given to the runner), which also runs from the moment a connection
opens: one that never sends a request head is closed after the same bound.

A request aiohttp cannot parse (a control byte in a header, a line too long, not HTTP) gets the
API's JSON error too, instead of aiohttp's plain text that quotes the offending bytes back (a
token among them) and logs a traceback at error level for every such request of any client.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Final, cast

import msgspec
import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from codelegate.daemon.logs import THROTTLE_EVERY_S, Throttle
from codelegate.daemon.metrics import Metrics
from codelegate.daemon.serving.app import error_response, http_refusal
from codelegate.policy.codes import TOO_MANY_CONNECTIONS
from codelegate.policy.errors import PolicyError

_log = structlog.get_logger("codelegate.listeners")

LOG_EVERY_S: Final = THROTTLE_EVERY_S
_BODY: Final = msgspec.json.encode(
    PolicyError(TOO_MANY_CONNECTIONS, "the listener is at its cap; retry").to_json()
)
TURN_AWAY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Connection: close\r\n"
    b"Retry-After: 1\r\n" + f"Content-Length: {len(_BODY)}\r\n\r\n".encode() + _BODY
)


_bad_requests = Throttle(LOG_EVERY_S)


class JsonErrors(RequestHandler):
    """aiohttp's protocol, answering what it cannot parse (and a failure past the middlewares)
    in the API's error shape, without echoing the request's bytes."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            self.log_exception("request_failed", exc_info=exc)  # redacted like every line
        elif count := _bad_requests.due():
            _log.warning(
                "bad_requests",
                status=status,
                error=type(exc).__name__ if exc is not None else None,
                count=count,
                every_s=_bad_requests.every_s,
            )
        if request.writer.output_size > 0:  # as aiohttp: too late for another answer
            raise ConnectionError("the answer had begun; cannot send an error instead")
        if status >= 500:
            response = error_response(http_refusal(status, "internal error; see the log"))
        else:
            kind = type(exc).__name__ if exc is not None else "unknown"
            response = error_response(http_refusal(status, f"malformed HTTP request ({kind})"))
        response.force_close()
        return response


class _TurnAway(asyncio.Protocol):
    """A connection past the cap: the 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.WriteTransport, transport).write(TURN_AWAY)
        transport.close()


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted while it is open."""

    def __init__(self, inner: asyncio.Protocol, gate: Gate) -> None:
        self._inner, self._gate = inner, gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._gate.closed()
        self._inner.connection_lost(exc)


class Gate:
    """The protocol factory of one listener: aiohttp's, under a cap."""

    def __init__(self, server: web.Server, name: str, cap: int, metrics: Metrics) -> None:
        self._server, self.name, self.cap, self._metrics = server, name, cap, metrics
        self.open = 0
        self._refusals = Throttle(LOG_EVERY_S)

    def __call__(self) -> asyncio.Protocol:
        if self.open >= self.cap:
            self._refused()
            return _TurnAway()
        self.open += 1
        self._metrics.connections[self.name] = self.open
        handler = self._server()
        if type(handler) is RequestHandler:
            # Same layout (no slots of its own): only handle_error changes.
            handler.__class__ = JsonErrors
        return _Counted(handler, self)

    def closed(self) -> None:
        self.open -= 1
        self._metrics.connections[self.name] = self.open

    def _refused(self) -> None:
        self._metrics.connections_refused[self.name] += 1
        if count := self._refusals.due():  # a flood: one line per period, not per connection
            _log.warning(
                "connections_refused",
                listener=self.name,
                cap=self.cap,
                refused=count,
                every_s=self._refusals.every_s,
            )


class GatedSite(web.BaseSite):
    """``web.SockSite`` for a socket bound elsewhere, its connections under a :class:`Gate`."""

    def __init__(
        self, runner: web.BaseRunner, sock: socket.socket, *, cap: int, metrics: Metrics
    ) -> None:
        super().__init__(runner)
        self._sock, self._cap, self._metrics = sock, cap, metrics
        self.listener = "unix" if sock.family == socket.AF_UNIX else "tcp"
        self.gate: Gate | None = None

    @property
    def name(self) -> str:
        return f"{self.listener}:{self._sock.getsockname()}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        if server is None:  # pragma: no cover - BaseSite refuses a runner that is not set up
            raise RuntimeError("the runner is not set up")
        self.gate = Gate(server, self.listener, self._cap, self._metrics)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.gate, sock=self._sock, backlog=self._backlog)
