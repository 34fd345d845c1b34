"""A run as the daemon holds it in memory, around its one description, the :class:`RunRecord`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from codelegate.daemon.runlog import RunLog
from codelegate.daemon.store.queries import RunRecord
from codelegate.daemon.supervision.supervisor import ChildProcess, ExitStatus
from codelegate.policy.config import Config
from codelegate.policy.launch import LaunchPlan
from codelegate.translator import Limits, RunContext, Translator
from codelegate.translator.control import ResultWatch
from codelegate.translator.frames import FinalResult

Stopping = Literal["cancelled", "timeout"]


class RunState(RunRecord, kw_only=True):
    """``GET /v1/runs/{id}``: the run's record, and the requests still waiting for a person
    (its status stays ``running`` meanwhile)."""

    pending_approvals: list[str] = msgspec.field(default_factory=list)


@dataclass(eq=False)
class Run:
    """A run the daemon holds in memory: live, or recently finished.

    ``record`` is what is known about it — what ``GET /v1/runs/{id}`` answers and the store
    keeps —, kept current as frames go out (``last_seq``) and when it ends.
    """

    record: RunRecord
    translator: Translator
    plan: LaunchPlan
    log: RunLog  # its frames in memory
    stopping: Stopping | None = None
    child: ChildProcess | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # A cancel's interrupt: its watch for the turn's result (the output is no longer
    # translated), set when it came. The closing frames go out on it, before the CLI exits.
    interrupt: ResultWatch | None = None
    turn_ended: asyncio.Event = field(default_factory=asyncio.Event)
    # The last process of the run is gone (set after ``done`` when an interrupt ended the turn).
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    settling: bool = False
    # How the CLI exited, once it has (after ``done`` when an interrupt ended the turn).
    exit_status: ExitStatus | None = None

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def result(self) -> FinalResult | None:
        """The final result once the run has ended (the translator makes and holds it)."""
        return self.translator.result


def run_context(
    rec: RunRecord,
    *,
    parent_session_id: str | None = None,
    revision_base: int = 0,
    sequence_base: int = 0,
) -> RunContext:
    """The translator's context of the run ``rec`` describes (a new run's, or a recovered one's:
    there the Work Room marks come back from the stored frames)."""
    return RunContext(
        run_id=rec.run_id,
        cwd=rec.cwd,
        mode=rec.mode,
        parent_tool_call_id=rec.parent_tool_call_id,
        parent_session_id=parent_session_id,
        session_id=rec.session_id,
        resumed=rec.resumed,
        started_at=rec.created_at,
        revision_base=revision_base,
        sequence_base=sequence_base,
    )


def finish_record(
    rec: RunRecord,
    result: FinalResult | None,
    exit_code: int | None,
    now: float,
    *,
    without_result: str = "failed",
) -> RunRecord:
    """``rec`` as its run ended: the final result's status (``without_result`` when there is no
    result), the result's JSON, the exit code and the time."""
    rec.status = result.status if result is not None else without_result
    rec.result = msgspec.Raw(msgspec.json.encode(result)) if result is not None else None
    rec.exit_code = exit_code
    rec.finished_at = now
    return rec


# The translator's bounds the operator does not set: the translator's own (O Chat's, the
# design's), named here so that a new Limits field is a decision, not a silent default.
FIXED_LIMITS: Final = frozenset(
    {"summary_chars", "error_chars", "items", "held_lines", "denials", "stderr_chars"}
)


def translator_limits(config: Config) -> Limits:
    """The translator's bounds: the operator's ``[limits]`` where they set one (FIXED_LIMITS
    otherwise)."""
    ours = config.limits
    return Limits(
        arg_bytes=ours.arg_bytes,
        result_bytes=ours.result_bytes,
        final_result_bytes=ours.final_result_bytes,
        line_bytes=ours.line_bytes,
        text_chars=ours.text_chars,
    )
