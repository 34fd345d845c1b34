"""Bounds on sizes: texts cut to a number of UTF-8 bytes or characters (DESIGN invariant 7).

Cuts fall on UTF-8 boundaries and leave a marker that starts with ``[`` and says how much was
cut; like the mask, it cannot begin a credential-shaped value, so redacting cut output again
changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable


def cut_marker(cut_bytes: int) -> str:
    """The marker left where ``cut_bytes`` bytes were cut."""
    return f"[...{cut_bytes} bytes cut]"


def bound_text(
    text: str, limit: int, *, dropped: int = 0, settle: Callable[[str], str] | None = None
) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marker included, on a character boundary.

    ``dropped`` counts bytes already removed before this call, so that the marker stays true.
    ``settle`` (redaction) is applied again to what a cut keeps: see :func:`_settle`.
    """
    # Fast path: a str of n characters never encodes to more than 4n bytes, an ASCII one to n.
    if not dropped and (len(text) * 4 <= limit or (text.isascii() and len(text) <= limit)):
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if not dropped and len(raw) <= limit:
        return text
    total = len(raw) + dropped
    room = max(limit - len(cut_marker(total)), 0)
    kept = _byte_prefix(raw, room)
    if settle is not None:
        kept = _settle(
            kept, settle, lambda s: _byte_prefix(s.encode("utf-8", "surrogatepass"), room)
        )
    marker = cut_marker(total - utf8_len(kept))
    return (kept + marker) if len(marker) <= limit else kept


def utf8_len(text: str) -> int:
    """How many bytes ``text`` encodes to: its length when it is ASCII (known without a scan),
    else counted by encoding it."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _byte_prefix(raw: bytes, room: int) -> str:
    # Step back over UTF-8 continuation bytes (10xxxxxx) to land on a character's first byte.
    while room and room < len(raw) and raw[room] & 0xC0 == 0x80:
        room -= 1
    return raw[:room].decode("utf-8", "surrogatepass")


def _settle(kept: str, settle: Callable[[str], str], recut: Callable[[str], str]) -> str:
    # A cut can leave the start of kept text right after a "NAME=" ("password=Bearer [redacted]"
    # cut to "password=B"): redacting the kept part again makes cleaning idempotent. Masks
    # only grow, so a few rounds settle it; if not, keep nothing rather than something unsure.
    for _ in range(4):
        again = settle(kept)
        if again == kept:
            return kept
        kept = recut(again)
    return ""


def bound_chars(
    text: str, limit: int, *, dropped: int = 0, settle: Callable[[str], str] | None = None
) -> str:
    """``text`` cut to at most ``limit`` characters, marker included (O Chat cuts at 240)."""
    if not dropped and len(text) <= limit:
        return text
    total = len(text) + dropped
    room = min(max(limit - len(f"[...{total} chars cut]"), 0), len(text))
    marker = f"[...{total} chars cut]"
    if len(marker) > limit:
        room = limit  # no room for a marker: just the start
    kept = text[:room]
    if settle is not None:
        kept = _settle(kept, settle, lambda s: s[:room])
    marker = f"[...{total - len(kept)} chars cut]"
    return kept + marker if len(kept) + len(marker) <= limit else kept


# The redactor that knows no values, and its methods as the module's functions.
