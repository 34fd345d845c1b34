"""Bounds in the units a JavaScript client counts: UTF-16 code units.

O Chat checks ``summary.length <= 240`` and ``text.length <= 16000``, and drops what is longer
rather than cutting it. A character outside the Basic Multilingual Plane (most emoji) is two units
there, so a text bounded in characters can still be dropped: these bounds count units.
"""

from __future__ import annotations

from collections.abc import Callable

from codelegate.translator.bounds import bound_chars
from codelegate.translator.redact import clean_chars


def utf16_units(text: str) -> int:
    """``text``'s length as JavaScript counts it."""
    return len(text.encode("utf-16-le")) // 2


def _fit(text: str, fitted: str, limit: int, bound: Callable[[str, int], str]) -> str:
    # ``fitted`` is ``bound(text, limit)``, cut to ``limit`` characters; fewer are kept until
    # the units fit. Dropping k characters drops at least k units: halving the excess converges.
    if len(fitted) * 2 <= limit:
        return fitted
    cut = len(fitted)
    units = utf16_units(fitted)
    while units > limit:
        cut = max(cut - (units - limit + 1) // 2, 0)
        fitted = bound(text, cut)
        units = utf16_units(fitted)
    return fitted


def bound_units(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-16 units, marker included (nothing redacted)."""
    if len(text) * 2 <= limit:  # the common case: no character is more than two units
        return text
    return _fit(text, bound_chars(text, limit), limit, bound_chars)


def clean_units(text: str, limit: int, clean: Callable[[str, int], str] = clean_chars) -> str:
    """Redacted, then bounded to ``limit`` UTF-16 units (assistant text, card summaries).

    ``clean`` redacts and bounds in characters: the run's redactor's, which knows its secrets.
    """
    fitted = clean(text, limit)
    # The common case (no character is more than two units) without a call.
    return fitted if len(fitted) * 2 <= limit else _fit(text, fitted, limit, clean)
