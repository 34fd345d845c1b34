"""The systemd units: they verify, they are hardened (exposure ≤ 2.0), and they agree with the
example config, the sysusers.d and the tmpfiles.d entries.

systemd-analyze ships with systemd and is on the machines CI uses; elsewhere these tests skip,
but under CI (CI=true) a missing tool is a failure, not a silent skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from codelegate.daemon.pinned import CLAUDE_CODE_VERSION
from codelegate.policy.config import parse_config
from tests.conftest import unavailable

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
SERVICE = SYSTEMD / "codelegate.service"
SOCKET = SYSTEMD / "codelegate.socket"
MAX_EXPOSURE = 2.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed")
    return path


def _directives(unit: Path) -> dict[str, list[str]]:
    """Key -> every value it is given (systemd allows repeats), ignoring sections and comments."""
    found: dict[str, list[str]] = {}
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key.strip(), []).append(value.strip())
    return found


def _installed_copy(tmp_path: Path) -> Path:
    """The units with ExecStart pointing at a binary that exists here (verify checks it)."""
    service = _directives(SERVICE)
    [exec_start] = service["ExecStart"]
    binary = exec_start.split()[0]
    text = SERVICE.read_text().replace(f"ExecStart={binary}", f"ExecStart={sys.executable}")
    (tmp_path / SERVICE.name).write_text(text)
    shutil.copy(SOCKET, tmp_path / SOCKET.name)
    return tmp_path / SERVICE.name


def test_units_verify(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze")
    service = _installed_copy(tmp_path)
    done = subprocess.run(
        [
            analyze,
            "verify",
            "--man=no",
            "--generators=false",
            str(service),
            str(service.parent / SOCKET.name),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # verify only warns (exit 0) about unknown keys: any output at all is a defect here.
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


def test_service_exposure_is_at_most_two(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze")
    service = _installed_copy(tmp_path)
    done = subprocess.run(
        [analyze, "security", "--offline=true", "--threshold=20", "--no-pager", str(service)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(r"Overall exposure level for codelegate\.service: (\d+\.\d+)", done.stdout)
    assert match, done.stdout
    assert float(match.group(1)) <= MAX_EXPOSURE, done.stdout


def test_service_essentials() -> None:
    unit = _directives(SERVICE)
    assert unit["Type"] == ["notify"]
    assert unit["User"] == ["codelegate"]
    assert unit["DynamicUser"] == ["no"]
    assert unit["KillMode"] == ["control-group"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["Delegate"] == ["yes"]
    assert unit["RuntimeDirectory"] == ["codelegate"]
    assert unit["StateDirectory"] == ["codelegate"]
    assert "/etc/codelegate/config.toml" in unit["ExecStart"][0]
    # What the CLI needs to work at all.
    assert unit["MemoryDenyWriteExecute"] == ["no"]
    families = set(" ".join(unit["RestrictAddressFamilies"]).split())
    assert families == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    assert "PrivateNetwork" not in unit
    assert unit["ProtectSystem"] == ["strict"]
    assert unit["NoNewPrivileges"] == ["yes"]
    # Secrets come from a root-only file, never from the unit text.
    assert unit["EnvironmentFile"] == ["-/etc/codelegate/env"]
    assert not any("API_KEY" in value or "TOKEN" in value for value in unit.get("Environment", []))


def test_socket_unit() -> None:
    unit = _directives(SOCKET)
    assert unit["ListenStream"] == ["/run/codelegate/codelegate.sock"]
    assert unit["SocketMode"] == ["0660"]
    assert unit["SocketGroup"] == ["codelegate"]


def test_example_config_matches_the_unit() -> None:
    config = parse_config((SYSTEMD / "config.toml.example").read_bytes(), "config.toml.example")
    unit = _directives(SERVICE)
    assert config.server.socket == _directives(SOCKET)["ListenStream"][0]
    writable = set(" ".join(unit["ReadWritePaths"]).split())
    # The daemon may write only in the workspace roots (plus its own state/runtime dirs).
    assert set(config.policy.workspaces) <= writable
    assert config.store.path.startswith("/var/lib/codelegate/")
    assert "auto" not in config.policy.allowed_modes


def test_the_example_config_names_no_cli_version_of_its_own() -> None:
    # It named 2.1.332 in a comment: daemon/pinned.py is the one place of the pin (README
    # "Upgrading"), and a copy there would go stale at the next bump.
    text = (SYSTEMD / "config.toml.example").read_text()
    assert CLAUDE_CODE_VERSION not in text
    assert re.findall(r"\b\d+\.\d+\.\d+\b", text) == []
    assert "daemon/pinned.py" in text


def test_sysusers_and_tmpfiles(tmp_path: Path) -> None:
    sysusers = _tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    subprocess.run(
        [sysusers, f"--root={tmp_path}", str(SYSTEMD / "codelegate.sysusers")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    passwd = (tmp_path / "etc" / "passwd").read_text()
    assert re.search(r"^codelegate:x:\d+:\d+:[^:]*:/var/lib/codelegate:", passwd, re.M)
    assert re.search(r"^codelegate:x:\d+:", (tmp_path / "etc" / "group").read_text(), re.M)
    if os.geteuid() != 0:
        return  # tmpfiles chowns; only root can apply it
    tmpfiles = _tool("systemd-tmpfiles")
    subprocess.run(
        [tmpfiles, "--create", f"--root={tmp_path}", str(SYSTEMD / "codelegate.tmpfiles")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    workspaces = tmp_path / "srv" / "codelegate" / "workspaces"
    assert oct(workspaces.stat().st_mode & 0o7777) == "0o2770"
    env = tmp_path / "etc" / "codelegate" / "env"
    assert oct(env.stat().st_mode & 0o777) == "0o600"
    assert env.stat().st_uid == 0


def test_the_units_documentation_is_a_file_the_readme_installs() -> None:
    [doc] = _directives(SERVICE)["Documentation"]
    target = doc.removeprefix("file://")
    readme = (SYSTEMD.parent / "README.md").read_text()
    assert f"install -m 0644 README.md {target}" in readme
    assert f"ExecStart={target.rsplit('/', 1)[0]}/venv/bin/codelegate" in SERVICE.read_text()


def test_a_refused_config_is_not_restarted_in_a_loop(tmp_path: Path) -> None:
    # serve's exit for a config it refuses is the one status the unit does not restart on.
    from codelegate.daemon.cli import main

    config = tmp_path / "config.toml"
    config.write_text("[server]\nsockett = 'typo'\n")
    assert _directives(SERVICE)["RestartPreventExitStatus"] == [
        str(main(["serve", "--config", str(config)]))
    ]
