"""A run as the daemon holds it in memory, and the JSON state of ``GET /v1/runs/{id}``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from codelegate.daemon.hub import Delivery
from codelegate.daemon.store.store import RunRecord
from codelegate.daemon.supervision.supervisor import ChildProcess
from codelegate.policy.config import Config
from codelegate.policy.launch import LaunchPlan
from codelegate.translator import Limits, Translator
from codelegate.translator.control import ResultWatch
from codelegate.translator.frames import FinalResult

Stopping = Literal["cancelled", "timeout"]


class Refused(Exception):
    """Refused by the daemon's own state (capacity, busy session); shaped like PolicyError."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(eq=False)
class Run:
    """A run the daemon holds in memory: live, or recently finished."""

    run_id: str
    cwd: str
    mode: str
    session_id: str
    resumed: bool
    parent_tool_call_id: str | None
    created_at: float
    translator: Translator
    plan: LaunchPlan
    log: list[Delivery] = field(default_factory=list)
    status: str = "running"
    result: FinalResult | None = None
    finished_at: float | None = None
    exit_code: int | None = None
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

    @property
    def last_seq(self) -> int:
        """The seq of the last frame published."""
        return self.log[-1].seq if self.log else 0

    def state(self) -> dict[str, Any]:
        """The JSON body of ``GET /v1/runs/{id}``."""
        return {
            "run_id": self.run_id,
            "status": self.status,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "cwd": self.cwd,
            "mode": self.mode,
            "session_id": self.session_id,
            "resumed": self.resumed,
            "parent_tool_call_id": self.parent_tool_call_id,
            "last_seq": self.last_seq,
            "exit_code": self.exit_code,
            "result": msgspec.to_builtins(self.result) if self.result is not None else None,
            # Requests waiting for a person (the run's status stays ``running`` meanwhile).
            "pending_approvals": list(self.translator.pending),
        }


def record_state(rec: RunRecord) -> dict[str, Any]:
    """The JSON body of ``GET /v1/runs/{id}`` for a run known only to the store."""
    result = msgspec.json.decode(rec.result) if rec.result else None
    return {
        "run_id": rec.run_id,
        "status": rec.status,
        "created_at": rec.created_at,
        "finished_at": rec.finished_at,
        "cwd": rec.cwd,
        "mode": rec.mode,
        "session_id": rec.session_id,
        "resumed": rec.resumed,
        "parent_tool_call_id": rec.parent_tool_call_id,
        "last_seq": rec.last_seq,
        "exit_code": rec.exit_code,
        "result": result,
        "pending_approvals": [],
    }


def translator_limits(config: Config) -> Limits:
    """The translator's bounds from the operator's ``[limits]`` (fields both sides know)."""
    ours = msgspec.structs.asdict(config.limits)
    known = {f.name for f in msgspec.structs.fields(Limits)}
    return Limits(**{k: v for k, v in ours.items() if k in known})
