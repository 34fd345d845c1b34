"""``GET /v1/runs``: the recent runs a page at a time, bounded in runs and in bytes.

Each run is listed whole, final result included (README "HTTP API"), so a page of many large
results could take megabytes; a page therefore ends before :data:`LISTING_BYTES` of JSON (a run
larger on its own is a page by itself), and ``next_before`` names its last run while more
follow. The store reads rows one at a time and stops near the same bound
(:func:`~codelegate.daemon.store.queries.runs_page`), so neither the daemon's memory nor the
answer grows with the store or with ``limit``. What memory holds of a run (live, or finished
and maybe not written yet) stands in for its row, and live runs not stored yet join in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

import msgspec

from codelegate.daemon.record import RunState
from codelegate.daemon.store.queries import RunRecord, cursor_of
from codelegate.daemon.store.store import RunStore
from codelegate.policy.codes import RUN_NOT_FOUND
from codelegate.policy.errors import PolicyError

# A page's bytes: at 64 KiB of final result at most a run (the default), 16 runs or more.
LISTING_BYTES: Final = 1024 * 1024
_HEAD: Final = b'{"runs":['
_TAIL: Final = b'],"next_before":'


class Listing:
    """The pages of ``GET /v1/runs``, from the store and the runs in memory."""

    def __init__(
        self,
        store: RunStore,
        *,
        held: Callable[[str], RunRecord | None],
        live: Callable[[], Iterable[RunRecord]],
        show: Callable[[RunRecord], RunState],
    ) -> None:
        self._store = store
        self._held = held  # the record of a run held in memory, live or recently finished
        self._live = live  # those of the runs running now (a new one may not be stored yet)
        self._show = show  # a record as the API shows it

    async def records(self, limit: int, before: str | None) -> tuple[list[RunRecord], bool]:
        """Up to ``limit`` runs newest first, after the run ``before`` names (404 when it names
        none), and whether more follow."""
        cursor = None
        if before is not None:
            named = self._held(before) or await self._store.get_run(before)
            if named is None:
                raise PolicyError(RUN_NOT_FOUND, "before: no run with that id")
            cursor = cursor_of(named)
        stored, more = await self._store.runs_page(limit, before=cursor, max_bytes=LISTING_BYTES)
        states: dict[str, RunRecord] = {}
        for rec in stored:
            states[rec.run_id] = self._held(rec.run_id) or rec
        # Past the store's last row, while more follow, the next page has what comes after.
        floor = cursor_of(stored[-1]) if more and stored else None
        for live in self._live():
            at = cursor_of(live)
            if (cursor is None or at < cursor) and (floor is None or at > floor):
                states.setdefault(live.run_id, live)
        ordered = sorted(states.values(), key=cursor_of, reverse=True)
        return ordered[:limit], more or len(ordered) > limit

    async def page(self, limit: int, before: str | None) -> bytes:
        """The JSON answer: ``{"runs": [state, …], "next_before": run_id | null}``."""
        records, more = await self.records(limit, before)
        pieces = [_HEAD]  # joined once: the answer is copied once
        size, listed = len(_HEAD), 0
        for rec in records:
            part = msgspec.json.encode(self._show(rec))
            # What the answer would be if it ended at this run: its id the cursor.
            ending = len(_TAIL) + len(msgspec.json.encode(rec.run_id)) + 1
            if listed and size + 1 + len(part) + ending > LISTING_BYTES:
                more = True
                break
            if listed:
                pieces.append(b",")
            pieces.append(part)
            size += len(part) + (1 if listed else 0)
            listed += 1
        last = records[listed - 1].run_id if more and listed else None
        pieces += (_TAIL, msgspec.json.encode(last), b"}")
        return b"".join(pieces)
