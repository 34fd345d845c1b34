"""codelegate: a ConnectOnion agent delegates coding work to Claude Code, and the user watches.

The one import name the project installs. Its parts live in the repository's own folders and are
mapped here by the symlinks beside this file, so the tree keeps the user's layout while an installed
wheel, an editable install, mypy, coverage and the tests all see the same names:

- ``codelegate.translator``: stream-json lines in, frames out (pure);
- ``codelegate.policy``: what a run may do, decided before it starts (pure);
- ``codelegate.daemon``: the imperative shell that carries both out.

A ConnectOnion agent needs only the tool, which is standard library only::

    from codelegate import claude_code
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from codelegate.daemon.clients.tool import ClaudeCode, claude_code

__version__ = "0.1.0"

__all__ = ["ClaudeCode", "__version__", "claude_code"]


def __getattr__(name: str) -> Any:
    # The tool is imported when it is asked for, not with the package: ``python -m
    # codelegate.daemon.clients.tool`` (the image's HEALTHCHECK) would otherwise find its own
    # module imported already, and warn on every probe.
    if name in ("ClaudeCode", "claude_code"):
        from codelegate.daemon.clients import tool

        return getattr(tool, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
