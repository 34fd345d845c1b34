"""README "Giving an agent's user access", followed with real users: a service user runs the
daemon, an agent's user in the socket's group delegates through the socket into a shared
workspace, and a user outside it is told it lacks permission.

Needs root (it creates a group and three system users with groupadd/useradd, and removes them).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FAKE_CLAUDE

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("useradd") and shutil.which("groupadd")),
    reason="needs root with useradd/groupadd: it creates a group and users for the two-uid test",
)

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Accounts:
    group: str
    gid: int
    service: int  # runs the daemon, like the unit's codelegate user
    agent: int  # a calling agent's user, in the group
    outsider: int  # not in the group


def _world_executable(path: str) -> bool:
    parts = Path(path).parents
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [path, *map(str, parts)])


def _python_for_others() -> tuple[str, dict[str, str]]:
    """An interpreter the test's users may execute, and the path to this checkout and its deps.

    The venv's interpreter often links to one under a private home (pyenv in /root); a system
    Python of the same version can run the same code and wheels.
    """
    if _world_executable(os.path.realpath(sys.executable)):
        return sys.executable, {}
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if not (os.path.exists(candidate) and _world_executable(os.path.realpath(candidate))):
            continue
        version = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if version == want:
            return candidate, {"PYTHONPATH": f"{ROOT}:{sysconfig.get_paths()['purelib']}"}
    pytest.skip(f"no Python {want} that other users may execute (the venv's is private)")


def _uid(name: str) -> int:
    return int(subprocess.run(["id", "-u", name], capture_output=True, check=True).stdout)


@pytest.fixture
def accounts() -> Iterator[Accounts]:
    tag = secrets.token_hex(3)
    group, names = f"clg{tag}", [f"cls{tag}", f"cla{tag}", f"clo{tag}"]
    made: list[str] = []
    try:
        subprocess.run(["groupadd", "--system", group], check=True)
        for name in names:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/bin/false", name],
                check=True,
            )
            made.append(name)
        for name in names[:2]:  # the service user and the agent join the shared group
            subprocess.run(["usermod", "-a", "-G", group, name], check=True)
        gid = int(
            subprocess.run(
                ["getent", "group", group], capture_output=True, check=True
            ).stdout.split(b":")[2]
        )
        yield Accounts(group, gid, *(_uid(n) for n in names))
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False)
        subprocess.run(["groupdel", group], check=False)


def _as(uid: int, gids: list[int], umask: int, code: str, env: dict[str, str]) -> Any:
    """Python ``code`` as that user (with exactly those groups, as a login gives them)."""
    python, path = _python_for_others()
    return subprocess.run(
        [python, "-c", code],
        user=uid,
        # Without groups, its own primary group: its uid's number may be the shared group's gid.
        group=gids[0] if gids else pwd.getpwuid(uid).pw_gid,
        extra_groups=gids,
        umask=umask,
        env={"PATH": os.environ["PATH"], **path, **env},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class _Daemon:
    """``codelegate serve --config`` as the service user, umask 007 as the unit sets it; with
    ``own_pids``, in a pid namespace of its own, as a container runs it (its callers' pids are
    then 0 to it: it cannot inspect them)."""

    def __init__(self, acc: Accounts, config: Path, state: Path, own_pids: bool = False) -> None:
        python, path = _python_for_others()
        self.own_pids = own_pids
        argv = [python, "-m", "codelegate.daemon.cli", "serve", "--config", str(config)]
        ids: dict[str, Any] = {"user": acc.service, "group": acc.gid, "extra_groups": [acc.gid]}
        if own_pids:
            # The namespace needs root to make; the daemon gets the service ids inside it.
            become = [f"--reuid={acc.service}", f"--regid={acc.gid}", f"--groups={acc.gid}"]
            argv = ["unshare", "--pid", "--fork", "--mount-proc", "setpriv", *become, *argv]
            ids = {}
        self.proc = subprocess.Popen(
            argv,
            **ids,
            umask=0o007,
            cwd=state,
            env={"PATH": os.environ["PATH"], "HOME": str(state), **path},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # its log says when it listens (or why it cannot)
            if '"event":"listening"' in line.replace(" ", ""):
                return
        raise AssertionError(f"the daemon did not start: exit {self.proc.wait()}")

    def stop(self) -> None:
        pid = self.proc.pid
        if self.own_pids:
            # unshare --fork ignores SIGTERM while it waits: its child, the daemon, is told.
            (pid,) = map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        os.kill(pid, signal.SIGTERM)
        self.proc.communicate(timeout=60)  # drains and closes its log pipe


def _config(
    base: Path, acc: Accounts, allowed_gids: list[int], allowed_uids: list[int] | None = None
) -> Path:
    config = base / "config.toml"
    config.write_text(
        f'[server]\nsocket = "{base / "run" / "codelegate.sock"}"\nsocket_mode = "0660"\n'
        f"allowed_gids = {allowed_gids}\nallowed_uids = {allowed_uids or []}\n"
        f'[claude]\npath = "{FAKE_CLAUDE}"\n'
        f'[policy]\nworkspaces = ["{base / "workspaces"}"]\n'
        f'[store]\npath = "{base / "state" / "codelegate.db"}"\n'
    )
    config.chmod(0o644)
    return config


@pytest.fixture
def folders(accounts: Accounts) -> Iterator[Path]:
    """The service's folders (socket, state, workspaces), in a fresh base folder; ``proj`` (a
    workspace) is made in ``workspaces`` by the test, as the agent's user."""
    base = Path(tempfile.mkdtemp(prefix="cl-access-"))
    try:
        base.chmod(0o755)
        for name, mode in (("run", 0o2750), ("state", 0o700), ("workspaces", 0o2770)):
            os.mkdir(base / name)
            os.chown(base / name, accounts.service, accounts.gid)
            os.chmod(base / name, mode)  # setgid: what is made inside keeps the group
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _socket_env(base: Path) -> dict[str, str]:
    return {"CODELEGATE_SOCKET": str(base / "run" / "codelegate.sock")}


DELEGATE = (
    "import json, sys; from codelegate.daemon.clients.tool import call_run, socket_path; "
    "print(json.dumps(call_run({'task': 'fake: normal', 'cwd': sys.argv[1] if len(sys.argv) > 1 "
    "else '%s', 'mode': 'safe', 'wait': True}, socket_path())))"
)


def test_an_agents_user_delegates_through_the_socket_group_into_a_shared_workspace(
    accounts: Accounts, folders: Path
) -> None:
    acc, base = accounts, folders
    project = base / "workspaces" / "proj"
    env = _socket_env(base)
    delegate = DELEGATE % project

    # The example config ships allowed_gids = []: only the service user may call.
    daemon = _Daemon(acc, _config(base, acc, []), base / "state")
    try:
        refused = json.loads(_as(acc.agent, [acc.gid], 0o002, delegate, env).stdout)
        assert refused["error_code"] == "peer_not_allowed"
    finally:
        daemon.stop()
    # The README's step: allowed_gids = [the group's gid], restart.
    daemon = _Daemon(acc, _config(base, acc, [acc.gid]), base / "state")
    try:
        assert os.stat(env["CODELEGATE_SOCKET"]).st_gid == acc.gid  # the shared group
        made = _as(acc.agent, [acc.gid], 0o002, f"import os; os.mkdir({str(project)!r})", env)
        assert made.returncode == 0, made.stderr
        done = json.loads(_as(acc.agent, [acc.gid], 0o002, delegate, env).stdout)
        assert done["status"] == "completed", done

        # Outside the group: told it is a permission matter, not "is it serving?".
        out = json.loads(_as(acc.outsider, [], 0o022, delegate, env).stdout)
        assert out["error_code"] == "daemon_unreachable"
        assert "permission denied" in out["error"]
        term = _as(
            acc.outsider,
            [],
            0o022,
            "from codelegate.daemon.cli import main; main(['run', 'x'])",
            env,
        )
        assert "permission denied" in term.stdout + term.stderr
        said = " ".join((term.stdout + term.stderr).split())  # as rich wrapped it
        assert "to [server] allowed_gids" in said  # not read as markup
    finally:
        daemon.stop()

    # Files both sides can edit: the service's umask 007 and the agent's umask 002 keep
    # them group-writable; a caller's umask 022 does not (hence the README's umask step).
    for creator, umask, editor, editable in (
        (acc.agent, 0o002, acc.service, True),
        (acc.service, 0o007, acc.agent, True),
        (acc.agent, 0o022, acc.service, False),
    ):
        path = str(project / f"{creator}-{umask:o}.txt")
        made = _as(creator, [acc.gid], umask, f"open({path!r}, 'a').write('x')", {})
        assert made.returncode == 0, made.stderr
        edited = _as(editor, [acc.gid], 0o007, f"open({path!r}, 'a').write('y')", {})
        assert (edited.returncode == 0) is editable, (creator, umask, edited.stderr)


def test_a_daemon_in_a_pid_namespace_of_its_own_serves_a_caller_of_another_uid_only(
    accounts: Accounts, folders: Path
) -> None:
    # README "Docker": the daemon in a container cannot inspect a host process (its pid is 0
    # there), so it refuses its own uid from outside (one of its runs cannot be ruled out) and
    # serves a host user of another uid that the config allows, through the shared group.
    acc, base = accounts, folders
    project = base / "workspaces" / "proj"
    env = _socket_env(base)
    made = _as(acc.agent, [acc.gid], 0o002, f"import os; os.mkdir({str(project)!r})", env)
    assert made.returncode == 0, made.stderr
    config = _config(base, acc, [], allowed_uids=[acc.agent, acc.service])
    daemon = _Daemon(acc, config, base / "state", own_pids=True)
    try:
        done = json.loads(_as(acc.agent, [acc.gid], 0o002, DELEGATE % project, env).stdout)
        assert done["status"] == "completed", done
        same_uid = _as(acc.service, [acc.gid], 0o007, DELEGATE % project, env)
        assert json.loads(same_uid.stdout)["error_code"] == "peer_unknown"
    finally:
        daemon.stop()
