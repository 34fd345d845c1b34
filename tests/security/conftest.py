"""Fixtures for the abuse suite: a daemon whose "Claude" is a spy that records every start
(``tests.fakes.spy``), so a test can say "this request spawned nothing" by reading its record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from codelegate.policy.config import Config
from tests.daemon.conftest import Daemon, make_config, start_daemon, stop_daemon
from tests.fakes.spy import Spy


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
