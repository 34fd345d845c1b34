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
    out = sys.stdout if stream is None else stream
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
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
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
