"""``codelegate serve`` refused at start-up by its own folders and store: one named line on the
terminal and exit 1, never a traceback; ``doctor`` reports the same beforehand, and a store it
refuses is left byte for byte as it was.

Each daemon is a real child process (``tests/reliability/served.py``), started expecting it not
to come up (a bounded wait on its exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from codelegate.daemon.cli import doctor
from codelegate.daemon.store import queries
from tests.reliability.served import ROOT, Served, write_config
from tests.store.conftest import newer_store


async def _refused(config: Path, state: Path, home: Path) -> tuple[list[str], list[str]]:
    """doctor's PROBLEM lines (it must exit 1), then serve's lines on the terminal (it must exit
    1 and print no traceback)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # doctor runs a loop of its own: in a thread
        assert await asyncio.to_thread(doctor, str(config), {}) == 1
    problems = [line for line in out.getvalue().splitlines() if line.startswith("PROBLEM ")]
    await asyncio.to_thread(home.mkdir)
    served = Served(config, state, home)
    assert await served.exits() == 1
    log = served.log.read_text()
    assert "Traceback" not in log
    return problems, [line for line in log.splitlines() if line.startswith("codelegate")]


@pytest.mark.parametrize(
    ("key", "where", "why"),
    [
        ("server.socket", "file/d.sock", "File exists"),  # the folder is a file
        ("server.socket", "file/run/d.sock", "Not a directory"),  # a file on the way
        ("store.path", "file/run/e.db", "Not a directory"),
    ],
)
async def test_a_folder_serve_cannot_create_is_one_named_line_exit_1_and_a_doctor_problem(
    key: str, where: str, why: str, short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    (short_dir / "file").write_bytes(b"")
    path = short_dir / where
    socket, store = (path, None) if key == "server.socket" else (None, path)
    config = write_config(short_dir, workspace, socket=socket, store=store)
    problems, said = await _refused(config, short_dir, tmp_path / "home")
    assert problems == [f"PROBLEM {key}: cannot create {path.parent}: {why}"]
    assert said == [f"codelegate: cannot create {path.parent} for {key}: {why}"]


def _random_bytes(path: Path) -> None:
    path.write_bytes(secrets.token_bytes(4096))


NEWER: Final = queries.newer(queries.SCHEMA_VERSION + 1)


@pytest.mark.parametrize(
    ("made", "problem", "why"),
    [
        (Path.mkdir, "{path} is a folder, not a store file", "Is a directory"),
        (_random_bytes, "{path} is not an SQLite database", "file is not a database"),
        (newer_store, f"{{path}}: {NEWER}", f"{NEWER}; it is left as it is"),
    ],
)
async def test_a_store_serve_cannot_open_is_one_named_line_exit_1_a_doctor_problem_and_untouched(
    made: Callable[[Path], object],
    problem: str,
    why: str,
    short_dir: Path,
    workspace: Path,
    tmp_path: Path,
) -> None:
    store = short_dir / "e.db"
    made(store)
    before = _left(store)[0] if store.is_file() else None
    config = write_config(short_dir, workspace, store=store)
    problems, said = await _refused(config, short_dir, tmp_path / "home")
    assert problems == [f"PROBLEM store.path: {problem.format(path=store)}"]
    assert said == [f"codelegate: store.path: cannot open the run store {store}: {why}"]
    if before is not None:  # refused, and not a byte of it changed (no WAL beside it either)
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

    def cli(command_name: str) -> subprocess.CompletedProcess[str]:
        argv = [command_name, "--config", str(config)]
        command = [*drop, sys.executable, "-m", "codelegate.daemon.cli", *argv]
        return subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )

    names = {"folder": folder, "file": file, "key": key}
    try:
        _both_refuse(cli, key, doctor_says.format(**names), serve_says.format(**names))
    finally:  # open again, or short_dir's removal cannot empty them (as a uid that is not root)
        locked.chmod(0o755)
        if exists:
            folder.chmod(0o755)
    assert exists or not folder.exists()


def _both_refuse(
    cli: Callable[..., subprocess.CompletedProcess[str]], key: str, problem: str, said: str
) -> None:
    """doctor exits 1 with the one PROBLEM, serve exits 1 with the one line, no traceback."""
    doctor_said = cli("doctor")
    assert doctor_said.returncode == 1, doctor_said.stdout
    problems = [line for line in doctor_said.stdout.splitlines() if line.startswith("PROBLEM")]
    assert problems == [f"PROBLEM {key}: {problem}: Permission denied"]
    served = cli("serve")
    assert served.returncode == 1
    assert "Traceback" not in served.stderr + served.stdout
    assert [line for line in served.stderr.splitlines() if line.startswith("codelegate")] == [
        f"codelegate: {said}: Permission denied"
    ]


async def test_a_daemon_whose_cli_does_not_answer_serves_and_says_so_at_start(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-claude")
    config = write_config(short_dir, workspace, claude=missing)
    home = tmp_path / "home"
    await asyncio.to_thread(home.mkdir)
    served = Served(config, short_dir, home)
    await served.start()  # it serves: the CLI may be installed while it runs
    try:
        status, health = await served.json("GET", "/healthz")
        assert (status, health["cli_version"]) == (200, None)
    finally:
        assert await served.stop() == 0
    said = [line for line in served.log.read_text().splitlines() if line.startswith("codelegate")]
    assert f"codelegate: warning: {missing} does not answer --version" in "\n".join(said)


def test_a_too_long_socket_path_is_one_line_of_serve_and_a_doctor_problem_with_the_fix(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    # Was "cannot bind …: AF_UNIX path too long" from serve, after making the folder; doctor
    # passed.
    socket = short_dir / ("s" * 100) / "d.sock"
    config = write_config(short_dir, workspace, socket=socket)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}

    def cli(name: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "codelegate.daemon.cli", name, "--config", str(config)]
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    problem = (
        f"server.socket: {socket} is {len(str(socket).encode())} bytes long, over the 107 a Unix"
        " socket path may have; choose a shorter [server] socket"
    )
    doctor_said = cli("doctor")
    assert doctor_said.returncode == 1
    assert [x for x in doctor_said.stdout.splitlines() if x.startswith("PROBLEM")] == [
        f"PROBLEM {problem}"
    ]
    served = cli("serve")
    assert served.returncode == 1
    assert "Traceback" not in served.stderr + served.stdout
    assert [x for x in served.stderr.splitlines() if x.startswith("codelegate")] == [
        f"codelegate: {problem}"
    ]
    assert not socket.parent.exists()


def _shut_folders(base: Path) -> tuple[Path, Path, Path]:
    """``base/state`` open to every uid (socket, store), ``base/ws`` a root with a folder
    ``private`` no uid but root may enter, and ``base/closed``, a root no uid but root may."""
    base.chmod(0o755)  # the config, the workspaces and the CLI reachable by that uid
    state, usable, closed = base / "state", base / "ws", base / "closed"
    for folder in (state, usable, closed, usable / "private"):
        folder.mkdir()
    state.chmod(0o777)
    for shut in (closed, usable / "private"):
        shut.chmod(0o600)  # no search (x) bit
    return state, usable, closed


def _with_roots(config: Path, roots: list[Path]) -> Path:
    text = re.sub(
        r"(?m)^workspaces = .*$",
        f"workspaces = {json.dumps(list(map(str, roots)))}",
        config.read_text(),
    )
    config.write_text(text)
    return config


async def test_a_workspace_root_this_uid_may_not_enter_is_named_by_doctor_serve_and_each_run(
    short_dir: Path,
) -> None:
    # Accepted before, and every run then failed as "cannot start claude: Permission denied":
    # the chdir into the workspace, not the CLI.
    drop = _as_this_uid_or_nobody()
    uid = NOBODY if drop else os.getuid()
    state, usable, closed = await asyncio.to_thread(_shut_folders, short_dir)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(state)}
    config = await asyncio.to_thread(
        write_config, state, closed, server=f"allowed_uids = [{os.getuid()}]\n"
    )

    def cli(name: str) -> subprocess.CompletedProcess[str]:
        argv = [*drop, sys.executable, "-m", "codelegate.daemon.cli", name, "--config", str(config)]
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    problem = (
        f"uid {uid} may not enter {closed} (Permission denied: no search permission), so no run"
        f" can start in {closed}; give uid {uid} search permission there (chmod, or a group it"
        " is in) or serve as a user that has it"
    )
    said = await asyncio.to_thread(cli, "doctor")
    assert said.returncode == 1
    assert [x for x in said.stdout.splitlines() if x.startswith("PROBLEM")] == [
        f"PROBLEM policy.workspaces[0]: {problem}"
    ]
    # Its only root: serve refuses to start, in one line.
    said = await asyncio.to_thread(cli, "serve")
    assert said.returncode == 1
    assert [x for x in said.stderr.splitlines() if x.startswith("codelegate")] == [
        f"codelegate: no workspace root is usable: policy.workspaces[0]: {problem}"
    ]
    # Beside a usable root: served, said at start, and a run in there is refused by name.
    await asyncio.to_thread(_with_roots, config, [usable, closed])
    served = Served(config, state, state, env, prefix=tuple(drop))
    await served.start()
    refused = {}
    try:
        for cwd in (closed, usable / "private", usable / "private" / "deeper"):
            body = {"task": "fake: normal", "cwd": str(cwd), "wait": True}
            status, answer = await served.json("POST", "/v1/runs", json=body)
            refused[cwd] = (status, answer["error"]["code"], answer["error"]["message"])
    finally:
        assert await served.stop() == 0
    for cwd, shut in (
        (closed, closed),
        (usable / "private", usable / "private"),
        (usable / "private" / "deeper", usable / "private"),
    ):
        assert refused[cwd] == (
            403,
            "workspace_permission_denied",
            f"cwd {str(cwd)!r} refused: the daemon's user may not enter {shut} (Permission"
            " denied: no search permission)",
        )
    log = await asyncio.to_thread(served.log.read_text)
    assert [x for x in log.splitlines() if x.startswith("codelegate: warning")] == [
        f"codelegate: warning: policy.workspaces[1]: {problem}"
    ]
