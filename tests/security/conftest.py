"""Fixtures for the abuse suite: a daemon whose "Claude" is a spy that records every start.

The spy is a tiny shell script in front of the fault-injecting fake CLI: every start except
``--version`` (the daemon asks for it at start-up) appends a line to a file, so a test can say
"this request spawned nothing" by reading that file.
"""

from __future__ import annotations

import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from codelegate.policy.config import Config
from tests.daemon.conftest import (  # log_stream: the fixture, shared
    Daemon,
    log_stream,
    make_config,
    start_daemon,
    stop_daemon,
)

# The real daemon + real CLI + API stub of the end-to-end suite, for the tests that need the
# pinned CLI to plant the input (settings isolation).
from tests.e2e.conftest import (  # noqa: F401
    daemon_approvals,
    daemon_claude,
    daemon_policy,
    daemon_server,
    e2e,
)
from tests.fakes import FAKE_CLAUDE

__all__ = ["log_stream"]


class Spy:
    """The spy CLI's path and the record of its starts."""

    def __init__(self, folder: Path) -> None:
        self.log = folder / "spawned.log"
        self.path = folder / "claude-spy"
        self.path.write_text(
            "#!/bin/sh\n"
            'case " $* " in *" --version "*) ;; *) echo "$$ $PWD" >> '
            + f"'{self.log}'"
            + " ;; esac\n"
            f"exec '{sys.executable}' '{FAKE_CLAUDE}' \"$@\"\n"
        )
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    @property
    def starts(self) -> list[str]:
        """One ``"<pid> <cwd>"`` line per start."""
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """Two workspace roots side by side: ``<tmp>/ws`` and ``<tmp>/ws2``."""
    a, b = tmp_path / "ws", tmp_path / "ws2"
    (a / "sub").mkdir(parents=True)
    b.mkdir()
    return a, b


@pytest.fixture
def spy(tmp_path: Path) -> Spy:
    folder = tmp_path / "spy"
    folder.mkdir()
    return Spy(folder)


def spy_config(
    short_dir: Path, roots: tuple[Path, Path], spy: Spy, **sections: dict[str, object]
) -> Config:
    policy = {"workspaces": [str(roots[0]), str(roots[1])], "run_timeout_s": 5.0}
    policy.update(sections.pop("policy", {}))
    sections.setdefault("claude", {})
    sections["claude"] = {"path": str(spy.path), **sections["claude"]}
    return make_config(short_dir, roots[0], policy=policy, **sections)


@pytest.fixture
async def sdaemon(
    short_dir: Path, roots: tuple[Path, Path], spy: Spy, tmp_path: Path
) -> AsyncIterator[Daemon]:
    config = spy_config(short_dir, roots, spy, limits={"task_bytes": 1024})
    d = await start_daemon(config, tmp_path)
    yield d
    await stop_daemon(d)
