"""One run's frames in memory: the one place they are appended, trimmed, published and read.

The log is what a subscriber replays from before it follows the run live, so appending to it
and publishing to the hub are one synchronous step here (see the theory of operation in
``daemon/hub.py``); ``daemon/subscriptions.py`` reads it and joins the hub without awaiting.
Memory is bounded per run: past ``keep`` frames (and a quarter more, so that trimming is rare)
the oldest go, and a subscriber asking for them gets them from the store.
"""

from __future__ import annotations

from collections.abc import Sequence

from codelegate.daemon.deliveries import Delivery
from codelegate.daemon.hub import Hub


class RunLog:
    """The last ``keep`` (up to ``keep * 5 // 4``) frames a run published, in order."""

    __slots__ = ("_frames", "_hub", "_keep", "run_id")

    def __init__(self, run_id: str, hub: Hub, keep: int) -> None:
        self.run_id = run_id
        self._hub = hub
        self._keep = keep
        self._frames: list[Delivery] = []

    def publish(self, batch: Sequence[Delivery]) -> None:
        """Append ``batch``, trim, and hand it to the hub; never awaits."""
        frames = self._frames
        frames.extend(batch)
        keep = self._keep
        if len(frames) > keep + keep // 4:
            del frames[: len(frames) - keep]  # older frames are replayed from the store
        self._hub.publish_batch(self.run_id, batch)

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def first_seq(self) -> int:
        """The seq of the oldest frame held (0 before the first)."""
        return self._frames[0].seq if self._frames else 0

    @property
    def last_seq(self) -> int:
        """The seq of the last frame published (0 before the first)."""
        return self._frames[-1].seq if self._frames else 0

    @property
    def ended(self) -> bool:
        """The run's ``run_result`` is out: nothing follows it."""
        return bool(self._frames) and self._frames[-1].last

    def after(self, seq: int) -> list[Delivery]:
        """The frames held with a seq above ``seq``, in order."""
        return [d for d in self._frames if d.seq > seq]

    def trimmed_after(self, seq: int) -> bool:
        """Frames after ``seq`` were trimmed from memory (the store has them)."""
        return bool(self._frames) and self._frames[0].seq > seq + 1
