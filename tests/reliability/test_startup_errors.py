"""``codelegate serve`` refused at start-up by its own folders and store: one named line on the
terminal and exit 1, never a traceback; ``doctor`` reports the same beforehand, and a store it
refuses is left byte for byte as it was.

Each daemon is a real child process (``tests/reliability/served.py``), started expecting it not
to come up (a bounded wait on its exit).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from codelegate.daemon.cli import doctor
from codelegate.daemon.store import queries
from tests.reliability.served import ROOT, Served, write_config

# What the daemon's folders and store are made of in each case: (socket, store) for a folder
# ``state`` holding a regular file ``state/file``; the line serve prints and doctor's PROBLEM.
Case = Callable[[Path], tuple[Path | None, Path | None, str, str]]


def _socket_folder_is_a_file(state: Path) -> tuple[Path | None, Path | None, str, str]:
    file = state / "file"
    return (
        file / "d.sock",
        None,
        f"cannot create {file} for server.socket: File exists",
        f"server.socket: cannot create {file}: File exists",
    )


def _socket_folder_under_a_file(state: Path) -> tuple[Path | None, Path | None, str, str]:
    file = state / "file"
    return (
        file / "run" / "d.sock",
        None,
        f"cannot create {file / 'run'} for server.socket: Not a directory",
        f"server.socket: cannot create {file / 'run'}: Not a directory",
    )


def _store_folder_under_a_file(state: Path) -> tuple[Path | None, Path | None, str, str]:
    file = state / "file"
    return (
        None,
        file / "sub" / "e.db",
        f"cannot create {file / 'sub'} for store.path: Not a directory",
        f"store.path: cannot create {file / 'sub'}: Not a directory",
    )


def _store_is_a_folder(state: Path) -> tuple[Path | None, Path | None, str, str]:
    store = state / "store.db"
    store.mkdir()
    return (
        None,
        store,
        f"store.path: cannot open the run store {store}: Is a directory",
        f"store.path: {store} is a folder, not a store file",
    )


def _store_is_not_sqlite(state: Path) -> tuple[Path | None, Path | None, str, str]:
    store = state / "store.db"
    store.write_bytes(secrets.token_bytes(4096))
    return (
        None,
        store,
        f"store.path: cannot open the run store {store}: file is not a database",
        f"store.path: {store} is not an SQLite database",
    )


def _store_is_newer(state: Path) -> tuple[Path | None, Path | None, str, str]:
    # As a newer daemon might leave it: another schema version, and no WAL (rollback journal).
    store = state / "store.db"
    newer = queries.SCHEMA_VERSION + 1
    conn = sqlite3.connect(store)
    conn.execute("CREATE TABLE later (x BLOB)")
    conn.execute("INSERT INTO later VALUES (?)", (secrets.token_bytes(64),))
    conn.execute(f"PRAGMA user_version = {newer}")
    conn.commit()
    conn.close()
    why = f"schema version {newer} is newer than this daemon's ({queries.SCHEMA_VERSION})"
    return (
        None,
        store,
        f"store.path: cannot open the run store {store}: {why}; it is left as it is",
        f"store.path: {store}: {why}",
    )


@pytest.mark.parametrize(
    "case",
    [
        _socket_folder_is_a_file,
        _socket_folder_under_a_file,
        _store_folder_under_a_file,
        _store_is_a_folder,
        _store_is_not_sqlite,
        _store_is_newer,
    ],
)
async def test_a_folder_or_store_serve_cannot_use_is_one_named_line_exit_1_and_a_doctor_problem(
    case: Case,
    short_dir: Path,
    workspace: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (short_dir / "file").write_bytes(b"")
    socket, store, said, problem = case(short_dir)
    before = _left(store)[0] if store is not None and store.is_file() else None
    config = write_config(short_dir, workspace, socket=socket, store=store)

    assert await asyncio.to_thread(doctor, str(config), {}) == 1  # it runs a loop of its own
    assert f"PROBLEM {problem}" in capsys.readouterr().out.splitlines()

    home = tmp_path / "home"
    home.mkdir()
    served = Served(config, short_dir, home)
    assert await served.exits() == 1
    log = served.log.read_text()
    assert "Traceback" not in log
    assert [line for line in log.splitlines() if line.startswith("codelegate")] == [
        f"codelegate: {said}"
    ]
    if store is not None and before is not None:  # refused, and not a byte of it changed
        assert _left(store) == (before, False)


def _left(store: Path) -> tuple[bytes, bool]:
    """The store file's bytes, and whether a WAL was made beside it."""
    return store.read_bytes(), os.path.exists(f"{store}-wal")


# As root every folder is writable: the daemon then runs as nobody (setpriv), as in a container
# with --user or a unit's User= that may not create /run/codelegate.
NOBODY: Final = 65534


def _as_this_uid_or_nobody() -> list[str]:
    if os.getuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: no uid here that a folder's mode stops")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.mark.parametrize(
    ("key", "exists", "doctor_says", "serve_says"),
    [
        ("server.socket", False, "cannot create {folder}", "cannot create {folder} for {key}"),
        ("store.path", False, "cannot create {folder}", "cannot create {folder} for {key}"),
        # There, but closed to this uid: serve cannot even look for a stale socket in it.
        ("server.socket", True, "cannot write in {folder}", "cannot reach {file} for {key}"),
        (
            "store.path",
            True,
            "cannot write in {folder}",
            "cannot open the store lock {file}.lock for {key}",
        ),
    ],
)
def test_a_folder_this_uid_may_not_create_or_enter_is_named_by_serve_and_by_doctor(
    key: str, exists: bool, doctor_says: str, serve_says: str, short_dir: Path
) -> None:
    drop = _as_this_uid_or_nobody()
    short_dir.chmod(0o755)  # the config, the workspace and the CLI reachable by that uid
    workspace, home, locked = short_dir / "ws", short_dir / "home", short_dir / "locked"
    workspace.mkdir()
    home.mkdir()
    home.chmod(0o777)  # where that uid may write: the other of socket and store goes there
    locked.mkdir()
    folder = locked / "codelegate"
    if exists:
        folder.mkdir()
        folder.chmod(0)
    else:
        locked.chmod(0o555)  # like /run to a uid that is not root
    socket, store = home / "d.sock", home / "store.db"
    if key == "server.socket":
        socket = file = folder / "d.sock"
    else:
        store = file = folder / "e.db"
    config = write_config(short_dir, workspace, socket=socket, store=store)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [*drop, sys.executable, "-m", "codelegate.daemon.cli", *argv]
        return subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )

    names = {"folder": folder, "file": file, "key": key}
    doctor_said = cli("doctor", "--config", str(config))
    assert doctor_said.returncode == 1, doctor_said.stdout
    problem = f"PROBLEM {key}: {doctor_says.format(**names)}: Permission denied"
    assert problem in doctor_said.stdout.splitlines()
    served = cli("serve", "--config", str(config))
    assert served.returncode == 1
    assert "Traceback" not in served.stderr + served.stdout
    assert [line for line in served.stderr.splitlines() if line.startswith("codelegate")] == [
        f"codelegate: {serve_says.format(**names)}: Permission denied"
    ]
    assert exists or not folder.exists()
