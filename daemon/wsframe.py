"""WebSocket framing (RFC 6455 5.2) of what the daemon sends: unfragmented text frames.

The hub builds a batch's frame bytes once and hands the same bytes to every WebSocket client
(see ``daemon/hub.py``), so the framing is ours rather than aiohttp's. A server's frames are
never masked, and the daemon sends no compressed ones (each client would need its own bytes).
"""

from __future__ import annotations

import struct
from typing import Final

_TEXT: Final = 0x81  # FIN and the text opcode
_PACK_LEN16: Final = struct.Struct("!BBH").pack
_PACK_LEN64: Final = struct.Struct("!BBQ").pack
# The headers of payloads under 126 bytes, the commonest by far, made once.
_SHORT_HEADERS: Final = tuple(bytes((_TEXT, n)) for n in range(126))


def text_header(n: int) -> bytes:
    """The header of a text frame with an ``n``-byte payload."""
    if n < 126:
        return _SHORT_HEADERS[n]
    if n < 65536:
        return _PACK_LEN16(_TEXT, 126, n)
    return _PACK_LEN64(_TEXT, 127, n)


def text_frame(payload: bytes) -> bytes:
    """One text frame carrying ``payload``."""
    return text_header(len(payload)) + payload
