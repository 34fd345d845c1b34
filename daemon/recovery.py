"""Start-up: runs a dead daemon left ``running`` are closed as ``interrupted``.

Their processes outlived that daemon (orphans still carry the run marker) and are killed; the
run's translator is rebuilt from its stored frames so that the closing frames continue the same
seq and close exactly the cards that were open, and the requests still waiting for a person
(``approval_resolved`` by ``interrupted``, in the frames and in the approvals list).
"""

from __future__ import annotations

import time

import structlog

from codelegate.daemon.metrics import Metrics
from codelegate.daemon.record import finish_record, run_context
from codelegate.daemon.store.store import RunStore, StoreError
from codelegate.daemon.supervision.procs import kill_run
from codelegate.policy.approvals import ApprovalsConfig
from codelegate.translator import Limits, Outcome, Translator
from codelegate.translator.frames import decode_frame, encode_frame

_log = structlog.get_logger("codelegate.recovery")


async def recover_runs(
    store: RunStore, limits: Limits, metrics: Metrics, approvals: ApprovalsConfig | None = None
) -> int:
    """Close every run the store still calls running; returns how many."""
    closed = 0
    for rec in await store.live_runs():
        # Its processes outlived the daemon that died (orphans carry the run marker).
        killed, left = await kill_run(rec.run_id)
        if killed or left:
            _log.info("run_orphans_killed", run_id=rec.run_id, killed=killed, left=left)
        frames = [decode_frame(b) for b in await store.frames_after(rec.run_id, 0)]
        translator = Translator.restore(run_context(rec), frames, limits, approvals=approvals)
        now = time.time()
        for frame in translator.close(Outcome(reason="interrupted"), now):
            store.append_frame(rec.run_id, frame.seq, encode_frame(frame), always=True)
        try:  # the closing frames said it (approval_resolved by: interrupted); so does the list
            await store.interrupt_approvals(rec.run_id, now)
        except StoreError as exc:
            _log.error("store_approvals_failed", run_id=rec.run_id, error=str(exc))
        finish_record(rec, translator.result, None, now, without_result="interrupted")
        if rec.parent_tool_call_id is not None:  # a follow-up continues its Work Room
            try:
                await store.advance_invocation(
                    rec.parent_tool_call_id, translator.revision, translator.activity_sequence
                )
            except StoreError as exc:
                _log.error("store_invocation_failed", run_id=rec.run_id, error=str(exc))
        try:
            await store.finish_run(rec)
        except StoreError as exc:  # queued and retried by the store; the daemon still starts
            _log.error("store_finish_failed", run_id=rec.run_id, error=str(exc))
        metrics.runs_finished[rec.status] += 1
        _log.info("run_interrupted", run_id=rec.run_id, status=rec.status)
        closed += 1
    return closed
