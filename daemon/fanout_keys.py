"""The Redis key scheme of ``[fanout]``: one fact shared by the writer and the readers.

The publisher (:mod:`codelegate.daemon.fanout`) writes these keys and the fleet reader
(:mod:`codelegate.daemon.clients.fleet`) reads them; a backend that follows a fleet reads the
same. Plain functions, no Redis client: a client imports this without the server.
"""

from __future__ import annotations


def stream_key(prefix: str, run_id: str) -> str:
    """The stream of one run's frames."""
    return f"{prefix}:run:{run_id}"


def index_key(prefix: str) -> str:
    """The fleet's index of run starts and ends."""
    return f"{prefix}:runs"


def seq_of(entry_id: bytes | str) -> int:
    """The frame seq an entry id carries (``b"12-0"`` → 12)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])
