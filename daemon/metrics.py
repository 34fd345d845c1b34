"""Prometheus text exposition of the daemon's counters (no client library: a few lines do)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from codelegate.translator.frames import Diagnostic, Frame

if TYPE_CHECKING:
    from codelegate.daemon.fanout import FanoutStats

# Run durations in seconds; a delegated coding task takes seconds to tens of minutes.
DURATION_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class Metrics:
    """Counters the run manager and the app update; :meth:`render` writes them out."""

    def __init__(self) -> None:
        self.runs_started = 0
        self.runs_finished: Counter[str] = Counter()
        self.runs_refused: Counter[str] = Counter()
        self._frame_types: Counter[type[Frame]] = Counter()
        self.diagnostics: Counter[str] = Counter()
        self.ws_connections = 0
        self.http_errors: Counter[int] = Counter()
        # Per listener ("unix", "tcp"): connections open now, and turned away at the cap.
        self.connections: Counter[str] = Counter()
        self.connections_refused: Counter[str] = Counter()
        self._buckets = [0] * len(DURATION_BUCKETS)
        self._duration_sum = 0.0
        self._duration_count = 0

    def count_frames(self, frames: Sequence[Frame]) -> None:
        """Count frames a run produced, by type, and the diagnostics among them, by code."""
        types = self._frame_types
        for frame in frames:  # by type: the tag is looked up when /metrics is read
            types[type(frame)] += 1
            if isinstance(frame, Diagnostic):
                self.diagnostics[frame.code] += frame.count

    @property
    def frames(self) -> Counter[str]:
        """Frames produced by runs, by type (the frame's ``type`` tag)."""
        return Counter({str(t.__struct_config__.tag): n for t, n in self._frame_types.items() if n})

    def observe_duration(self, seconds: float) -> None:
        """Record one finished run's wall-clock duration."""
        self._duration_sum += seconds
        self._duration_count += 1
        for i, bound in enumerate(DURATION_BUCKETS):
            if seconds <= bound:
                self._buckets[i] += 1

    def render(
        self,
        *,
        runs_active: int,
        subscribers: int,
        frames_published: int,
        frames_queued: int,
        subscribers_dropped: int,
        log_lines_dropped: int,
    ) -> str:
        """The text format (version 0.0.4) for ``GET /metrics``."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        def one(name: str, kind: str, help_text: str, value: int) -> None:
            family(name, kind, help_text)
            out.append(f"{name} {value}")

        def by(name: str, kind: str, help_text: str, label: str, values: Iterable[Any]) -> None:
            family(name, kind, help_text)
            out.extend(f'{name}{{{label}="{key}"}} {n}' for key, n in values)

        one("codelegate_runs_active", "gauge", "Runs currently running.", runs_active)
        one(
            "codelegate_runs_started_total",
            "counter",
            "Runs spawned since start-up.",
            self.runs_started,
        )
        statuses = ("completed", "failed", "cancelled", "timeout", "interrupted")
        runs = self.runs_finished
        by(
            "codelegate_runs_total",
            "counter",
            "Finished runs by final status.",
            "status",
            ((status, runs[status]) for status in statuses),
        )
        counted = (
            (
                "runs_refused_total",
                "Run requests refused, by error code.",
                "code",
                self.runs_refused,
            ),
            ("frames_total", "Frames produced by runs, by type.", "type", self.frames),
            ("diagnostics_total", "Diagnostic frames, by code.", "code", self.diagnostics),
        )
        for name, help_text, label, values in counted:
            by(f"codelegate_{name}", "counter", help_text, label, sorted(values.items()))
        one(
            "codelegate_frames_published_total",
            "counter",
            "Frames handed to the hub.",
            frames_published,
        )
        one(
            "codelegate_frames_sent_total",
            "counter",
            "Frame deliveries queued to clients.",
            frames_queued,
        )
        one(
            "codelegate_subscribers",
            "gauge",
            "Connected WebSocket and NDJSON subscribers.",
            subscribers,
        )
        one(
            "codelegate_subscribers_dropped_total",
            "counter",
            "Subscribers closed because they fell behind.",
            subscribers_dropped,
        )
        by(
            "codelegate_http_errors_total",
            "counter",
            "Error answers, by HTTP status.",
            "status",
            sorted(self.http_errors.items()),
        )
        by(
            "codelegate_connections",
            "gauge",
            "Open client connections, by listener.",
            "listener",
            sorted(self.connections.items()),
        )
        by(
            "codelegate_connections_refused_total",
            "counter",
            "Connections closed at once because their listener was at its cap.",
            "listener",
            sorted(self.connections_refused.items()),
        )
        one(
            "codelegate_log_lines_dropped_total",
            "counter",
            "Log lines that could not be written (stdout closed or full).",
            log_lines_dropped,
        )
        family("codelegate_run_duration_seconds", "histogram", "Wall-clock duration of runs.")
        for bound, n in zip(DURATION_BUCKETS, self._buckets, strict=True):
            out.append(f'codelegate_run_duration_seconds_bucket{{le="{bound:g}"}} {n}')
        out.append(f'codelegate_run_duration_seconds_bucket{{le="+Inf"}} {self._duration_count}')
        out.append(f"codelegate_run_duration_seconds_sum {self._duration_sum:.3f}")
        out.append(f"codelegate_run_duration_seconds_count {self._duration_count}")
        return "\n".join(out) + "\n"


def render_fanout(stats: FanoutStats, *, behind: int) -> str:
    """The ``[fanout]`` families (only when it is configured), in the same text format."""
    families = (
        ("published_total", "counter", "Frame entries Redis accepted.", stats.published),
        ("pending", "gauge", "Frames queued for Redis or being sent.", stats.pending),
        (
            "failed_total",
            "counter",
            "Frame entries not published (Redis gone or erring); filled in from the store.",
            stats.failed,
        ),
        (
            "duplicates_total",
            "counter",
            "Frame entries Redis refused as already there (a resend, not a double).",
            stats.duplicates,
        ),
        (
            "deferred_total",
            "counter",
            "Frames not queued live (backlog full or run behind); sent from the store.",
            stats.deferred,
        ),
        ("runs_behind", "gauge", "Runs whose stream is being filled from the store.", behind),
        (
            "index_entries_total",
            "counter",
            "Run starts and ends added to the index.",
            stats.index_entries,
        ),
    )
    out: list[str] = []
    for name, kind, help_text, value in families:
        out.append(f"# HELP codelegate_fanout_{name} {help_text}")
        out.append(f"# TYPE codelegate_fanout_{name} {kind}")
        out.append(f"codelegate_fanout_{name} {value}")
    return "\n".join(out) + "\n"
