"""The daemon runs on uvloop: the supervisor's subprocess protocol must behave the same there."""

from __future__ import annotations

import signal
import sys
import uuid
from pathlib import Path

import pytest

from codelegate.daemon.supervision import procs
from codelegate.daemon.supervision.supervisor import ChildProcess, ExitStatus
from tests.fakes import FAKE_CLAUDE
from tests.supervision.conftest import ARGV, fake_env, read_all

uvloop = pytest.importorskip("uvloop")


async def _spawn(tmp_path: Path, scenario: str, eof_grace: float = 2.0) -> ChildProcess:
    run_id = uuid.uuid4().hex
    return await ChildProcess.spawn(
        [sys.executable, FAKE_CLAUDE, *ARGV],
        cwd=str(tmp_path),
        env=fake_env(run_id),
        stdin=f"fake: {scenario}\n".encode(),
        run_id=run_id,
        eof_grace=eof_grace,
    )


def test_supervision_on_uvloop(tmp_path: Path) -> None:
    async def scenario() -> None:
        normal = await _spawn(tmp_path, "normal")
        assert (await read_all(normal)).count(b"\n") == 5
        assert await normal.wait() == ExitStatus(0, None)

        pidfile = tmp_path / "gc.pid"
        straggler = await _spawn(
            tmp_path, f"grandchild pidfile={pidfile} hold_stdio=1 then=exit", eof_grace=0.2
        )
        await read_all(straggler)  # EOF although the grandchild held our stdout
        assert await straggler.wait() == ExitStatus(0, None)
        await straggler.output_closed()
        assert straggler.killed == 1

        stubborn = await _spawn(tmp_path, "ignore_term")
        await stubborn.read()
        assert await stubborn.terminate(0.2) == ExitStatus(None, signal.SIGKILL)

        for child in (normal, straggler, stubborn):
            assert procs.marked_pids(child.run_id) == []
            await child.aclose()

    uvloop.run(scenario())
