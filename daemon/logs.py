"""Structured logs: JSON lines on stdout (journald keeps them), redacted, run ids bound per run.

``run_id`` and ``session_id`` are bound with structlog's contextvars in the task that drives a
run, so every line that run's code logs carries them. Every event goes through the translator's
redaction before it is rendered: a token in an error message or a stderr tail never reaches the
journal.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import msgspec
import structlog

from translator.redact import redact_value

_encoder = msgspec.json.Encoder(enc_hook=repr)


def redact_event(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask credential-shaped keys and values at any depth."""
    return {key: redact_value(value) for key, value in event_dict.items()}


def _render(obj: Any, **_kwargs: Any) -> str:
    # structlog's JSONRenderer passes json.dumps keyword arguments; msgspec takes none of them.
    return _encoder.encode(obj).decode()


def configure(*, level: str = "info", json: bool = True, stream: TextIO | None = None) -> None:
    """Configure structlog (and stdlib logging, for aiohttp's own messages) once, at start-up.

    Lines go to ``stream`` (default: stdout, which journald collects).
    """
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_render)
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_event,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout if stream is None else stream),
        cache_logger_on_first_use=True,
    )
    # aiohttp logs through stdlib logging: send it to stderr at WARNING, without access logs.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
