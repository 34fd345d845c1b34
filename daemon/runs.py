"""One run's life: policy → spawn → translate → publish → store → result.

:class:`RunManager` asks policy for every decision before anything is spawned (a refused request
spawns nothing), then drives the child: stdout chunks go through the run's :class:`Translator`,
each frame is encoded once, appended to the run's in-memory frame log, queued for the store and
published to the hub in one synchronous step — which is what makes a subscriber's snapshot + live
atomic (see ``daemon/hub.py``).

Cancellation marks the run first and only then signals the process: from that moment no output
of the process is translated, so the only frames that still go out are those of
``Translator.close`` (open cards closed, ``run_result`` cancelled). It interrupts the CLI's turn
first (a control request on stdin): when the turn's ``result`` comes within
``[policy] interrupt_grace_s`` the closing frames go out at once, the session resumable, and the
process cleanup (stdin closed, the CLI's own exit, then SIGTERM/SIGKILL and the sweep) finishes
behind them; otherwise the cleanup comes first, as for a CLI that does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec
import structlog

from codelegate.daemon.approvals import Approvals
from codelegate.daemon.hub import Delivery, Fetch, Hub, Replay, Subscriber
from codelegate.daemon.metrics import Metrics
from codelegate.daemon.record import Refused, Run, Stopping, record_state, translator_limits
from codelegate.daemon.recovery import recover_runs
from codelegate.daemon.steering import send_input
from codelegate.daemon.store.store import RunRecord, RunStore, StoreError
from codelegate.daemon.supervision.supervisor import ChildProcess, ExitStatus, SpawnError
from codelegate.daemon.tasks import spawn
from codelegate.policy.config import Config
from codelegate.policy.launch import (
    RUN_MARKER_VAR,
    check_resume,
    parse_session_id,
    plan_launch,
    resolve_mode,
    resolve_workspace,
)
from codelegate.policy.request import RunRequest
from codelegate.translator import Outcome, Redactor, RunContext, Translator
from codelegate.translator.control import ResultWatch, control_request
from codelegate.translator.frames import (
    ApprovalNeeded,
    ApprovalResolved,
    AskUser,
    Diagnostic,
    Frame,
    RunResult,
    encode_frame,
)

_log = structlog.get_logger("codelegate.runs")

# Finished runs kept in memory for replay without a store round trip.
RECENT_RUNS: Final = 64
READ_CHUNK: Final = 1 << 16  # bytes of stdout read at a time
# After the CLI exited and stragglers were reaped, how long stdout may take to reach EOF.
DRAIN_S: Final = 5.0
# The end of the CLI's stderr that a failed run reports (and logs).
STDERR_TAIL_CHARS: Final = 4000
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

    # -- queries ---------------------------------------------------------------------------

    @property
    def active_count(self) -> int:
        """Runs currently running."""
        return len(self._active)

    def get(self, run_id: str) -> Run | None:
        """A run held in memory (live or recently finished)."""
        return self._active.get(run_id) or self._recent.get(run_id)

    async def state(self, run_id: str) -> dict[str, Any] | None:
        """A run's state from memory or the store; None when unknown."""
        run = self.get(run_id)
        if run is not None:
            return run.state()
        rec = await self._store.get_run(run_id)
        return record_state(rec) if rec is not None else None

    async def recent(self, limit: int) -> list[dict[str, Any]]:
        """Recent runs, newest first, with live state for the active ones."""
        states = {r.run_id: r.state() for r in self._active.values()}  # stored or not yet
        for rec in await self._store.list_runs(limit):
            run = self.get(rec.run_id)
            states[rec.run_id] = run.state() if run is not None else record_state(rec)
        ordered = sorted(states.values(), key=lambda s: -float(s["created_at"]))
        return ordered[:limit]

    async def subscribe(
        self, sub: Subscriber, run_id: str, after: int
    ) -> Literal["unknown", "live", "finished"]:
        """Queue the frames of ``run_id`` after ``after`` and, if it is live, follow it.

        Replaces whatever ``sub`` still had queued for the run (a repeated subscribe does not
        stack replays); frames not in memory are read from the store page by page as the
        client drains (see ``daemon/hub.py``).
        """
        run = self.get(run_id)
        if run is not None:
            stored = None
            if run.log and run.log[0].seq > after + 1:
                # The start of a long run's log was trimmed from memory: the store answers for
                # it (also for frames not written yet), up to where the log begins.
                stored = Replay(run_id, self._stored_pages(run_id), after, run.log[0].seq - 1)
            snapshot = [d for d in run.log if d.seq > after]
            if run.done.is_set() or (run.log and run.log[-1].last):
                # run_result is out (the store may still be catching up): nothing live follows.
                sub.forget(run_id)
                sub.replay(snapshot, stored=stored)
                return "finished"
            # No await between reading the log and registering: no gap, no duplicate.
            self._hub.subscribe(sub, run_id, snapshot, after, stored=stored)
            return "live"
        rec = await self._store.get_run(run_id)
        if rec is None:
            return "unknown"
        # Not in memory means finished and flushed: the store holds every frame it keeps.
        sub.forget(run_id)
        sub.replay((), stored=Replay(run_id, self._stored_pages(run_id), after))
        return "finished"

    def _stored_pages(self, run_id: str) -> Fetch:
        """Pages of ``run_id``'s stored frames, for a :class:`Replay`."""
        store = self._store

        async def fetch(after: int, limit: int) -> list[Delivery]:
            rows = await store.frames_page(run_id, after, limit)
            return [Delivery(run_id, seq, data) for seq, data in rows]

        return fetch

    def follow_all(self, sub: Subscriber, after: int) -> None:
        """Follow every run, new ones too, after replaying the live runs' frames after ``after``."""
        snapshot = [d for run in self._active.values() for d in run.log if d.seq > after]
        self._hub.follow_all(sub, snapshot, after)

    # -- starting --------------------------------------------------------------------------

    async def start(self, request: RunRequest) -> Run:
        """Decide everything through policy, then spawn; PolicyError/Refused spawn nothing."""
        resolve_mode(self.config, request.mode)  # refuse a bad mode before touching anything
        cwd = resolve_workspace(
            self.config, request.cwd, realpath=os.path.realpath, isdir=os.path.isdir
        )
        run_id = str(uuid.uuid4())
        if request.resume is not None:
            session_id = parse_session_id(request.resume)
            # A session this daemon is running right now (its record may not be written yet).
            owner = next((r.cwd for r in self._active.values() if r.session_id == session_id), None)
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
            raise Refused(429, "too_many_runs", "too many runs are running; retry later")
        if any(r.session_id == session_id for r in self._active.values()):
            raise Refused(409, "session_busy", "that session is already running")
        plan = plan_launch(
            self.config,
            request,
            cwd=cwd,
            session_id=session_id,
            resumed=resumed,
            parent_env=self._environ,
            marker=(RUN_MARKER_VAR, run_id),
        )
        now = time.time()
        ctx = RunContext(
            run_id=run_id,
            cwd=cwd,
            mode=plan.mode,
            parent_tool_call_id=parent.tool_call_id if parent is not None else None,
            parent_session_id=parent.session_id if parent is not None else None,
            session_id=session_id,
            resumed=resumed,
            started_at=now,
            revision_base=revision,
            sequence_base=sequence,
        )
        run = Run(
            run_id=run_id,
            cwd=cwd,
            mode=plan.mode,
            session_id=session_id,
            resumed=resumed,
            parent_tool_call_id=ctx.parent_tool_call_id,
            created_at=now,
            # The run's redactor knows the credentials policy passes to this CLI: it masks them
            # in frames, in the stderr tail and in what the run logs.
            translator=Translator(ctx, self._limits, Redactor(plan.secrets), self.config.approvals),
            plan=plan,
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
            if run.parent_tool_call_id == parent_tool_call_id:
                revision = max(revision, run.translator.revision)
                sequence = max(sequence, run.translator.activity_sequence)
        return revision, sequence

    async def _keep_work_room_marks(self, run: Run) -> None:
        if run.parent_tool_call_id is None:
            return
        translator = run.translator
        try:
            await self._store.advance_invocation(
                run.parent_tool_call_id, translator.revision, translator.activity_sequence
            )
        except StoreError as exc:  # kept in memory while the run is recent; logged
            _log.error("store_invocation_failed", error=str(exc))
        except Exception as exc:  # never keep the run's waiters waiting
            _log.exception("store_invocation_failed", error=repr(exc))

    def send_input(self, run_id: str, text: str) -> dict[str, Any]:
        """Steering: ``text`` as a user message to the run's CLI; 409 once it is ending."""
        return send_input(self._active.get(run_id), text)

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
                self._interrupt(run, run.child)
                spawn(self._terminate(run, run.child), name=f"terminate:{run_id}")
        return True

    def _interrupt(self, run: Run, child: ChildProcess) -> None:
        """Ask the CLI to end its turn; the pump watches for the turn's result from now on."""
        if self.config.policy.interrupt_grace_s <= 0 or child.returncode is not None:
            return
        run.interrupt = ResultWatch(self._limits.line_bytes)
        if not child.send(control_request(f"interrupt:{run.run_id}", "interrupt")):
            run.interrupt = None  # stdin is closed already: the run was over anyway

    async def _terminate(self, run: Run, child: ChildProcess) -> None:
        policy = self.config.policy
        if run.interrupt is not None:
            try:
                async with asyncio.timeout(policy.interrupt_grace_s):
                    await run.turn_ended.wait()
            except TimeoutError:
                _log.info("run_interrupt_unanswered", grace_s=policy.interrupt_grace_s)
            else:
                # The CLI exits on its own once stdin closes (after a fixed delay of its own):
                # let it, so that it leaves its transcript whole; SIGTERM only if it does not.
                child.close_stdin()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(policy.cancel_grace_s):
                        await child.wait()
        await child.terminate(policy.cancel_grace_s)

    # -- driving ---------------------------------------------------------------------------

    def _emit(self, run: Run, frames: list[Frame], *, keep: bool = False) -> None:
        """Encode once; log, store and publish in one synchronous step.

        Past the run's ``[limits]`` store cap frames are published but not stored, except with
        ``keep`` (the closing frames); the first one not stored is followed by a
        ``frames_not_stored`` diagnostic, and the total comes before ``run_result``.
        """
        batch: list[Delivery] = []
        store = self._store
        capped = False
        for frame in frames:
            data = encode_frame(frame)
            batch.append(Delivery(run.run_id, frame.seq, data, isinstance(frame, RunResult)))
            always = keep or isinstance(frame, _ALWAYS_STORED)
            if not store.append_frame(run.run_id, frame.seq, data, always=always):
                capped = True
            kind = type(frame).__struct_config__.tag
            self._metrics.frames[str(kind)] += 1
            if isinstance(frame, Diagnostic):
                self._metrics.diagnostics[frame.code] += frame.count
        run.log.extend(batch)
        if len(run.log) > self._keep_frames + self._keep_frames // 4:
            # Bound memory per run; older frames are replayed from the store (see subscribe).
            del run.log[: len(run.log) - self._keep_frames]
        self._hub.publish_batch(run.run_id, batch)
        if capped:
            # Said once, when the first frame is not stored; the translator keeps the count and
            # sends the total with its closing frames.
            told = run.translator.frames_not_stored(store.not_stored(run.run_id), time.time())
            if told:
                self._emit(run, told, keep=True)

    async def _pump(self, run: Run, child: ChildProcess) -> None:
        """Feed stdout to the translator until EOF; output after a stop is dropped unread."""
        while chunk := await child.read(READ_CHUNK):
            if run.stopping is None:
                frames = run.translator.receive_data(chunk, time.time())
                self._emit(run, frames)
                self.approvals.after_data(run, frames)  # its answers go out before a close
                if run.translator.channel.over:
                    child.close_stdin()  # the last result, no background task open
            elif run.interrupt is not None and run.interrupt.feed(chunk):
                run.turn_ended.set()
            if len(chunk) == READ_CHUNK:
                # A full read may leave output buffered, and a read of buffered output does
                # not suspend: yield so that writers run between chunks of a run that floods
                # its output. A shorter read emptied the buffer; the next one waits anyway.
                await asyncio.sleep(0)

    async def _drive(self, run: Run) -> None:
        structlog.contextvars.bind_contextvars(run_id=run.run_id, session_id=run.session_id)
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

    async def _supervise(self, run: Run) -> Outcome:
        plan = run.plan
        try:
            await self._store.create_run(
                RunRecord(
                    run_id=run.run_id,
                    status="running",
                    created_at=run.created_at,
                    cwd=run.cwd,
                    mode=run.mode,
                    session_id=run.session_id,
                    resumed=run.resumed,
                    parent_tool_call_id=run.parent_tool_call_id,
                )
            )
        except StoreError as exc:
            _log.error("store_create_failed", error=str(exc))
            return Outcome(reason="spawn_failed", stderr_tail="the run store is unavailable")
        self._emit(run, run.translator.start(time.time()))
        if run.stopping is not None:  # cancelled before it started: spawn nothing
            return Outcome(reason=run.stopping)
        try:
            child = await ChildProcess.spawn(
                plan.argv,
                cwd=plan.cwd,
                env=plan.env,
                stdin=plan.stdin,
                keep_stdin=True,
                run_id=run.run_id,
                stderr_lines=self.config.limits.stderr_lines,
                redactor=run.translator.redactor,
            )
        except SpawnError as exc:
            error = run.translator.redactor.clean_chars(str(exc), 2000)
            _log.warning("spawn_failed", error=error)
            return Outcome(reason="spawn_failed", stderr_tail=error)
        run.child = child
        if run.stopping is not None:  # cancelled while spawning
            spawn(self._terminate(run, child), name=f"terminate:{run.run_id}")
        pump = spawn(self._pump(run, child), name=f"pump:{run.run_id}")
        exited = asyncio.ensure_future(child.wait())
        ended = asyncio.ensure_future(run.turn_ended.wait())
        status: ExitStatus
        try:
            async with asyncio.timeout(self.config.policy.run_timeout_s):
                await asyncio.wait((exited, ended), return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            if run.stopping is None:
                run.stopping = "timeout"
                _log.info("run_timeout", timeout_s=self.config.policy.run_timeout_s)
            await child.terminate(self.config.policy.cancel_grace_s)
        finally:
            ended.cancel()
        if run.turn_ended.is_set() and not exited.done():
            # A cancel's interrupt ended the turn: the closing frames go out now, and the
            # process cleanup (``_terminate``, started by the cancel) finishes behind them.
            run.settling = True
            settle = spawn(self._settle(run, child, pump, exited), name=f"settle:{run.run_id}")
            self._tasks.add(settle)
            settle.add_done_callback(self._tasks.discard)
            return Outcome(reason=run.stopping or "cancelled")
        status = await exited
        await self._after_exit(run, child, pump)
        return Outcome(
            reason=run.stopping or "exited",
            exit_code=status.exit_code,
            signal=status.signal,
            # Redacted by the supervisor as one text, then cut: for the result and the log.
            stderr_tail=child.stderr_tail(STDERR_TAIL_CHARS),
        )

    async def _settle(
        self, run: Run, child: ChildProcess, pump: asyncio.Task[None], exited: asyncio.Future[Any]
    ) -> None:
        try:
            status = await exited
            await self._after_exit(run, child, pump)
            _log.info("run_settled", exit_code=status.exit_code, signal=status.signal)
        finally:
            run.settled.set()

    async def _after_exit(self, run: Run, child: ChildProcess, pump: asyncio.Task[None]) -> None:
        # A straggler holding stdout would keep the pipe open: reap, then drain with a bound.
        await child.reap_stragglers()
        try:
            async with asyncio.timeout(DRAIN_S):
                await asyncio.shield(pump)
        except TimeoutError:
            pump.cancel()
        await child.aclose()
        if run.stopping is None and child.stderr_lines_seen:
            self._emit(run, run.translator.stderr_seen(child.stderr_lines_seen, time.time()))

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
        result = run.translator.result
        run.result = result
        run.status = result.status if result is not None else "failed"
        run.finished_at = now
        run.exit_code = outcome.exit_code
        self._metrics.runs_finished[run.status] += 1
        self._metrics.observe_duration(max(0.0, now - run.created_at))
        # Move to the recent cache before any await: the run no longer counts against capacity.
        self._active.pop(run.run_id, None)
        self._recent[run.run_id] = run
        while len(self._recent) > RECENT_RUNS:
            self._recent.popitem(last=False)
        try:
            # finish_run is written after the run's buffered frames and, like them, retried
            # by the store if the disk is full; no separate flush (defect D2).
            await self._store.finish_run(
                run.run_id,
                run.status,
                msgspec.json.encode(result) if result is not None else b"null",
                outcome.exit_code,
                now,
            )
        except StoreError as exc:
            _log.error("store_finish_failed", error=str(exc))
        except Exception as exc:
            _log.exception("store_finish_failed", error=repr(exc))
        finally:
            await self._keep_work_room_marks(run)
            run.done.set()
            _log.info(
                "run_finished",
                status=run.status,
                exit_code=outcome.exit_code,
                reason=outcome.reason,
                **({"frames_not_stored": not_stored} if not_stored else {}),
            )
            if run.status == "failed" and outcome.stderr_tail:
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
