"""Prometheus text exposition of the daemon's counters (no client library: a few lines do)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Final

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
        self.frames: Counter[str] = Counter()
        self.diagnostics: Counter[str] = Counter()
        self.ws_connections = 0
        self.http_errors: Counter[int] = Counter()
        # Per listener ("unix", "tcp"): connections open now, and turned away at the cap.
        self.connections: Counter[str] = Counter()
        self.connections_refused: Counter[str] = Counter()
        self._buckets = [0] * len(DURATION_BUCKETS)
        self._duration_sum = 0.0
        self._duration_count = 0

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

        family("codelegate_runs_active", "gauge", "Runs currently running.")
        out.append(f"codelegate_runs_active {runs_active}")
        family("codelegate_runs_started_total", "counter", "Runs spawned since start-up.")
        out.append(f"codelegate_runs_started_total {self.runs_started}")
        family("codelegate_runs_total", "counter", "Finished runs by final status.")
        for status in ("completed", "failed", "cancelled", "timeout", "interrupted"):
            out.append(f'codelegate_runs_total{{status="{status}"}} {self.runs_finished[status]}')
        family("codelegate_runs_refused_total", "counter", "Run requests refused, by error code.")
        for code, n in sorted(self.runs_refused.items()):
            out.append(f'codelegate_runs_refused_total{{code="{code}"}} {n}')
        family("codelegate_frames_total", "counter", "Frames produced by runs, by type.")
        for kind, n in sorted(self.frames.items()):
            out.append(f'codelegate_frames_total{{type="{kind}"}} {n}')
        family("codelegate_diagnostics_total", "counter", "Diagnostic frames, by code.")
        for code, n in sorted(self.diagnostics.items()):
            out.append(f'codelegate_diagnostics_total{{code="{code}"}} {n}')
        family("codelegate_frames_published_total", "counter", "Frames handed to the hub.")
        out.append(f"codelegate_frames_published_total {frames_published}")
        family("codelegate_frames_sent_total", "counter", "Frame deliveries queued to clients.")
        out.append(f"codelegate_frames_sent_total {frames_queued}")
        family("codelegate_subscribers", "gauge", "Connected WebSocket and NDJSON subscribers.")
        out.append(f"codelegate_subscribers {subscribers}")
        family(
            "codelegate_subscribers_dropped_total",
            "counter",
            "Subscribers closed because they fell behind.",
        )
        out.append(f"codelegate_subscribers_dropped_total {subscribers_dropped}")
        family("codelegate_http_errors_total", "counter", "Error answers, by HTTP status.")
        for status_code, n in sorted(self.http_errors.items()):
            out.append(f'codelegate_http_errors_total{{status="{status_code}"}} {n}')
        family("codelegate_connections", "gauge", "Open client connections, by listener.")
        for listener, n in sorted(self.connections.items()):
            out.append(f'codelegate_connections{{listener="{listener}"}} {n}')
        family(
            "codelegate_connections_refused_total",
            "counter",
            "Connections closed at once because their listener was at its cap.",
        )
        for listener, n in sorted(self.connections_refused.items()):
            out.append(f'codelegate_connections_refused_total{{listener="{listener}"}} {n}')
        family(
            "codelegate_log_lines_dropped_total",
            "counter",
            "Log lines that could not be written (stdout closed or full).",
        )
        out.append(f"codelegate_log_lines_dropped_total {log_lines_dropped}")
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
