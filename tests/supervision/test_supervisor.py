"""ChildProcess with the fake CLI: exits, crashes, cancels, stragglers, big lines, stderr."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tracemalloc
from pathlib import Path

import pytest

from codelegate.daemon.supervision import procs
from codelegate.daemon.supervision.supervisor import (
    STDERR_LINE_CHARS,
    ChildProcess,
    ExitStatus,
    SpawnError,
    pin_directory,
)
from tests.fakes import FAKE_CLAUDE, PLANTED_SECRET
from tests.polling import until
from tests.supervision.conftest import (
    Spawn,
    alive,
    fake_env,
    gone,
    read_all,
    read_until,
    spawn_grandchild,
)


async def test_normal_run_reads_every_line_and_exits_zero(spawn_fake: Spawn) -> None:
    child = await spawn_fake("normal")
    lines = [json.loads(raw) for raw in (await read_all(child)).splitlines()]
    assert [line["type"] for line in lines] == [
        "system",
        "assistant",
        "user",
        "assistant",
        "result",
    ]
    assert lines[0]["permissionMode"] == "manual"
    assert lines[0]["session_id"] == "4f6c1d2e-8a3b-4c5d-9e7f-0a1b2c3d4e5f"
    assert await child.wait() == ExitStatus(0, None)
    assert await child.reap_stragglers() == 0


async def test_the_prompt_arrives_on_stdin_and_is_closed(spawn_fake: Spawn) -> None:
    # The fake reads stdin to EOF before printing: output at all proves stdin was closed.
    child = await spawn_fake("tools n=10")
    lines = (await read_all(child)).splitlines()
    assert len(lines) == 12  # init + 10 tool lines + result
    assert await child.wait() == ExitStatus(0, None)


async def test_a_kept_stdin_takes_more_lines_until_it_is_closed(spawn_fake: Spawn) -> None:
    # The fake reads a text stdin to EOF before printing: its output comes only because stdin
    # was closed here, after a later line; nothing can be sent once it is closed.
    child = await spawn_fake("tools n=3", keep_stdin=True)
    assert child.send(b"0 more\n") is True
    child.close_stdin()
    child.close_stdin()  # idempotent
    assert child.send(b"late\n") is False
    lines = (await read_all(child)).splitlines()
    assert len(lines) == 5  # init + 3 tool lines + result
    assert await child.wait() == ExitStatus(0, None)


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("abort", ExitStatus(None, signal.SIGABRT)),
        ("segv", ExitStatus(None, signal.SIGSEGV)),
        ("exit139", ExitStatus(139, None)),
    ],
)
async def test_crash_mid_run_records_exit_code_or_signal(
    spawn_fake: Spawn, how: str, expected: ExitStatus
) -> None:
    child = await spawn_fake(f"crash how={how}")
    out = await read_all(child)
    assert len(out.splitlines()) == 2  # init and the tool_use, then nothing
    assert await child.wait() == expected


async def test_exit_before_init_keeps_the_stderr_reason(spawn_fake: Spawn) -> None:
    child = await spawn_fake("exit_before_init")
    assert await read_all(child) == b""
    assert await child.wait() == ExitStatus(1, None)
    await child.output_closed()
    assert "could not start" in child.stderr_tail()
    assert child.stderr_lines_seen == 1


async def test_garbage_is_passed_through_as_bytes(spawn_fake: Spawn) -> None:
    child = await spawn_fake("garbage")
    out = await read_all(child)
    assert b"\xff\xfe garbage" in out
    assert json.loads(out.splitlines()[-1])["type"] == "result"
    assert await child.wait() == ExitStatus(0, None)


async def test_hang_without_output_is_terminated(spawn_fake: Spawn) -> None:
    child = await spawn_fake("hang")
    status = await child.terminate(grace=5.0)
    assert status == ExitStatus(None, signal.SIGTERM)
    assert await read_all(child) == b""


async def test_sigterm_ignoring_child_is_killed_after_grace(spawn_fake: Spawn) -> None:
    child = await spawn_fake("ignore_term")
    first = await child.read()
    assert b'"subtype":"init"' in first
    status = await child.terminate(grace=0.2)
    assert status == ExitStatus(None, signal.SIGKILL)
    assert procs.marked_pids(child.run_id) == []


async def test_terminate_is_idempotent_and_shared(spawn_fake: Spawn) -> None:
    child = await spawn_fake("ignore_term")
    await child.read()
    first, second = await asyncio.gather(child.terminate(0.1), child.terminate(3.0))
    assert first == second == ExitStatus(None, signal.SIGKILL)
    assert await child.terminate(0.1) == first
    assert await child.wait() == first


async def _grandchild_pid(child: ChildProcess, pidfile: Path) -> int:
    # The fake prints the tool_result once the middle process is reaped and the grandchild has
    # written its pidfile: from then on the set of the run's processes is fixed.
    await read_until(child, b'"type":"user"')
    return int(pidfile.read_bytes())  # noqa: ASYNC240 - a few bytes, already written


@pytest.mark.usefixtures("subreaper")
@pytest.mark.parametrize("hold_stdio", ["0", "1"])
async def test_cancel_kills_the_group_and_the_escaped_grandchild(
    spawn_fake: Spawn, tmp_path: Path, hold_stdio: str
) -> None:
    child, pidfile = await spawn_grandchild(
        spawn_fake, tmp_path, f"hold_stdio={hold_stdio} then=hang"
    )
    grandchild = await _grandchild_pid(child, pidfile)
    # It escaped: another session, not in the CLI's process group, and it ignores SIGTERM.
    assert os.getsid(grandchild) not in (child.pid, os.getsid(0))
    assert os.getpgid(grandchild) != child.pid
    assert grandchild in procs.marked_pids(child.run_id)

    status = await child.terminate(grace=2.0)

    assert status == ExitStatus(None, signal.SIGTERM)
    assert child.killed >= 1
    assert procs.marked_pids(child.run_id) == []
    # Re-parented to us (the subreaper), killed, then reaped: not even a zombie is left.
    await until(lambda: gone(grandchild))
    await read_all(child)  # stdout reaches EOF even if the grandchild had held it


@pytest.mark.usefixtures("subreaper")
async def test_normal_exit_leaves_a_straggler_that_is_reaped(
    spawn_fake: Spawn, tmp_path: Path
) -> None:
    child, pidfile = await spawn_grandchild(spawn_fake, tmp_path, "then=exit")
    out = await read_all(child)
    assert json.loads(out.splitlines()[-1])["type"] == "result"
    assert await child.wait() == ExitStatus(0, None)
    grandchild = int(pidfile.read_bytes())  # written before the fake went on and exited
    assert alive(grandchild)  # it survived the CLI, as a real setsid tool process does

    assert await child.reap_stragglers() == 1

    assert procs.marked_pids(child.run_id) == []
    await until(lambda: gone(grandchild))


@pytest.mark.usefixtures("subreaper")
async def test_a_straggler_holding_stdout_cannot_keep_the_run_open(
    spawn_fake: Spawn, tmp_path: Path
) -> None:
    child, _ = await spawn_grandchild(spawn_fake, tmp_path, "hold_stdio=1 then=exit", eof_grace=0.2)
    out = await read_all(child)  # EOF comes once the straggler holding the pipe is killed
    assert json.loads(out.splitlines()[-1])["type"] == "result"
    assert await child.wait() == ExitStatus(0, None)
    await child.output_closed()
    assert child.killed == 1
    assert procs.marked_pids(child.run_id) == []


async def test_a_50_mb_line_is_read_in_bounded_chunks(spawn_fake: Spawn) -> None:
    size = 50 * 1024 * 1024
    child = await spawn_fake(f"big_line bytes={size}")
    total, newlines, biggest = 0, 0, 0
    tracemalloc.start()
    try:
        while chunk := await child.read(1 << 16):
            total += len(chunk)
            newlines += chunk.count(b"\n")
            biggest = max(biggest, len(chunk))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert biggest <= 1 << 16
    assert total > size
    assert newlines == 6  # init, the big line, then a normal ending of four lines
    # Reading never holds the line: the peak is a few pipe buffers, not 50 MB.
    assert peak < 8 * 1024 * 1024
    assert await child.wait() == ExitStatus(0, None)


async def test_stderr_ring_is_bounded_and_redacted(spawn_fake: Spawn) -> None:
    seen: list[int] = []
    child = await spawn_fake("stderr lines=500", stderr_lines=20, on_stderr_line=seen.append)
    await read_all(child)
    assert await child.wait() == ExitStatus(0, None)
    await child.output_closed()
    assert child.stderr_lines_seen == 500
    assert seen[-1] == 500
    tail = child.stderr_tail()
    assert len(tail.splitlines()) == 20
    assert "fake stderr line 499" in tail
    assert PLANTED_SECRET not in tail


async def test_a_huge_stderr_line_is_cut_not_kept(spawn_fake: Spawn) -> None:
    child = await spawn_fake("stderr lines=1 long=5000000")
    await read_all(child)
    await child.wait()
    await child.output_closed()
    assert child.stderr_lines_seen == 3
    long_line, after = child.stderr_tail().splitlines()[1:]
    # Cut, and the end of what was kept dropped: a token the cut went through cannot be judged.
    assert long_line.endswith("L" * 1000 + " …[cut]")
    assert set(long_line.removesuffix(" …[cut]")) == {"L"}
    assert len(long_line) <= STDERR_LINE_CHARS
    assert after == "after the long line"


async def test_stderr_secret_is_redacted_even_when_still_in_the_ring(spawn_fake: Spawn) -> None:
    child = await spawn_fake("stderr lines=3")
    await read_all(child)
    await child.wait()
    await child.output_closed()
    tail = child.stderr_tail()
    assert "fake stderr line 1" in tail
    assert PLANTED_SECRET not in tail
    assert "sk-ant-api03" not in tail


async def test_spawn_refuses_an_env_without_the_run_marker(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CODELEGATE_RUN_ID"):
        await ChildProcess.spawn(
            [sys.executable, FAKE_CLAUDE], cwd=str(tmp_path), env={}, stdin=b"", run_id="r1"
        )


@pytest.mark.parametrize("problem", ["missing_binary", "missing_cwd", "empty_argv"])
async def test_spawn_failures_raise_spawn_error(
    tmp_path: Path, problem: str, attribution: str
) -> None:
    argv = [sys.executable, FAKE_CLAUDE]
    cwd = str(tmp_path)
    if problem == "missing_binary":
        argv = [str(tmp_path / "no-such-claude")]
    elif problem == "missing_cwd":
        cwd = str(tmp_path / "gone")
    else:
        argv = []
    with pytest.raises(SpawnError):
        await ChildProcess.spawn(
            argv,
            cwd=cwd,
            env=fake_env("r2"),
            stdin=b"",
            run_id="r2",
            cgroup=attribution == "cgroup",
        )


def test_pin_directory_holds_the_directory_not_the_path(tmp_path: Path) -> None:
    ws = tmp_path / "ws" / "sub"
    ws.mkdir(parents=True)
    fd = pin_directory(str(ws))
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == str(ws)
        (tmp_path / "ws").rename(tmp_path / "moved")  # the descriptor follows the directory
        assert os.readlink(f"/proc/self/fd/{fd}") == str(tmp_path / "moved" / "sub")
    finally:
        os.close(fd)


@pytest.mark.parametrize("case", ["link_inside", "link_last", "file", "relative", "dotdot", "gone"])
def test_pin_directory_follows_no_symlink(tmp_path: Path, case: str) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    (real / "file").write_text("x")
    path = {
        "link_inside": tmp_path / "link" / "sub",
        "link_last": tmp_path / "link",
        "file": real / "file",
        "relative": Path("real/sub"),
        "dotdot": real / "sub" / ".." / "sub",
        "gone": real / "gone",
    }[case]
    fds_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):  # ENOTDIR, ELOOP, ENOENT or our own, by case
        pin_directory(str(path))
    assert len(os.listdir("/proc/self/fd")) == fds_before  # nothing left open


async def test_the_orphan_reaper_never_steals_a_direct_childs_status(spawn_fake: Spawn) -> None:
    child = await spawn_fake("crash how=exit139")
    while child.returncode is None:
        procs.reap_orphans()
        await asyncio.sleep(0)
    assert await child.wait() == ExitStatus(139, None)


def test_marker_match_is_exact() -> None:
    entry = procs.marker_entry("a1")
    assert procs._carries(b"PATH=/bin\0CODELEGATE_RUN_ID=a1\0", entry)
    assert not procs._carries(b"CODELEGATE_RUN_ID=a10\0", entry)
    assert not procs._carries(b"XCODELEGATE_RUN_ID=a1\0", entry)


@pytest.mark.usefixtures("subreaper")
async def test_leftovers_of_a_run_whose_supervisor_died_are_killed(
    spawn_fake: Spawn, tmp_path: Path
) -> None:
    # As after a daemon crash: nobody holds the ChildProcess any more, only the run id is known.
    child, pidfile = await spawn_grandchild(spawn_fake, tmp_path, "then=hang")
    await _grandchild_pid(child, pidfile)
    cgroup_path = child.cgroup.path if child.cgroup is not None else None

    killed, left = await procs.kill_run(child.run_id)

    assert killed == 2  # the CLI and its escaped grandchild
    assert left == []
    assert procs.marked_pids(child.run_id) == []
    assert await child.wait() == ExitStatus(None, signal.SIGKILL)
    if cgroup_path is not None:
        assert not os.path.exists(cgroup_path)  # noqa: ASYNC240 - one stat
        child.cgroup = None  # removed by kill_run


async def test_marked_processes_are_killed_without_pidfds_too(
    spawn_fake: Spawn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pidfd(pid: int) -> int:
        raise PermissionError("pidfd_open refused by a seccomp filter")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    # Out of the group and (cgroup=False) out of any run cgroup: only the marker finds it.
    child, pidfile = await spawn_grandchild(spawn_fake, tmp_path, "then=hang", cgroup=False)
    grandchild = await _grandchild_pid(child, pidfile)
    await child.terminate(grace=0.1)
    assert procs.marked_pids(child.run_id) == []
    assert not alive(grandchild)
