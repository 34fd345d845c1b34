"""Finding, killing and reaping the processes of a run, wherever they went.

A run's processes cannot be found through the process tree or the process group: the Claude
CLI's Bash tool starts commands with ``setsid``, and a tool process that double-forks is adopted
by the nearest subreaper (pid 1 by default). What every descendant does keep is the environment
it was started with, so each run's environment carries ``CODELEGATE_RUN_ID=<run_id>`` and this
module finds a run's processes by scanning ``/proc/<pid>/environ`` of the processes of our uid.

Limits, said plainly: a process that re-executes itself with a scrubbed environment (``env -i``)
or changes uid is no longer attributable this way; a delegated cgroup per run would be (see
the operator README). Zombies have no environment and are not counted as alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import Iterator
from typing import Final

from codelegate.daemon.supervision.cgroups import RunCgroup
from codelegate.policy.environment import RUN_MARKER_VAR

_PR_SET_CHILD_SUBREAPER: Final = 36
_PROC: Final = "/proc"

# Direct children started by ChildProcess.spawn: asyncio's child watcher waits for exactly these
# pids, so the orphan reaper must never reap them (it would steal their exit status).
_direct_children: set[int] = set()
# While a spawn is in flight the new pid is not registered yet; the reaper stands aside.
_spawning = 0
# Orphans seen alive carrying a run marker: once they die their environ is gone, so remember.
_seen_marked: set[int] = set()


def marker_entry(run_id: str) -> bytes:
    """The exact environ entry that marks a process as belonging to ``run_id``."""
    return f"{RUN_MARKER_VAR}={run_id}".encode()


def become_subreaper(on: bool = True) -> bool:
    """Make this process a child subreaper, so orphans of runs are re-parented to us.

    Returns False where prctl is unavailable (not Linux, or a seccomp filter refuses it).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _pids() -> Iterator[int]:
    with os.scandir(_PROC) as entries:
        for entry in entries:
            if entry.name.isdigit():
                yield int(entry.name)


def _read_environ(pid: int) -> bytes:
    with open(f"{_PROC}/{pid}/environ", "rb") as fh:
        return fh.read()


def _carries(environ: bytes, entry: bytes) -> bool:
    # Entries are NUL-separated; anchor both ends so run "a1" does not match run "a10".
    return b"\0" + entry + b"\0" in b"\0" + environ + b"\0"


def _stat_fields(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session) of ``pid`` from /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm may contain spaces and parentheses: the fields start after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    if len(rest) < 4:
        return None
    return rest[0], int(rest[1]), int(rest[3])


def marked_pids(run_id: str) -> list[int]:
    """Live (non-zombie) processes of our uid whose environment carries the run's marker."""
    entry = marker_entry(run_id)
    me, uid = os.getpid(), os.getuid()
    found: list[int] = []
    for pid in _pids():
        if pid == me:
            continue
        try:
            if os.stat(f"{_PROC}/{pid}").st_uid != uid:
                continue
            environ = _read_environ(pid)
        except OSError:  # gone, or not ours to read: neither can be killed by us anyway
            continue
        if _carries(environ, entry):
            found.append(pid)
    return found


def _kill_if_marked(pid: int, entry: bytes, sig: int) -> bool:
    """Signal ``pid`` only if it still carries ``entry``.

    The pidfd pins the process: if the pid was recycled between the scan and now, the re-read
    environ belongs to the new process and does not match, so nothing unrelated is signalled.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfds (old kernel, seccomp): re-check and kill by pid, small race
        try:
            if _carries(_read_environ(pid), entry):
                os.kill(pid, sig)
                return True
        except OSError:
            pass
        return False
    try:
        if not _carries(_read_environ(pid), entry):
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False if the group is already empty."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def kill_run(
    run_id: str,
    *,
    pgid: int | None = None,
    cgroup: RunCgroup | None = None,
    leader: int | None = None,
    limit_s: float = 5.0,
    poll: float = 0.02,
) -> tuple[int, list[int]]:
    """SIGKILL the group (if given), the run's cgroup and every process carrying the run's
    marker, until none is left.

    Without ``cgroup``, a cgroup of the run still on disk (left by a daemon that died) is found,
    killed and removed too. Killed processes can no longer fork, so repeated sweeps converge; a
    child forked between a scan and the kill is caught by the next sweep. Bounded by
    ``limit_s``. Returns (number of distinct processes other than ``leader`` signalled, pids
    still alive at the deadline).
    """
    entry = marker_entry(run_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    signalled: set[int] = set()
    leftover = RunCgroup.existing(run_id) if cgroup is None else None
    group = cgroup or leftover
    if pgid is not None:  # once: later the pgid may be recycled; members carry the marker
        signal_group(pgid, signal.SIGKILL)
    while True:
        if group is not None:
            signalled.update(group.kill())
        # A /proc scan is quick but does file I/O on every process: keep it off the loop.
        left = await asyncio.to_thread(marked_pids, run_id)
        for pid in left:
            if _kill_if_marked(pid, entry, signal.SIGKILL):
                signalled.add(pid)
        reap_orphans()
        busy = bool(left) or (group is not None and group.populated())
        if not busy or loop.time() >= deadline:
            if leftover is not None:
                leftover.remove()
            signalled.discard(leader or 0)
            return len(signalled), left
        await asyncio.sleep(poll)  # let the kernel finish tearing the killed processes down


def register_child(pid: int) -> None:
    """Tell the reaper that asyncio waits for ``pid`` (a direct child we spawned)."""
    _direct_children.add(pid)


def unregister_child(pid: int) -> None:
    """``pid`` has been waited for by asyncio; it is no longer ours to protect."""
    _direct_children.discard(pid)


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Hold the reaper off while a child is being spawned and not yet registered."""
    global _spawning
    _spawning += 1
    try:
        yield
    finally:
        _spawning -= 1


def reap_orphans() -> int:
    """Reap zombie orphans re-parented to us; never a child asyncio itself is waiting for.

    Independent of SIGCHLD (asyncio or uvloop own that): asyncio's watchers call ``waitpid`` on
    the specific pids they spawned, so we only ``waitpid`` pids that are (a) our children, (b)
    not registered direct children, (c) zombies, and (d) known to be run processes: seen alive
    with a marker, or in a session other than ours (every run starts in a new session; other
    code in the daemon must keep its own children in the daemon's session). Returns the count.
    Must be called from the event loop thread, which is where spawns register their pids.
    """
    if _spawning:
        return 0
    me = os.getpid()
    my_session = os.getsid(0)
    reaped = 0
    for pid in _children():
        if pid in _direct_children:
            continue
        fields = _stat_fields(pid)
        if fields is None or fields[1] != me:
            continue
        state, _, session = fields
        if state != "Z":
            if pid not in _seen_marked and _has_any_marker(pid):
                _seen_marked.add(pid)
            continue
        if pid not in _seen_marked and session == my_session:
            continue
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                reaped += 1
        _seen_marked.discard(pid)
    return reaped


def _children() -> list[int]:
    """Our child processes; cheap where the kernel lists them per thread, else a /proc scan."""
    found: set[int] = set()
    try:
        with os.scandir(f"{_PROC}/self/task") as tasks:
            for task in tasks:
                # Orphans are re-parented to some thread of the subreaper: ask every thread.
                with open(f"{task.path}/children", "rb") as fh:
                    found.update(int(pid) for pid in fh.read().split())
    except FileNotFoundError:  # no CONFIG_PROC_CHILDREN; ppid is checked by the caller
        return list(_pids())
    except OSError:
        pass  # a thread that ended while we looked: what we have is good for this round
    return sorted(found)


def _has_any_marker(pid: int) -> bool:
    try:
        return carries_a_marker(pid)
    except OSError:
        return False


def carries_a_marker(pid: int) -> bool:
    """Whether ``pid``'s environment carries a run marker (of any run); OSError when it cannot
    be read (gone, or another uid's)."""
    return (b"\0" + _read_environ(pid)).find(b"\0" + RUN_MARKER_VAR.encode() + b"=") >= 0


def run_ancestry(pid: int, limit: int) -> bool | None:
    """Whether ``pid`` descends from this process through a session other than ours: True, it
    is a process of a run; False, it is not; None when its chain is deeper than ``limit`` or an
    ancestor vanished while we looked.

    Every run starts in a session of its own, sessions are inherited and no process can join
    one it did not start (``setsid`` only makes a new one), so a process of a run is never in
    our session; and since we are a child subreaper, a run's orphans (``setsid`` and double
    forks included) are re-parented to us, so they stay our descendants. A descendant in our
    own session is something this process started itself (a test's client, ``claude
    --version``), not a run. OSError when ``pid`` itself is gone.
    """
    fields = _stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    me, session = os.getpid(), fields[2]
    for _ in range(limit):
        parent = fields[1]
        if parent == me:
            return session != os.getsid(0)
        if parent <= 1:  # init, or a parent outside our pid namespace: not ours
            return False
        fields = _stat_fields(parent)
        if fields is None:
            return None
    return None


async def reap_orphans_forever(interval: float = 1.0) -> None:
    """Periodically reap orphans (run it as a background task for the daemon's lifetime)."""
    while True:
        reap_orphans()
        await asyncio.sleep(interval)
