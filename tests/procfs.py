"""The tests' own reading of /proc: which processes carry a run's marker, and their command lines.

An oracle independent of the code under test (``supervision.procs`` reads /proc for the daemon):
a test that asks the daemon's own scanner whether the daemon's own kill worked proves less.
"""

from __future__ import annotations

import os

from codelegate.policy.environment import RUN_MARKER_VAR

_MARKER = f"{RUN_MARKER_VAR}=".encode()


def marked_processes(run_id: str | None = None) -> list[int]:
    """Live (non-zombie) processes carrying ``run_id``'s marker in their environment, or any
    run's marker when ``run_id`` is None (DESIGN: supervision)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z":
            continue
        if run_id is None:
            hit = any(e.startswith(_MARKER) for e in environ)
        else:
            hit = _MARKER + run_id.encode() in environ
        if hit:
            found.append(int(entry))
    return found


def cmdline(pid: int) -> bytes:
    """``pid``'s command line (NUL-separated), or nothing once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""
