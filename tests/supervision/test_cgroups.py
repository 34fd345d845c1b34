"""A cgroup per run: it finds what the marker cannot (a process that dropped its environment)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from codelegate.daemon.supervision import cgroups, procs
from codelegate.daemon.supervision.cgroups import RunCgroup
from codelegate.daemon.supervision.supervisor import ChildProcess, ExitStatus
from tests.polling import until
from tests.supervision.conftest import Spawn, alive, gone, read_all, read_until, spawn_grandchild

needs_cgroup = pytest.mark.skipif(
    cgroups.delegated_base() is None, reason="no delegated, writable cgroup v2 subtree here"
)


async def _scrubbed_grandchild(spawn_fake: Spawn, tmp_path: Path) -> tuple[ChildProcess, int]:
    child, pidfile = await spawn_grandchild(spawn_fake, tmp_path, "scrub_env=1 then=hang")
    await read_until(child, b'"type":"user"')  # printed once the grandchild is all set up
    pid = int(pidfile.read_bytes())
    # Wait for the re-exec: from then on the marker is gone from its environ.
    await until(lambda: pid not in procs.marked_pids(child.run_id))
    assert alive(pid)
    return child, pid


@pytest.mark.usefixtures("subreaper")
@pytest.mark.parametrize("attribution", ["cgroup", "marker"], indirect=True)
async def test_only_the_run_cgroup_kills_a_process_that_dropped_the_marker(
    spawn_fake: Spawn, tmp_path: Path, attribution: str
) -> None:
    # Without a cgroup it escapes: the documented limit of the marker alone (operator README).
    child, scrubbed = await _scrubbed_grandchild(spawn_fake, tmp_path)
    assert (child.cgroup is not None and scrubbed in child.cgroup.pids()) == (
        attribution == "cgroup"
    )
    try:
        await child.terminate(grace=2.0)
        if attribution == "marker":
            assert alive(scrubbed)
    finally:
        if attribution == "marker":
            os.kill(scrubbed, signal.SIGKILL)
    # Killed with its cgroup, or re-parented to us as a zombie the orphan reaper takes.
    await until(lambda: gone(scrubbed))
    assert child.cgroup is None  # empty, so removed (or there was none)


@needs_cgroup
def test_run_cgroup_lifecycle() -> None:
    assert RunCgroup.create("../escape") is None
    group = RunCgroup.create("lifecycle-test")
    assert group is not None
    try:
        assert os.path.isdir(group.path)
        assert group.wrap(["claude", "-p"])[-2:] == ["claude", "-p"]
        assert group.pids() == []
        assert not group.populated()
        assert group.kill() == []
    finally:
        assert group.remove()
    assert not os.path.exists(group.path)
    assert group.remove()  # already gone


def test_a_systemd_unit_cgroup_needs_delegation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = tmp_path / "system.slice" / "codelegate.service"
    unit.mkdir(parents=True)
    monkeypatch.setattr(cgroups, "_cgroup2_mount", lambda: str(tmp_path))
    monkeypatch.setattr(cgroups, "_own_cgroup", lambda: "/system.slice/codelegate.service")
    assert cgroups.detect() is None  # writable, but not delegated: systemd owns it


def test_cgroups_can_be_turned_off() -> None:
    try:
        cgroups.set_enabled(False)
        assert cgroups.delegated_base() is None
        assert RunCgroup.create("some-run") is None
    finally:
        cgroups.set_enabled(True)


@pytest.mark.usefixtures("subreaper")
@pytest.mark.parametrize("attribution", ["marker"], indirect=True)
async def test_an_invisible_process_holding_stdout_cannot_keep_the_run_open(
    spawn_fake: Spawn, tmp_path: Path
) -> None:
    # Neither marker nor cgroup finds it: after two graces the pipes are closed on our side.
    child, pidfile = await spawn_grandchild(
        spawn_fake, tmp_path, "scrub_env=1 hold_stdio=1 then=exit", eof_grace=0.1
    )
    out = await read_all(child)
    assert out.endswith(b"\n")
    assert await child.wait() == ExitStatus(0, None)
    await child.output_closed()
    await until(pidfile.exists)
    pid = int(pidfile.read_bytes())
    try:
        assert alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
    await until(lambda: gone(pid))
