"""Workspace containment: a run's cwd must resolve, symlinks followed, to a directory in a root.

The decision is made on the fully resolved path (``realpath`` comes in as a callable), compared
component-wise so that ``/srv/ws2`` is not inside ``/srv/ws``. The caller then starts the run in
the returned path, not in what was requested, so that nothing is resolved twice.

A directory the daemon's user may not enter (no search permission on it or on a folder above)
is refused by name: the CLI could not be started there, and "cannot start claude: Permission
denied" would blame the CLI for the workspace's mode.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from codelegate.policy.codes import (
    WORKSPACE_INVALID,
    WORKSPACE_NOT_DIRECTORY,
    WORKSPACE_OUTSIDE_ROOTS,
    WORKSPACE_PERMISSION_DENIED,
)
from codelegate.policy.errors import PolicyError
from codelegate.policy.paths import is_inside

if TYPE_CHECKING:
    from codelegate.policy.config import Config

# Paths there name another process's view of the filesystem (/proc/self/cwd is the daemon's own
# cwd, /proc/<pid>/root another root), or devices: never a workspace, whatever they resolve to.
_KERNEL_TREES: Final = ("/proc", "/sys", "/dev")


def _in_kernel_tree(path: str) -> bool:
    # POSIX keeps a leading "//" through normpath and realpath; the kernel treats it as "/".
    path = "/" + path.lstrip("/")
    return any(is_inside(path, tree) for tree in _KERNEL_TREES)


def closed_folder(
    path: str, *, isdir: Callable[[str], bool], can_enter: Callable[[str], bool]
) -> str | None:
    """The first existing folder on the way to the absolute ``path`` (``path`` itself included)
    that ``can_enter`` says the daemon's user may not enter; None when there is none.

    A component that is no directory (missing, a file) ends the walk: that is another refusal.
    """
    folder = "/"
    for part in [p for p in path.split("/") if p]:
        folder = posixpath.join(folder, part)
        if not can_enter(folder):
            return folder if isdir(folder) else None
    return None


def no_entry(folder: str, who: str = "the daemon's user") -> str:
    """What is wrong with a folder the daemon's user may not enter: the one wording."""
    return f"{who} may not enter {folder} (Permission denied: no search permission)"


def resolve_workspace(
    config: Config,
    requested: str,
    *,
    realpath: Callable[[str], str],
    isdir: Callable[[str], bool],
    can_enter: Callable[[str], bool],
) -> str:
    """The resolved directory a run starts in; PolicyError 403 with the reason otherwise.

    ``requested`` is absolute, or relative to the first workspace root. ``..`` components are
    refused outright rather than resolved: a caller names a directory, it does not navigate.
    ``can_enter`` tells whether the daemon's user may enter a directory (``os.access`` X_OK).
    """
    roots = config.policy.workspaces

    def refuse(code: str, reason: str) -> PolicyError:
        return PolicyError(code, f"cwd {requested!r} refused: {reason}")

    if "\x00" in requested:
        raise refuse(WORKSPACE_INVALID, "it contains a NUL byte")
    if not requested.strip():
        raise refuse(WORKSPACE_INVALID, "it is empty; use '.' for the first workspace root")
    if ".." in requested.split("/"):
        raise refuse(WORKSPACE_INVALID, "'..' is not allowed; name a directory inside a root")
    if not roots:
        raise refuse(WORKSPACE_OUTSIDE_ROOTS, "no workspace roots are configured")
    candidate = requested if requested.startswith("/") else posixpath.join(roots[0], requested)
    if _in_kernel_tree(posixpath.normpath(candidate)):
        raise refuse(WORKSPACE_INVALID, "/proc, /sys and /dev are never workspaces")
    try:
        resolved = realpath(candidate)
        real_roots = [realpath(root) for root in roots]
    except (OSError, ValueError) as exc:
        raise refuse(WORKSPACE_NOT_DIRECTORY, f"it cannot be resolved ({exc})") from None
    if _in_kernel_tree(resolved) or not any(is_inside(resolved, root) for root in real_roots):
        raise refuse(
            WORKSPACE_OUTSIDE_ROOTS,
            f"it resolves outside every workspace root ({', '.join(roots)})",
        )
    closed = closed_folder(resolved, isdir=isdir, can_enter=can_enter)
    if closed is not None:
        raise refuse(WORKSPACE_PERMISSION_DENIED, no_entry(closed))
    if not isdir(resolved):
        raise refuse(WORKSPACE_NOT_DIRECTORY, "it is not an existing directory")
    return resolved
