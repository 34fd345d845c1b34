"""The one door through which a client connection follows runs.

A connection (``daemon/serving/streams.py``) attaches its subscriber, subscribes to a run or
follows every run, unsubscribes and detaches here, and only here. Subscribing decides where the
frames come from: a run in memory replays from its :class:`~codelegate.daemon.runlog.RunLog`
(what was trimmed from it, from the store) and, while it is live, joins the hub for what
follows, with no await in between (the theory of operation is in ``daemon/hub.py``); a run
only the store knows replays from the store, page by page as the client drains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from codelegate.daemon.deliveries import Delivery, Fetch, Replay
from codelegate.daemon.hub import Hub
from codelegate.daemon.record import Run
from codelegate.daemon.store.store import RunStore
from codelegate.daemon.subscriber import Subscriber

Kind = Literal["unknown", "live", "finished"]


class Subscriptions:
    """Subscribers and the runs they follow, over the hub, the runs in memory and the store."""

    def __init__(
        self,
        hub: Hub,
        store: RunStore,
        *,
        find: Callable[[str], Run | None],
        live: Callable[[], Iterable[Run]],
    ) -> None:
        self._hub = hub
        self._store = store
        self._find = find  # a run held in memory, live or recently finished
        self._live = live  # the runs running now

    def attach(self, sub: Subscriber) -> None:
        """A new connection's subscriber (before it subscribes to anything)."""
        self._hub.attach(sub)

    def detach(self, sub: Subscriber) -> None:
        """The connection ended: forget its subscriber."""
        self._hub.detach(sub)

    def unsubscribe(self, sub: Subscriber, run_id: str) -> None:
        """Stop live frames of ``run_id`` (``"*"`` stops following all runs)."""
        self._hub.leave(sub, run_id)

    async def subscribe(self, sub: Subscriber, run_id: str, after: int) -> Kind:
        """Queue the frames of ``run_id`` after ``after`` and, if it is live, follow it.

        Replaces whatever ``sub`` still had queued for the run (a repeated subscribe does not
        stack replays).
        """
        self._hub.leave(sub, run_id)  # a subscribe replaces the last one for the run
        run = self._find(run_id)
        if run is not None:
            log = run.log
            stored = None
            if log.trimmed_after(after):
                # The start of a long run's log was trimmed from memory: the store answers for
                # it (also for frames not written yet), up to where the log begins.
                stored = Replay(run_id, self._stored_pages(run_id), after, log.first_seq - 1)
            snapshot = log.after(after)
            if run.done.is_set() or log.ended:
                # run_result is out (the store may still be catching up): nothing live follows.
                sub.forget(run_id)
                sub.replay(snapshot, stored=stored)
                return "finished"
            # No await between reading the log and joining: no gap, no duplicate.
            self._hub.join(sub, run_id, snapshot, after, stored=stored)
            return "live"
        rec = await self._store.get_run(run_id)
        if rec is None:
            return "unknown"
        # Not in memory means finished and flushed: the store holds every frame it keeps.
        sub.forget(run_id)
        sub.replay((), stored=Replay(run_id, self._stored_pages(run_id), after))
        return "finished"

    def follow_all(self, sub: Subscriber, after: int) -> None:
        """Follow every run, new ones too, after replaying the live runs' frames after ``after``."""
        self._hub.leave(sub, "*")  # replaces the last follow
        snapshot = [d for run in self._live() for d in run.log.after(after)]
        self._hub.join_all(sub, snapshot, after)

    def _stored_pages(self, run_id: str) -> Fetch:
        """Pages of ``run_id``'s stored frames, for a :class:`Replay`."""
        store = self._store

        async def fetch(after: int, limit: int) -> list[Delivery]:
            rows = await store.frames_page(run_id, after, limit)
            return [Delivery(run_id, seq, data) for seq, data in rows]

        return fetch
