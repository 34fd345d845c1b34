"""A listener with a cap on its open connections: a flood on one cannot starve the others.

Each listener (the Unix socket, the TCP port) counts its own connections. Past its cap a new
connection is answered ``503`` with the API's JSON error shape and closed at once, so that it
holds a descriptor only for that instant; the refusals are counted in /metrics and logged at
most once per :data:`LOG_EVERY_S`. Idle connections are closed by aiohttp's keep-alive bound
(``[server] idle_timeout_s``, given to the runner), which also runs from the moment a connection
opens: one that never sends a request head is closed after the same bound.

Whoever can connect must not be able to fill the room of the callers (the cancel of a run among
them), and a run's commands can always connect. So on the Unix socket the peer is checked when
its connection is accepted: a refused peer (a process of a run, above all) is answered its 403
and closed at once, never counted. A TCP peer cannot be told at accept, only by its token: when
the TCP listener is full, the oldest connection that has not yet passed the token check is
closed to make room, and the cap turns away (503) only when every open one has.

A request aiohttp cannot parse (a control byte in a header, a line too long, not HTTP) gets the
API's JSON error too, instead of aiohttp's plain text that quotes the offending bytes back (a
token among them) and logs a traceback at error level for every such request of any client.
"""

from __future__ import annotations

import asyncio
import socket
from http import HTTPStatus
from typing import Final, cast

import msgspec
import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from codelegate.daemon.logs import THROTTLE_EVERY_S, Throttle
from codelegate.daemon.metrics import Metrics
from codelegate.daemon.serving import access
from codelegate.daemon.serving.app import error_response, http_refusal
from codelegate.policy.codes import PEER_UNKNOWN, TOO_MANY_CONNECTIONS
from codelegate.policy.config import ServerConfig
from codelegate.policy.errors import PolicyError

_log = structlog.get_logger("codelegate.listeners")

LOG_EVERY_S: Final = THROTTLE_EVERY_S
# Refused peers whose answer may wait, half-closed, for them to read it (Gate._linger): enough
# for every client that is refused by mistake, few descriptors for a run looping on connect().
LINGER_MAX: Final = 64


def answer(refusal: PolicyError, more_headers: bytes = b"") -> bytes:
    """A whole HTTP answer carrying ``refusal``, for a connection closed before its request."""
    body = msgspec.json.encode(refusal.to_json())
    return (
        f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}\r\n".encode()
        + b"Content-Type: application/json\r\nConnection: close\r\n"
        + more_headers
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


TURN_AWAY: Final = answer(
    PolicyError(TOO_MANY_CONNECTIONS, "the listener is at its cap; retry"), b"Retry-After: 1\r\n"
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


class _Connection(asyncio.Protocol):
    """One accepted connection: let in by its :class:`Gate` (then aiohttp's protocol, counted
    while it is open), or answered and closed (at once, or once the peer has read it)."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self._inner: asyncio.Protocol | None = None
        self.transport: asyncio.WriteTransport | None = None
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.WriteTransport, transport)
        self._inner = self._gate.admit(self, self.transport)
        if self._inner is not None:
            self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        # else: a refused peer's request, answered already; dropped

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None  # None: close

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._gate.closed(self)
            self._inner.connection_lost(exc)
        else:
            self._gate.unlinger(self)


class Gate:
    """The protocol factory of one listener: aiohttp's, under a cap, for peers let in."""

    def __init__(
        self, server: web.Server, name: str, cap: int, metrics: Metrics, config: ServerConfig
    ) -> None:
        self._server, self.name, self.cap, self._metrics = server, name, cap, metrics
        self._config = config
        # The connections counted now, oldest first (the TCP listener makes room from the front).
        self._room: dict[_Connection, None] = {}
        self._lingering: set[_Connection] = set()
        self._refusals = Throttle(LOG_EVERY_S)
        self._peers_refused = Throttle(LOG_EVERY_S)

    @property
    def open(self) -> int:
        return len(self._room)

    def __call__(self) -> asyncio.Protocol:
        # Nothing is decided here: the peer is known only once the transport is (connection_made).
        return _Connection(self)

    def admit(
        self, connection: _Connection, transport: asyncio.WriteTransport
    ) -> asyncio.Protocol | None:
        """aiohttp's protocol for a connection let in; None for one answered and closed."""
        refusal = self._peer_refusal(transport)
        if refusal is not None:
            self._refused_peer(refusal)
            self._linger(connection, transport, answer(refusal))
            return None
        if self.open >= self.cap and not self._make_room():
            self._refused()
            self._close_with(transport, TURN_AWAY)
            return None
        self._room[connection] = None
        self._metrics.connections[self.name] = self.open
        handler = self._server()
        if type(handler) is RequestHandler:
            # Same layout (no slots of its own): only handle_error changes.
            handler.__class__ = JsonErrors
        return handler

    def _linger(
        self, connection: _Connection, transport: asyncio.WriteTransport, data: bytes
    ) -> None:
        """Answer a refused peer and close. Closed at once, the peer's request, sent after its
        connect() but before this, would fail (EPIPE) and it would never read why it was
        refused; so, up to LINGER_MAX at a time, the connection is half-closed instead: the
        peer reads the answer and EOF, what it sends is dropped, and it is closed once the peer
        closes, or after idle_timeout_s. Lingering ones are not counted against the cap."""
        transport.write(data)
        if len(self._lingering) >= LINGER_MAX or not transport.can_write_eof():
            transport.close()  # a flood of refused peers: they get only the close
            return
        transport.write_eof()
        self._lingering.add(connection)
        loop = asyncio.get_running_loop()
        connection.deadline = loop.call_later(self._config.idle_timeout_s, transport.abort)

    def close_lingering(self) -> None:
        """At shutdown: aiohttp closes the connections it serves, these are the gate's."""
        for connection in list(self._lingering):
            if connection.transport is not None:
                connection.transport.abort()

    def unlinger(self, connection: _Connection) -> None:
        self._lingering.discard(connection)
        if connection.deadline is not None:
            connection.deadline.cancel()

    def closed(self, connection: _Connection) -> None:
        if connection in self._room:  # not one closed to make room already
            del self._room[connection]
            self._metrics.connections[self.name] = self.open

    def _peer_refusal(self, transport: asyncio.WriteTransport) -> PolicyError | None:
        """The Unix peer's verdict, taken at accept so that a run's connections never count.
        The request check (access.check_access) takes it again at the first request: a peer
        gone by then is refused, as it always was."""
        if self.name != "unix":
            return None
        sock = transport.get_extra_info("socket")
        try:
            return access.unix_refusal(sock, self._config)
        except OSError:  # no credentials to read: as a request would be refused
            return PolicyError(PEER_UNKNOWN, "cannot identify the peer")

    def _make_room(self) -> bool:
        """On TCP, close the oldest connection that has not yet passed the token check: a
        flood of connections without the token cannot keep the callers out. False when every
        open connection has passed it (or on the Unix socket, whose peers are checked)."""
        if self.name != "tcp":
            return False
        oldest = next(
            (
                c
                for c in self._room
                if c.transport is not None and not access.authenticated(c.transport)
            ),
            None,
        )
        if oldest is None or oldest.transport is None:
            return False
        del self._room[oldest]
        oldest.transport.abort()  # at once: a peer that reads nothing cannot hold it open
        self._refused()
        return True

    @staticmethod
    def _close_with(transport: asyncio.WriteTransport, data: bytes) -> None:
        transport.write(data)
        transport.close()

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

    def _refused_peer(self, refusal: PolicyError) -> None:
        # Counted and logged as the request check counts its refusals (a run may loop on it).
        self._metrics.http_errors[refusal.status] += 1
        if count := self._peers_refused.due():
            _log.warning(
                "access_refused", code=refusal.code, listener=self.name, at="accept", count=count
            )


class GatedSite(web.BaseSite):
    """``web.SockSite`` for a socket bound elsewhere, its connections under a :class:`Gate`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        *,
        cap: int,
        metrics: Metrics,
        config: ServerConfig,
    ) -> None:
        super().__init__(runner)
        self._sock, self._cap, self._metrics, self._config = sock, cap, metrics, config
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
        self.gate = Gate(server, self.listener, self._cap, self._metrics, self._config)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.gate, sock=self._sock, backlog=self._backlog)

    async def stop(self) -> None:
        if self.gate is not None:
            self.gate.close_lingering()
        await super().stop()
