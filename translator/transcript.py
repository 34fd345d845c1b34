"""A whole transcript at once: the face of ``codelegate translate`` and of the benchmark."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

import msgspec

from codelegate.translator.core import Translator
from codelegate.translator.inputs import Limits, Outcome, RunContext
from codelegate.translator.redact import Redactor

_encoder: Final = msgspec.json.Encoder()
_EXITED: Final = Outcome(reason="exited", exit_code=0)


def translate_chunks(
    chunks: Iterable[bytes],
    ctx: RunContext,
    *,
    outcome: Outcome = _EXITED,
    limits: Limits | None = None,
    now: float | None = None,
    redactor: Redactor | None = None,
) -> Iterator[bytes]:
    """NDJSON frame lines (``b"...\\n"``), one block per input chunk, for stream-json chunks.

    Time is fixed (``now``, default ``ctx.started_at``) so that a transcript always gives the
    same output. Frames are encoded once, a chunk's worth at a time.
    """
    at = ctx.started_at if now is None else now
    translator = Translator(ctx, limits, redactor)
    encode = _encoder.encode_lines
    frames = translator.start(at)
    if frames:
        yield encode(frames)
    for chunk in chunks:
        frames = translator.receive_data(chunk, at)
        if frames:
            yield encode(frames)
    yield encode(translator.close(outcome, at))


def translate_transcript(
    data: bytes,
    ctx: RunContext,
    *,
    outcome: Outcome = _EXITED,
    limits: Limits | None = None,
) -> Iterator[bytes]:
    """NDJSON frame lines for a whole stream-json transcript (``codelegate translate FILE``)."""
    return translate_chunks((data,), ctx, outcome=outcome, limits=limits)
