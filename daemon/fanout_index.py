"""The fleet's index of run starts and ends (``<prefix>:runs``), each entry added once.

A run's first and last frames, once Redis has added them, owe an entry of the index (``run_id``,
``host_id``, ``status`` — ``running`` at the start, the final status at the end — and
``invocationId`` when the run has one); the publisher (``daemon/fanout.py``) sends what is owed
with its next pipeline, so a frame sent twice, which Redis skips, owes no second entry. The
entries of a pipeline that failed midway are *unsure* (a stopped Redis runs what it had read
once it resumes): they are looked up in the index before they are sent again. The starts added
since Redis last failed are not owed again when a stream is refilled from seq 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
import structlog
from redis.asyncio import Redis

from codelegate.daemon.deliveries import Delivery
from codelegate.daemon.fanout_keys import index_key, seq_of

_log = structlog.get_logger("codelegate.fanout")

# An unsure entry is looked for among the index entries added since it was sent, less this
# margin for the clocks of this host and Redis (entry ids are Redis's milliseconds), at most this
# many entries.
UNSURE_MARGIN_MS: Final = 60_000
UNSURE_SCAN: Final = 10_000


class _Head(msgspec.Struct):
    """What the index needs of a frame (``result`` is a text in tool_result frames)."""

    type: str = ""
    invocationId: str | None = None
    result: Any = None


_head: Final = msgspec.json.Decoder(_Head)


def ends_run(data: bytes | str) -> bool:
    """The frame is a run's ``run_result``."""
    return _head.decode(data).type == "run_result"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class IndexEntry(msgspec.Struct, frozen=True):
    """One run start or end for the index: its XADD arguments, and when it was last sent."""

    run_id: str
    status: str
    args: tuple[Any, ...]
    sent_ms: int = 0


class FleetIndex:
    """This host's entries of the index: owed, unsure, and the starts known to be there."""

    def __init__(self, prefix: str, host_id: str, maxlen_runs: int) -> None:
        self.key = index_key(prefix)
        self.host_id = host_id
        self._trim = ("XADD", self.key, "MAXLEN", "~", 2 * maxlen_runs, "*")
        self.owed: list[IndexEntry] = []  # to send with the next pipeline
        self._unsure: list[IndexEntry] = []  # sent by a pipeline that failed: Redis may have them
        # Starts of live runs added since Redis last failed: a start owed again is not re-added
        # (after a failure Redis may have come back empty, and then it is).
        self._added: set[str] = set()

    @property
    def pending(self) -> bool:
        """Entries wait to be sent (or looked up first)."""
        return bool(self.owed or self._unsure)

    def entries(self, d: Delivery) -> list[IndexEntry]:
        """The entries a run's first or last frame makes (none for the frames between)."""
        head = _head.decode(d.data)
        fields: list[Any] = ["run_id", d.run_id, "host_id", self.host_id]
        if head.invocationId is not None:
            fields += ["invocationId", head.invocationId]
        trim = self._trim
        entries = []
        if d.seq == 1:
            entries.append(IndexEntry(d.run_id, "running", (*trim, *fields, "status", "running")))
        if d.last:
            result = head.result if isinstance(head.result, dict) else {}
            status = str(result.get("status") or "failed")
            entries.append(IndexEntry(d.run_id, status, (*trim, *fields, "status", status)))
        return entries

    def _known(self, *kept: Sequence[IndexEntry]) -> set[tuple[str, str]]:
        known = {(e.run_id, e.status) for entries in kept for e in entries}
        known.update((run_id, "running") for run_id in self._added)
        return known

    def owe(self, entries: Iterable[IndexEntry]) -> None:
        """Queue entries, once each (a stream refilled from seq 1 owes its start again)."""
        known = self._known(self.owed, self._unsure)
        for entry in entries:
            if (entry.run_id, entry.status) not in known:
                self.owed.append(entry)
                known.add((entry.run_id, entry.status))

    def frame_added(self, d: Delivery) -> None:
        """Redis added ``d``: a run's first or last frame owes its entries now."""
        if d.seq == 1 or d.last:
            self.owe(self.entries(d))

    def take(self) -> list[IndexEntry]:
        """What is owed, for the pipeline being built."""
        owed, self.owed = self.owed, []
        return owed

    def failed(self, chunk: Sequence[Delivery], sent: Sequence[IndexEntry]) -> None:
        """The pipeline carrying ``sent`` and ``chunk`` failed. Redis may have run some of it
        (its answer is what got lost): the entries sent, and those of first and last frames
        sent, are looked up before next time."""
        sent_ms = int(time.time() * 1000)
        maybe = [e for d in chunk if d.seq == 1 or d.last for e in self.entries(d)]
        self._unsure.extend(msgspec.structs.replace(e, sent_ms=sent_ms) for e in sent)
        known = self._known(self._unsure)
        self._unsure.extend(
            msgspec.structs.replace(e, sent_ms=sent_ms)
            for e in maybe
            if (e.run_id, e.status) not in known
        )

    def answered(self, sent: Sequence[IndexEntry], answers: Sequence[Any]) -> int:
        """Account for Redis's answers to ``sent``; returns the entries added."""
        added = 0
        for entry, answer in zip(sent, answers, strict=False):
            if isinstance(answer, Exception):
                _log.warning("fanout_index_failed", error=str(answer)[:200])
                self.owed.append(entry)  # tried again with the next pipeline
            else:
                added += 1
                if entry.status == "running":
                    self._added.add(entry.run_id)
                else:
                    self._added.discard(entry.run_id)  # the run is over
        return added

    def lost(self) -> None:
        """Redis is unreachable: it may come back empty, without the starts it had."""
        self._added.clear()

    async def resolve_unsure(self, client: Redis) -> None:
        """Owe again only the unsure entries Redis does not have (one XRANGE of the index)."""
        if not self._unsure:
            return
        since = min(e.sent_ms for e in self._unsure) - UNSURE_MARGIN_MS
        found = await client.xrange(self.key, min=f"{max(0, since)}", max="+", count=UNSURE_SCAN)
        there = {
            (fields.get(b"run_id"), fields.get(b"host_id"), fields.get(b"status"))
            for _, fields in found or ()
            if fields
        }
        host = self.host_id.encode()
        unsure, self._unsure = self._unsure, []
        self.owe(e for e in unsure if (e.run_id.encode(), host, e.status.encode()) not in there)

    async def read(self, client: Redis) -> tuple[set[tuple[str, str]], int]:
        """This host's (run_id, status) entries in the index, and its oldest entry's time (0
        for an empty index: then every run's entries are owed)."""
        entries = await client.xrange(self.key, "-", "+")
        if not entries:
            return set(), 0
        host = self.host_id.encode()
        have = {
            (_text(fields.get(b"run_id", b"")), _text(fields.get(b"status", b"")))
            for _, fields in entries
            if fields and fields.get(b"host_id") == host
        }
        return have, seq_of(entries[0][0] or b"0")
