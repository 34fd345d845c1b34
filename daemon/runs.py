"""One run's life: policy → spawn → translate → publish → store → result.

:class:`RunManager` asks policy for every decision before anything is spawned (a refused request
spawns nothing), then has the run's CLI driven (``daemon/driving.py``, which also tells how a
cancel stops it): stdout chunks go through the run's :class:`Translator`, each frame is encoded
once, appended to the run's in-memory frame log, queued for the store and published to the hub
in one synchronous step — which is what makes a subscriber's snapshot + live atomic (see
``daemon/hub.py``).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import structlog

from codelegate.daemon.approvals import Approvals
from codelegate.daemon.deliveries import Delivery
from codelegate.daemon.driving import Driver
from codelegate.daemon.hub import Hub
from codelegate.daemon.listing import Listing
from codelegate.daemon.metrics import Metrics
from codelegate.daemon.record import (
    Run,
    RunState,
    Stopping,
    finish_record,
    run_context,
    translator_limits,
)
from codelegate.daemon.recovery import recover_runs
from codelegate.daemon.runlog import RunLog
from codelegate.daemon.steering import send_input
from codelegate.daemon.store.queries import RunRecord
from codelegate.daemon.store.store import RunStore, StoreError
from codelegate.daemon.subscriptions import Subscriptions
from codelegate.daemon.supervision.supervisor import can_enter
from codelegate.daemon.tasks import spawn
from codelegate.policy.codes import SESSION_BUSY, TOO_MANY_RUNS
from codelegate.policy.config import Config
from codelegate.policy.errors import PolicyError
from codelegate.policy.launch import (
    RUN_MARKER_VAR,
    check_resume,
    parse_session_id,
    plan_launch,
    resolve_mode,
    resolve_workspace,
)
from codelegate.policy.request import RunRequest
from codelegate.translator import Outcome, Redactor, Translator
from codelegate.translator.frames import (
    ApprovalNeeded,
    ApprovalResolved,
    AskUser,
    Frame,
    RunResult,
    encode_frame,
)

_log = structlog.get_logger("codelegate.runs")

# Finished runs kept in memory for replay without a store round trip.
RECENT_RUNS: Final = 64
# Stored even past a run's frame cap: the audit of what was asked and answered stays whole.
_ALWAYS_STORED: Final = (ApprovalNeeded, AskUser, ApprovalResolved)


class RunManager:
    """Starts, follows, cancels and records runs; the app's single authority over them."""

    def __init__(
        self,
        config: Config,
        store: RunStore,
        hub: Hub,
        metrics: Metrics,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._store = store
        self._hub = hub
        self._metrics = metrics
        self._environ = dict(os.environ if environ is None else environ)
        self._limits = translator_limits(config)
        self._keep_frames = config.limits.replay_frames
        self._active: dict[str, Run] = {}
        self._recent: OrderedDict[str, Run] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.approvals = Approvals(store, self._emit, config.approvals.timeout_s)
        self._driver = Driver(config, self._limits.line_bytes, self._emit_output, self._tasks)
        # The door clients follow runs through (the runs' logs, the hub, the store).
        self.subscriptions = Subscriptions(hub, store, find=self.get, live=self._active.values)
        # The pages of GET /v1/runs, likewise.
        live = self._active.values
        self.listing = Listing(
            store, held=self.held, live=lambda: [r.record for r in live()], show=self.shown
        )

    # -- queries ---------------------------------------------------------------------------

    @property
    def active_count(self) -> int:
        """Runs currently running."""
        return len(self._active)

    def get(self, run_id: str) -> Run | None:
        """A run held in memory (live or recently finished)."""
        return self._active.get(run_id) or self._recent.get(run_id)

    def held(self, run_id: str) -> RunRecord | None:
        """The record of a run held in memory (live or recently finished), if it is held."""
        run = self.get(run_id)
        return run.record if run is not None else None

    async def state(self, run_id: str) -> RunRecord | None:
        """A run's record from memory or the store; None when unknown."""
        return self.held(run_id) or await self._store.get_run(run_id)

    def shown(self, rec: RunRecord) -> RunState:
        """``rec`` as the API shows it: with the requests a person may still answer."""
        run = self.get(rec.run_id)
        pending = list(run.translator.approvals.pending) if run is not None else []
        return RunState(**msgspec.structs.asdict(rec), pending_approvals=pending)

    # -- starting --------------------------------------------------------------------------

    async def start(self, request: RunRequest) -> Run:
        """Decide everything through policy, then spawn; a PolicyError spawns nothing."""
        resolve_mode(self.config, request.mode)  # refuse a bad mode before touching anything
        cwd = resolve_workspace(
            self.config,
            request.cwd,
            realpath=os.path.realpath,
            isdir=os.path.isdir,
            can_enter=can_enter,
        )
        run_id = str(uuid.uuid4())
        if request.resume is not None:
            session_id = parse_session_id(request.resume)
            # A session this daemon is running right now (its record may not be written yet).
            owner = next(
                (r.record.cwd for r in self._active.values() if r.record.session_id == session_id),
                None,
            )
            if owner is None:
                owner = await self._store.session_owner(session_id)
            check_resume(session_id, owner, cwd)
            resumed = True
        else:
            session_id = str(uuid.uuid4())
            resumed = False
        parent = request.parent
        # The last await before registration: the marks read from memory stay current.
        revision, sequence = (
            await self._work_room_marks(parent.tool_call_id) if parent is not None else (0, 0)
        )
        # Capacity checks and registration happen with no await in between, so two concurrent
        # requests cannot both take the last slot or the same session.
        if len(self._active) >= self.config.policy.max_concurrent_runs:
            raise PolicyError(TOO_MANY_RUNS, "too many runs are running; retry later")
        if any(r.record.session_id == session_id for r in self._active.values()):
            raise PolicyError(SESSION_BUSY, "that session is already running")
        plan = plan_launch(
            self.config,
            request,
            cwd=cwd,
            session_id=session_id,
            resumed=resumed,
            parent_env=self._environ,
            marker=(RUN_MARKER_VAR, run_id),
        )
        rec = RunRecord(
            run_id=run_id,
            created_at=time.time(),
            cwd=cwd,
            mode=plan.mode,
            session_id=session_id,
            resumed=resumed,
            parent_tool_call_id=parent.tool_call_id if parent is not None else None,
        )
        ctx = run_context(
            rec,
            parent_session_id=parent.session_id if parent is not None else None,
            revision_base=revision,
            sequence_base=sequence,
        )
        run = Run(
            record=rec,
            # The run's redactor knows the credentials policy passes to this CLI: it masks them
            # in frames, in the stderr tail and in what the run logs.
            translator=Translator(ctx, self._limits, Redactor(plan.secrets), self.config.approvals),
            plan=plan,
            log=RunLog(run_id, self._hub, self._keep_frames),
        )
        # From here on nothing awaits: a caller that hangs up cannot leave a half-started run.
        self._active[run_id] = run
        self._metrics.runs_started += 1
        task = spawn(self._drive(run), name=f"run:{run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        _log.info(
            "run_started",
            run_id=run_id,
            session_id=session_id,
            resumed=resumed,
            mode=plan.mode,
            cwd=cwd,
        )
        return run

    async def _work_room_marks(self, parent_tool_call_id: str) -> tuple[int, int]:
        """Where a run under this parent tool call continues O Chat's Work Room.

        A follow-up prompt comes under the same parent: its stateRevision must pass every
        earlier run's (O Chat ignores a revision it has seen as stale) and its rows go below
        theirs. The store keeps what finished runs reached; runs still running, or finished
        and maybe not written yet, are read from memory (no await after that read).
        """
        revision, sequence = await self._store.invocation_marks(parent_tool_call_id)
        for run in (*self._active.values(), *self._recent.values()):
            if run.record.parent_tool_call_id == parent_tool_call_id:
                revision = max(revision, run.translator.revision)
                sequence = max(sequence, run.translator.activity_sequence)
        return revision, sequence

    async def _keep_work_room_marks(self, run: Run) -> None:
        parent = run.record.parent_tool_call_id
        if parent is None:
            return
        translator = run.translator
        try:
            await self._store.advance_invocation(
                parent, translator.revision, translator.activity_sequence
            )
        except StoreError as exc:  # kept in memory while the run is recent; logged
            _log.error("store_invocation_failed", error=str(exc))
        except Exception as exc:  # never keep the run's waiters waiting
            _log.exception("store_invocation_failed", error=repr(exc))

    def send_input(self, run_id: str, text: str) -> dict[str, Any]:
        """Steering: ``text`` as a user message to the run's CLI; 409 once it is ending."""
        limits = self.config.limits
        return send_input(
            self._active.get(run_id),
            text,
            max_unread=limits.pending_inputs,
            max_unread_bytes=limits.pending_input_cap,
        )

    # -- cancelling ------------------------------------------------------------------------

    def cancel(self, run_id: str, reason: Stopping = "cancelled") -> bool:
        """Mark the run stopped (no later output is translated), then signal its processes."""
        run = self._active.get(run_id)
        if run is None:
            return False
        if run.stopping is None:
            # Pending requests first: answered "cancel" before the interrupt drops them.
            self.approvals.resolve_all(run, "cancel")
            run.stopping = reason
            _log.info("run_stopping", run_id=run_id, reason=reason)
            if run.child is not None:
                self._driver.interrupt(run, run.child)
                spawn(self._driver.terminate(run, run.child), name=f"terminate:{run_id}")
        return True

    # -- driving ---------------------------------------------------------------------------

    def _emit_output(self, run: Run, frames: list[Frame]) -> None:
        """Frames of the CLI's output, then the control lines and requests they brought: the
        answers go out before stdin can close."""
        self._emit(run, frames)
        self.approvals.after_data(run, frames)

    def _emit(self, run: Run, frames: list[Frame], *, keep: bool = False) -> None:
        """Encode once; log, store and publish in one synchronous step.

        Past the run's ``[limits]`` store cap frames are published but not stored, except with
        ``keep`` (the closing frames); the first one not stored is followed by a
        ``frames_not_stored`` diagnostic, and the total comes before ``run_result``.
        """
        if not frames:
            return
        run_id = run.run_id
        # Per frame only what each frame needs (its bytes, once); the store, the metrics and the
        # run log take the chunk's frames as one batch.
        batch: list[Delivery] = []
        rows: list[tuple[str, int, bytes]] = []
        marked = False  # a frame stored even past the cap is among them
        for frame in frames:
            data = encode_frame(frame)
            seq = frame.seq
            batch.append(Delivery(run_id, seq, data, isinstance(frame, RunResult)))
            rows.append((run_id, seq, data))
            marked = marked or isinstance(frame, _ALWAYS_STORED)
        store = self._store
        always: bool | list[bool] = keep
        if marked and not keep:
            always = [isinstance(frame, _ALWAYS_STORED) for frame in frames]
        capped = store.append_frames(run_id, rows, always) > 0
        self._metrics.count_frames(frames)
        run.log.publish(batch)  # memory bounded there; older frames replay from the store
        run.record.last_seq = batch[-1].seq
        if capped:
            # Said once, when the first frame is not stored; the translator keeps the count and
            # sends the total with its closing frames.
            told = run.translator.frames_not_stored(store.not_stored(run_id), time.time())
            if told:
                self._emit(run, told, keep=True)

    async def _drive(self, run: Run) -> None:
        structlog.contextvars.bind_contextvars(run_id=run.run_id, session_id=run.record.session_id)
        outcome = Outcome(reason="cancelled")
        try:
            outcome = await self._supervise(run)
        except asyncio.CancelledError:
            # The daemon is going down hard: stop the process, record the run as cancelled.
            run.stopping = run.stopping or "cancelled"
            if run.child is not None:
                await asyncio.shield(run.child.terminate(self.config.policy.cancel_grace_s))
            outcome = Outcome(reason="cancelled")
            raise
        except Exception as exc:
            _log.exception("run_supervision_failed", error=run.translator.redactor.text(repr(exc)))
            run.stopping = run.stopping or "cancelled"  # drop whatever the process still says
            if run.child is not None:
                await run.child.terminate(self.config.policy.cancel_grace_s)
            outcome = Outcome(reason="spawn_failed", stderr_tail="daemon error while supervising")
        finally:
            await asyncio.shield(self._finish(run, outcome))
            if not run.settling:
                run.settled.set()
            else:
                await self._record_exit(run)

    async def _record_exit(self, run: Run) -> None:
        # An interrupt ended the turn: the closing frames went out before the CLI exited, so
        # the run's result says no exit code; its record gets it once the process is gone.
        await run.settled.wait()
        status = run.exit_status
        if status is None or status.exit_code is None or run.record.exit_code is not None:
            return
        run.record.exit_code = status.exit_code
        try:
            await self._store.finish_run(run.record)
        except StoreError as exc:
            _log.error("store_finish_failed", error=str(exc))

    async def _supervise(self, run: Run) -> Outcome:
        try:
            await self._store.create_run(run.record)
        except StoreError as exc:
            _log.error("store_create_failed", error=str(exc))
            return Outcome(reason="spawn_failed", stderr_tail="the run store is unavailable")
        self._emit(run, run.translator.start(time.time()))
        if run.stopping is not None:  # cancelled before it started: spawn nothing
            return Outcome(reason=run.stopping)
        return await self._driver.run_child(run)

    async def _finish(self, run: Run, outcome: Outcome) -> None:
        now = time.time()
        not_stored = self._store.not_stored(run.run_id)  # forgotten once the finish is written
        if not_stored:
            outcome = msgspec.structs.replace(outcome, frames_not_stored=not_stored)
        # Stored even past the cap: replay and recovery must see how the run ended.
        closing = run.translator.close(outcome, now)  # resolves what is pending: interrupted
        self._emit(run, closing, keep=True)
        self.approvals.track(run, closing)
        self.approvals.forget(run)
        rec = finish_record(run.record, run.translator.result, outcome.exit_code, now)
        self._metrics.runs_finished[rec.status] += 1
        self._metrics.observe_duration(max(0.0, now - rec.created_at))
        # Move to the recent cache before any await: the run no longer counts against capacity.
        self._active.pop(run.run_id, None)
        self._recent[run.run_id] = run
        while len(self._recent) > RECENT_RUNS:
            self._recent.popitem(last=False)
        try:
            # finish_run is written after the run's buffered frames and, like them, retried by
            # the store if the disk is full: a flush of its own could only fail the same way.
            await self._store.finish_run(rec)
        except StoreError as exc:
            _log.error("store_finish_failed", error=str(exc))
        except Exception as exc:
            _log.exception("store_finish_failed", error=repr(exc))
        finally:
            await self._keep_work_room_marks(run)
            run.done.set()
            _log.info(
                "run_finished",
                status=rec.status,
                exit_code=outcome.exit_code,
                reason=outcome.reason,
                **({"frames_not_stored": not_stored} if not_stored else {}),
            )
            if rec.status == "failed" and outcome.stderr_tail:
                _log.warning("run_stderr", tail=outcome.stderr_tail)

    # -- start-up and shutdown -------------------------------------------------------------

    async def recover(self) -> int:
        """Close the runs the store still calls running (the daemon died) as interrupted."""
        return await recover_runs(self._store, self._limits, self._metrics, self.config.approvals)

    async def drain(self, grace_s: float) -> None:
        """Let running runs finish for up to ``grace_s`` seconds, then cancel the rest and wait."""
        if self._active and grace_s > 0:
            waiters = [run.done.wait() for run in self._active.values()]
            try:
                async with asyncio.timeout(grace_s):
                    await asyncio.gather(*waiters)
            except TimeoutError:
                pass
        for run_id, run in list(self._active.items()):
            self.approvals.resolve_all(run, "interrupted")  # the daemon goes, not the user
            self.cancel(run_id)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
