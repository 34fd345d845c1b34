"""A run's CLI process, as the run manager has it driven: spawned from the run's launch plan, its
stdout fed to the run's translator, interrupted and terminated on a cancel, settled at the end.

Cancellation marks the run first and only then signals the process (``RunManager.cancel``): from
that moment no output of the process is translated, so the only frames that still go out are
those of ``Translator.close`` (open cards closed, ``run_result`` cancelled). It interrupts the
CLI's turn first (a control request on stdin): when the turn's ``result`` comes within
``[policy] interrupt_grace_s`` the closing frames go out at once, the session resumable, and the
process cleanup (stdin closed, the CLI's own exit, then SIGTERM/SIGKILL and the sweep) finishes
behind them; otherwise the cleanup comes first, as for a CLI that does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Final

import structlog

from codelegate.daemon.record import Run
from codelegate.daemon.supervision.supervisor import ChildProcess, ExitStatus, SpawnError
from codelegate.daemon.tasks import spawn
from codelegate.policy.config import Config
from codelegate.translator import Outcome
from codelegate.translator.control import ResultWatch, control_request, opening
from codelegate.translator.frames import Frame

_log = structlog.get_logger("codelegate.runs")  # the run's log lines, wherever they are said

READ_CHUNK: Final = 1 << 16  # bytes of stdout read at a time
# After the CLI exited and stragglers were reaped, how long stdout may take to reach EOF.
STDOUT_DRAIN_S: Final = 5.0
# The end of the CLI's stderr that a failed run reports (and logs).
STDERR_TAIL_CHARS: Final = 4000

Emit = Callable[[Run, list[Frame]], None]


class Driver:
    """Drives the CLI process of each run; the run manager owns the runs and emits the frames."""

    def __init__(
        self, config: Config, line_bytes: int, emit: Emit, tasks: set[asyncio.Task[None]]
    ) -> None:
        self._config = config
        self._line_bytes = line_bytes  # the bound of a line the interrupt's watch reads
        self._emit = emit
        self._tasks = tasks  # awaited by the manager's drain

    async def run_child(self, run: Run) -> Outcome:
        """Spawn the run's CLI and follow it to its end (or to the end of an interrupted turn)."""
        plan = run.plan
        try:
            child = await ChildProcess.spawn(
                plan.argv,
                cwd=plan.cwd,
                env=plan.env,
                stdin=opening(plan.task),
                keep_stdin=True,
                run_id=run.run_id,
                stderr_lines=self._config.limits.stderr_lines,
                redactor=run.translator.redactor,
            )
        except SpawnError as exc:
            error = run.translator.redactor.clean_chars(str(exc), 2000)
            _log.warning("spawn_failed", error=error)
            return Outcome(reason="spawn_failed", stderr_tail=error)
        run.child = child
        if run.stopping is not None:  # cancelled while spawning
            spawn(self.terminate(run, child), name=f"terminate:{run.run_id}")
        pump = spawn(self._pump(run, child), name=f"pump:{run.run_id}")
        exited = asyncio.ensure_future(child.wait())
        ended = asyncio.ensure_future(run.turn_ended.wait())
        status: ExitStatus
        try:
            async with asyncio.timeout(self._config.policy.run_timeout_s):
                await asyncio.wait((exited, ended), return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            if run.stopping is None:
                run.stopping = "timeout"
                _log.info("run_timeout", timeout_s=self._config.policy.run_timeout_s)
            await child.terminate(self._config.policy.cancel_grace_s)
        finally:
            ended.cancel()
        if run.turn_ended.is_set() and not exited.done():
            # A cancel's interrupt ended the turn: the closing frames go out now, and the
            # process cleanup (``terminate``, started by the cancel) finishes behind them.
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
            run.exit_status = status = await exited
            await self._after_exit(run, child, pump)
            _log.info("run_settled", exit_code=status.exit_code, signal=status.signal)
        finally:
            run.settled.set()

    async def _after_exit(self, run: Run, child: ChildProcess, pump: asyncio.Task[None]) -> None:
        # A straggler holding stdout would keep the pipe open: reap, then drain with a bound.
        await child.reap_stragglers()
        try:
            async with asyncio.timeout(STDOUT_DRAIN_S):
                await asyncio.shield(pump)
        except TimeoutError:
            pump.cancel()
        await child.aclose()
        if run.stopping is None and child.stderr_lines_seen:
            self._emit(run, run.translator.stderr_seen(child.stderr_lines_seen, time.time()))

    def interrupt(self, run: Run, child: ChildProcess) -> None:
        """Ask the CLI to end its turn; the pump watches for the turn's result from now on."""
        if self._config.policy.interrupt_grace_s <= 0 or child.returncode is not None:
            return
        run.interrupt = ResultWatch(self._line_bytes)
        channel = run.translator.channel
        # Background tasks (a Bash, a subagent) first: the CLI stops each itself, its command
        # SIGTERMed and the task noted stopped in the session (an interrupt ends only a turn).
        for task_id in channel.background:
            child.send(control_request(f"stop_task:{task_id}", "stop_task", task_id=task_id))
        if channel.idle:
            # No turn runs (its result is out; only background tasks were left): the turn is
            # over already, and no result would answer an interrupt.
            run.turn_ended.set()
        elif not child.send(control_request(f"interrupt:{run.run_id}", "interrupt")):
            run.interrupt = None  # stdin is closed already: the run was over anyway

    async def terminate(self, run: Run, child: ChildProcess) -> None:
        """After an interrupt, the turn's end and the CLI's own exit, within their graces; then
        SIGTERM, SIGKILL and the sweep of whatever the run left."""
        policy = self._config.policy
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

    async def _pump(self, run: Run, child: ChildProcess) -> None:
        """Feed stdout to the translator until EOF; output after a stop is dropped unread."""
        while chunk := await child.read(READ_CHUNK):
            if run.stopping is None:
                self._emit(run, run.translator.receive_data(chunk, time.time()))
                if run.translator.channel.over:
                    child.close_stdin()  # the last result, no background task open
            elif run.interrupt is not None and run.interrupt.feed(chunk):
                run.turn_ended.set()
            if len(chunk) == READ_CHUNK:
                # A full read may leave output buffered, and a read of buffered output does
                # not suspend: yield so that writers run between chunks of a run that floods
                # its output. A shorter read emptied the buffer; the next one waits anyway.
                await asyncio.sleep(0)
