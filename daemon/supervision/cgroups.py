"""One cgroup v2 per run, where the daemon has a writable (delegated) cgroup subtree.

Cgroup membership is inherited by every descendant and cannot be left by ``setsid``, a double
fork or a scrubbed environment, and ``cgroup.kill`` SIGKILLs all members at once (Linux 5.14+),
so where it is available it is the stronger of the two ways to find a run's processes. The run
marker (:mod:`.procs`) is always used as well; the cgroup is an addition, never a
replacement, and everything falls back to the marker when no usable subtree is found.

Usable means: a cgroup2 mount, our own cgroup writable, a probe child cgroup can be made and
has ``cgroup.kill``; and if our cgroup is a systemd unit (``*.service``/``*.scope``), systemd
has delegated it (``Delegate=yes`` marks it with the ``user.delegate``/``trusted.delegate``
xattr), because systemd owns non-delegated unit cgroups.

The child joins its cgroup before it runs anything: it is started through ``/bin/sh``, which
writes ``0`` (itself) into the run cgroup's ``cgroup.procs`` and then ``exec``s the CLI under
the same pid. If that write fails the CLI still runs, attributable through the marker.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from typing import Final

_RUN_ID: Final = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_PREFIX: Final = "codelegate-run-"
# $1 is the cgroup.procs file; the rest is the real argv. Errors moving are ignored on purpose.
_JOIN_AND_EXEC: Final = 'echo 0 2>/dev/null >"$1"; shift; exec "$@"'
_SHELL: Final = "/bin/sh"

_detected = False
_base: str | None = None


def _cgroup2_mount() -> str | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split(" ")[4]
    except OSError:
        pass
    return None


def _own_cgroup() -> str | None:
    try:
        return _cgroup_of("self")
    except OSError:
        return None


def _cgroup_of(pid: int | str) -> str | None:
    """The cgroup v2 path of ``pid`` (``/proc/<pid>/cgroup``'s ``0::`` line); OSError when the
    process is gone or hidden."""
    with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("0::"):
                return line[3:].strip()
    return None


def in_a_run_cgroup(pid: int) -> bool:
    """Whether ``pid`` is in a run's cgroup (of any run; at any depth below it, where a run
    made cgroups of its own). OSError when the process cannot be inspected.

    A signal, not a proof: a run's process has the uid that owns the delegated subtree, so it
    could move itself out; the daemon's ancestry check does not depend on this."""
    path = _cgroup_of(pid) or ""
    return any(part.startswith(_PREFIX) for part in path.split("/"))


def _delegated_by_systemd(path: str) -> bool:
    for attr in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, attr).strip() == b"1":
                return True
    return False


def _probe(base: str) -> bool:
    probe = os.path.join(base, f"{_PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return os.path.exists(os.path.join(probe, "cgroup.kill"))
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def detect() -> str | None:
    """The cgroup under which run cgroups are made, or None (use the marker alone)."""
    mount, own = _cgroup2_mount(), _own_cgroup()
    if mount is None or own is None or not os.access(_SHELL, os.X_OK):
        return None  # without a shell to join the cgroup through, every spawn would fail
    base = os.path.normpath(os.path.join(mount, own.lstrip("/")))
    if not os.access(base, os.W_OK):
        return None
    if base.endswith((".service", ".scope")) and not _delegated_by_systemd(base):
        return None
    return base if _probe(base) else None


def delegated_base() -> str | None:
    """``detect()``, done once per process."""
    global _detected, _base
    if not _detected:
        _base, _detected = detect(), True
    return _base


def set_enabled(enabled: bool) -> None:
    """Turn cgroups per run off (the marker alone is used) or back on (detected again)."""
    global _detected, _base
    _detected, _base = (False, None) if enabled else (True, None)


def _run_path(run_id: str, base: str | None) -> str | None:
    """Where the cgroup of ``run_id`` is (under ``base``, else the delegated base); None when
    there is no usable base or the id could name another path."""
    base = base or delegated_base()
    if base is None or not _RUN_ID.match(run_id):
        return None
    return os.path.join(base, _PREFIX + run_id)


class RunCgroup:
    """The cgroup of one run."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls, run_id: str, base: str | None = None) -> RunCgroup | None:
        """Make the run's cgroup under the delegated base; None if unavailable."""
        path = _run_path(run_id, base)
        if path is None:
            return None
        try:
            os.mkdir(path)
        except OSError:
            return None
        return cls(path)

    @classmethod
    def existing(cls, run_id: str, base: str | None = None) -> RunCgroup | None:
        """The run's cgroup if it is still there (left by a daemon that died), else None."""
        path = _run_path(run_id, base)
        return cls(path) if path is not None and os.path.isdir(path) else None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` started so that it joins this cgroup before it runs."""
        return [_SHELL, "-c", _JOIN_AND_EXEC, "sh", self._file("cgroup.procs"), *argv]

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def pids(self) -> list[int]:
        """The processes in the cgroup (zombies excluded)."""
        try:
            with open(self._file("cgroup.procs"), encoding="ascii") as fh:
                return [int(line) for line in fh if line.strip()]
        except OSError:
            return []

    def populated(self) -> bool:
        """True while any process of the run is alive in the cgroup."""
        try:
            with open(self._file("cgroup.events"), encoding="ascii") as fh:
                return any(line.strip() == "populated 1" for line in fh)
        except OSError:
            return False

    def kill(self) -> list[int]:
        """SIGKILL every member at once. Returns the pids that were members."""
        members = self.pids()
        if members:
            with contextlib.suppress(OSError), open(self._file("cgroup.kill"), "w") as fh:
                fh.write("1")
        return members

    def remove(self) -> bool:
        """Remove the cgroup once it is empty; False while it still has members."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True
