"""A tool call's arguments as its card carries them: redacted, and bounded as a whole."""

from __future__ import annotations

from typing import Final

import msgspec

from codelegate.translator.bounds import bound_text
from codelegate.translator.inputs import NAME_CHARS, Limits
from codelegate.translator.redact import Redactor

_args_encoder: Final = msgspec.json.Encoder()


def clean_args(
    redactor: Redactor, limits: Limits, raw_args: object, use_id: str
) -> tuple[object, bool]:
    """The cleaned ``raw_args`` of the call ``use_id``, and True when the screen that passed them
    found nothing to mask in ``use_id`` either (then it is its own frame id)."""
    args: object = (
        redactor.clean_flat(raw_args, limits.arg_bytes, limits.items, use_id)
        if type(raw_args) is dict and len(use_id) <= NAME_CHARS
        else None
    )
    screened = args is not None
    if args is None:
        args = redactor.clean_value(raw_args, string_bytes=limits.arg_bytes, items=limits.items)
    encoded = _args_encoder.encode(args)
    if len(encoded) > limits.arg_bytes:
        args = _shrink_args(redactor, args, limits.arg_bytes)
    return args, screened


def _shrink_args(redactor: Redactor, args: object, limit: int) -> object:
    # Too big even with each string bounded: shorter strings first, then the JSON text itself.
    for cap in (limit // 4, limit // 16, 64):
        smaller = redactor.clean_value(args, string_bytes=cap, depth=4, items=16)
        if len(_args_encoder.encode(smaller)) <= limit:
            return smaller
    # Then the JSON text itself, as a string (escaping makes its encoding longer: shrink to fit).
    text = _args_encoder.encode(args).decode()
    cap = limit
    while True:
        cut = bound_text(text, cap)
        if len(_args_encoder.encode(cut)) <= limit:
            return cut
        cap = cap * 3 // 4
