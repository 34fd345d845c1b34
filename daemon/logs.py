"""Structured logs: JSON lines on stdout (journald keeps them), redacted, run ids bound per run.

``run_id`` and ``session_id`` are bound with structlog's contextvars in the task that drives a
run, so every line that run's code logs carries them. Every event goes through the translator's
redaction before it is rendered: a token in an error message, an exception's text or a stderr
tail never reaches the journal. Values the daemon knows to be secret (the TCP bearer token, the
credentials every run is passed) are registered with :func:`mask_known` at start-up and masked
wherever they appear, whatever their shape or encoding: also in lines that belong to no run
(aiohttp's own, a traceback).

Logging never breaks serving: a line that cannot be written (stdout a closed pipe, a log
collector that died, a full disk) is dropped and counted (:func:`lines_dropped`, in /metrics),
never raised into a request or the shutdown; and a reader that stops reading (``serve | less``,
a stalled collector) blocks a writer thread, never the event loop.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import MutableMapping
from typing import Any, Final, TextIO, cast

import msgspec
import structlog

from codelegate.translator.redact import PLAIN, Redactor

_encoder = msgspec.json.Encoder(enc_hook=repr)
QUEUE_LINES: Final = 10_000  # lines waiting for a slow stdout; past it new ones are dropped
EXIT_DRAIN_S: Final = 2.0  # how long the exit waits for queued lines to go out
_JSON_SCALARS: Final = (str, int, float, bool, type(None))
_known: set[str] = set()
# The translator's redaction with every value registered so far (all their encodings); replaced
# as a whole when one is added, so a line being rendered in another thread sees one or the other.
_redactor: Redactor = PLAIN


def mask_known(*secrets: bytes | str) -> None:
    """Mask these values in every later log line, in each form the translator knows (as is,
    JSON- and URL-escaped, hex, base64) and as they read inside an exception's repr."""
    global _redactor
    before = len(_known)
    for secret in secrets:
        text = secret.decode("utf-8", "surrogateescape") if isinstance(secret, bytes) else secret
        _known.update((text, repr(text)[1:-1]))
    if len(_known) != before:
        _redactor = Redactor(_known)


def _plain(value: Any) -> Any:
    """JSON-shaped data: anything else (an exception, a path) becomes its repr, so that the
    redaction sees its text; a value rendered later by the encoder would bypass it."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else repr(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return repr(value)


def redact_event(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask credential-shaped keys and values at any depth, and the values
    registered with :func:`mask_known` in any encoding.

    Runs after ``format_exc_info``, so the ``exception`` field (a traceback with its messages)
    is redacted like every other field.
    """
    redact = _redactor.value
    return {key: redact(_plain(value)) for key, value in event_dict.items()}


def _unicode_safe(value: Any) -> Any:
    # A header or path decoded with surrogateescape holds lone surrogates, which UTF-8 (and so
    # the encoder) refuses; they are written as escapes instead of losing the line.
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_unicode_safe(k): _unicode_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unicode_safe(item) for item in value]
    return value


def _render(obj: Any, **_kwargs: Any) -> str:
    # structlog's JSONRenderer passes json.dumps keyword arguments; msgspec takes none of them.
    try:
        return _encoder.encode(obj).decode()
    except UnicodeEncodeError:
        return _encoder.encode(_unicode_safe(obj)).decode()


# How often a line about what any client can cause at will is logged, at most.
THROTTLE_EVERY_S: Final = 10.0


class Throttle:
    """At most one log line per period for an event any client can cause at will."""

    def __init__(self, every_s: float = THROTTLE_EVERY_S) -> None:
        self.every_s = every_s
        self._unlogged = 0
        self._next = 0.0

    def due(self) -> int:
        """0 while quiet; else how many events the line now due stands for."""
        self._unlogged += 1
        now = time.monotonic()
        if now < self._next:
            return 0
        count, self._unlogged, self._next = self._unlogged, 0, now + self.every_s
        return count


class LineSink:
    """Where log lines go: a file descriptor (stdout) or a text stream (tests).

    Writes to the descriptor are unbuffered ``os.write`` calls, so that nothing is left in a
    Python buffer whose flush at exit would fail again. A write that fails is dropped and
    counted; it never raises.
    """

    def __init__(self, *, fd: int = 1, stream: TextIO | None = None) -> None:
        self._fd, self._stream = fd, stream
        self._lock = threading.Lock()  # lines from structlog and stdlib logging, any thread
        self.dropped = 0

    def write(self, text: str) -> int:
        with self._lock:
            try:
                if self._stream is not None:
                    self._stream.write(text)
                    self._stream.flush()
                else:
                    self._write_fd(text.encode("utf-8", "backslashreplace"))
            except (OSError, ValueError):  # EPIPE, EBADF, ENOSPC; ValueError: a closed stream
                self.dropped += 1
        return len(text)

    def _write_fd(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except InterruptedError:
                continue
            except BlockingIOError:  # a non-blocking stdout that is full: drop, never wait
                raise OSError(errno.EAGAIN, "log output would block") from None

    def flush(self) -> None:
        """Nothing to do: every write goes out at once."""


class QueuedSink(LineSink):
    """A :class:`LineSink` on a descriptor whose writes never wait: a writer thread does them.

    A pipe whose reader stopped reading fills up and blocks that thread, not the caller (the
    event loop); lines past ``limit`` are dropped and counted. :meth:`drain` (at exit) waits a
    bounded time for what is queued.
    """

    def __init__(self, fd: int, limit: int = QUEUE_LINES) -> None:
        super().__init__(fd=fd)
        self._limit = limit
        self._lines: deque[str] = deque()
        self._changed = threading.Condition(self._lock)
        self._writing = 0  # lines taken by the thread and not yet written
        self._thread: threading.Thread | None = None

    def write(self, text: str) -> int:
        with self._changed:
            if len(self._lines) >= self._limit:
                self.dropped += 1
                return len(text)
            self._lines.append(text)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
                self._thread.start()
            self._changed.notify_all()
        return len(text)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._lines:
                    self._changed.wait()
                batch = list(self._lines)
                self._lines.clear()
                self._writing = len(batch)
            try:
                self._write_fd("".join(batch).encode("utf-8", "backslashreplace"))
            except OSError:
                with self._changed:
                    self.dropped += len(batch)
            finally:
                with self._changed:
                    self._writing = 0
                    self._changed.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued line is written or dropped; False after ``timeout_s``."""
        end = time.monotonic() + timeout_s
        with self._changed:
            while self._lines or self._writing:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True


_sink: LineSink | None = None
_stderr = LineSink(fd=2)


def lines_dropped() -> int:
    """Log lines that could not be written since :func:`configure`."""
    return _sink.dropped if _sink is not None else 0


def say(text: str) -> None:
    """One line for the operator on stderr (start-up, refusal); never raises."""
    _stderr.write(text + "\n")


def configure(
    *, level: str = "info", json: bool = True, stream: TextIO | None = None, cache: bool = True
) -> None:
    """Configure structlog (and stdlib logging, for aiohttp's own messages) once, at start-up.

    Lines go to ``stream`` (default: stdout, which journald collects). ``cache``: each module's
    logger keeps what it was bound to on first use (``serve``: configured once); off, a later
    configuration reaches loggers used before it (the tests configure one per test).
    """
    global _sink
    out: LineSink
    if stream is not None:
        out = LineSink(stream=stream)
    else:
        # fd 1 itself, not sys.stdout: that is None when the daemon was started without one.
        out = QueuedSink(fd=1)
        atexit.register(out.drain, EXIT_DRAIN_S)
    _sink = out
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_render)
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, redact_event, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # WriteLogger writes each line in one call (PrintLogger writes the newline apart).
        logger_factory=structlog.WriteLoggerFactory(cast(TextIO, out)),
        cache_logger_on_first_use=cache,
    )
    # aiohttp and asyncio log through stdlib logging: the same JSON lines, redacted, at WARNING
    # and above (no access log: requests are counted in /metrics).
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact_event,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
