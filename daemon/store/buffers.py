"""The run store's write buffers: each run's unwritten frames and final status, in turn.

What ``daemon/store/store.py``'s module docstring says of writing, order and caps happens here,
without the event loop: frames wait per run, a batch takes up to :data:`QUANTUM` of each waiting
run in turn (round-robin) within its frame and byte budget, a run's final status joins a batch
only once every earlier frame of the run is in it or written, and a failed batch goes back to
the front, in order. The store owns the writer, the timer and the waiters around it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final

from codelegate.daemon.store.queries import Finish, Frame

QUANTUM: Final = 32  # frames a batch takes from one run before the next run's turn
UNCAPPED: Final = 1 << 62

Batch = tuple[list[Frame], dict[str, Finish]]


class _Pending:
    """One run's unwritten frames and final status, and how much of the run the store keeps."""

    __slots__ = ("finish", "frames", "not_stored", "queued", "stored_bytes", "stored_frames")

    def __init__(self) -> None:
        self.frames: deque[Frame] = deque()
        self.finish: Finish | None = None
        self.queued = False  # in the writer's round-robin turn
        self.stored_frames = 0  # accepted for storing (written or buffered)
        self.stored_bytes = 0
        self.not_stored = 0  # past the cap: delivered live only

    @property
    def empty(self) -> bool:
        return not self.frames and self.finish is None


class Buffers:
    """Every run's unwritten frames and final status, and the batch being written."""

    def __init__(self, *, batch_frames: int, batch_bytes: int, max_frames: int, max_bytes: int):
        self.batch_frames = batch_frames
        self._batch_bytes = batch_bytes
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self._pending: dict[str, _Pending] = {}
        self._turn: deque[str] = deque()  # runs with something to write, in round-robin order
        self.buffered = 0  # frames waiting in the buffers (not in flight)
        self.inflight: Batch | None = None

    @property
    def waiting(self) -> bool:
        """Some run has something to write."""
        return bool(self._turn)

    def _of(self, run_id: str) -> _Pending:
        pending = self._pending.get(run_id)
        if pending is None:
            pending = self._pending[run_id] = _Pending()
        return pending

    def _queue(self, run_id: str, pending: _Pending) -> None:
        if not pending.queued:
            pending.queued = True
            self._turn.append(run_id)

    def extend(self, run_id: str, frames: Sequence[Frame], always: bool | Sequence[bool]) -> int:
        """Buffer frames of ``run_id``, in order; returns how many were past the run's cap and
        not stored (``always``, for all of them or for each: stored anyway)."""
        pending = self._of(run_id)
        size = sum([len(frame[2]) for frame in frames])
        kept: Sequence[Frame]
        if (
            pending.stored_frames + len(frames) <= self._max_frames
            and pending.stored_bytes + size <= self._max_bytes
        ):  # all within the cap, the usual case: one check for the lot
            kept = frames
            pending.stored_frames += len(frames)
            pending.stored_bytes += size
        else:  # the cap is reached among these: frame by frame
            kept = []
            for i, frame in enumerate(frames):
                size = len(frame[2])
                if not (always if isinstance(always, bool) else always[i]) and (
                    pending.stored_frames >= self._max_frames
                    or pending.stored_bytes + size > self._max_bytes
                ):
                    pending.not_stored += 1
                    continue
                pending.stored_frames += 1
                pending.stored_bytes += size
                kept.append(frame)
        if kept:
            pending.frames.extend(kept)
            self._queue(run_id, pending)
            self.buffered += len(kept)
        return len(frames) - len(kept)

    def finish(self, run_id: str, finish: Finish) -> None:
        """Buffer the run's final status (it goes after every frame of the run buffered so far)."""
        pending = self._of(run_id)
        pending.finish = finish
        self._queue(run_id, pending)

    def not_stored(self, run_id: str) -> int:
        """Frames of ``run_id`` past its cap, delivered live but not stored."""
        pending = self._pending.get(run_id)
        return pending.not_stored if pending is not None else 0

    def take(self) -> Batch:
        """The next batch: up to QUANTUM frames of each waiting run in turn, bounded in size."""
        frames: list[Frame] = []
        finishes: dict[str, Finish] = {}
        budget, room = self.batch_frames, self._batch_bytes
        turn = self._turn
        while turn and len(frames) < budget and room > 0:
            run_id = turn.popleft()
            pending = self._pending[run_id]
            queue = pending.frames
            for _ in range(min(QUANTUM, budget - len(frames), len(queue))):
                frame = queue.popleft()
                frames.append(frame)
                room -= len(frame[2])
                if room <= 0:
                    break
            if not queue and pending.finish is not None:
                # Every earlier frame of the run is in this batch or written: the finish may go.
                finishes[run_id] = pending.finish
                pending.finish = None
            if pending.empty:
                pending.queued = False
            else:
                turn.append(run_id)
        self.buffered -= len(frames)
        return frames, finishes

    def restore(self, batch: Batch) -> None:
        """Put a failed batch back at the front of its runs' buffers, in order."""
        frames, finishes = batch
        by_run: dict[str, list[Frame]] = {}
        for frame in frames:
            by_run.setdefault(frame[0], []).append(frame)
        for run_id, run_frames in by_run.items():
            self._of(run_id).frames.extendleft(reversed(run_frames))
        for run_id, finish in finishes.items():
            pending = self._of(run_id)
            if pending.finish is None:  # a newer finish of that run wins
                pending.finish = finish
        for run_id in {*by_run, *finishes}:
            pending = self._pending[run_id]
            if not pending.queued:
                pending.queued = True
                self._turn.appendleft(run_id)
        self.buffered += len(frames)

    def forget_finished(self, finishes: dict[str, Finish]) -> None:
        """Runs whose final status is written and nothing more waits: nothing to account for."""
        for run_id in finishes:
            pending = self._pending.get(run_id)
            if pending is not None and pending.empty:
                del self._pending[run_id]

    def counts(self) -> tuple[int, int]:
        """Frames and final statuses buffered or being written."""
        frames = self.buffered
        finishes = sum(p.finish is not None for p in self._pending.values())
        if self.inflight is not None:
            frames += len(self.inflight[0])
            finishes += len(self.inflight[1])
        return frames, finishes

    def unwritten_runs(self) -> list[str]:
        """The runs with something buffered, sorted."""
        return sorted(rid for rid, p in self._pending.items() if not p.empty)

    def unwritten_of(self, run_id: str) -> tuple[list[Frame], Finish | None]:
        """``run_id``'s frames and final status not written yet (buffered or in flight)."""
        frames: list[Frame] = []
        finish: Finish | None = None
        if self.inflight is not None:
            frames.extend(f for f in self.inflight[0] if f[0] == run_id)
            finish = self.inflight[1].get(run_id)
        pending = self._pending.get(run_id)
        if pending is not None:
            frames.extend(pending.frames)
            if pending.finish is not None:
                finish = pending.finish
        return frames, finish
