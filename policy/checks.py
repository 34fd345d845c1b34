"""Checks of a config against the machine, for ``codelegate doctor`` and ``serve`` start-up.

Pure like the rest of policy: the filesystem comes in as callables, so the daemon passes
``os.path.isdir`` and an executable test, and the tests pass dictionaries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

import msgspec

from codelegate.policy.child_env import WHERE_VARS, cli_login_file, credential_variables
from codelegate.policy.config import Config
from codelegate.policy.environment import AUTH_VARS
from codelegate.policy.workspace import closed_folder, no_entry

# Shorter bearer tokens are guessable; `serve` refuses them and `doctor` says so first.
MIN_TOKEN_BYTES: Final = 16
# sun_path holds 108 bytes on Linux, its terminating NUL included: a longer path fails only at
# bind, as "AF_UNIX path too long", so serve and doctor name it first.
UNIX_PATH_MAX: Final = 107


def socket_path_problem(path: str) -> str | None:
    """Why the absolute ``[server] socket`` path cannot be a Unix socket's; None when it can."""
    size = len(path.encode("utf-8", "surrogateescape"))
    if size <= UNIX_PATH_MAX:
        return None
    return (
        f"{path} is {size} bytes long, over the {UNIX_PATH_MAX} a Unix socket path may have; "
        "choose a shorter [server] socket"
    )


def token_problem(token: bytes, mode: int) -> str | None:
    """Why the TCP bearer token (its file's bytes, whitespace around dropped; ``mode``: the
    file's ``st_mode``) is refused."""
    if mode & 0o007:
        # Whoever reads it may call the whole API over TCP, as the daemon's callers do.
        return (
            f"server.token_file is open to every user of the machine (mode {mode & 0o777:04o}); "
            "chmod o-rwx it"
        )
    if len(token.strip()) < MIN_TOKEN_BYTES:
        return f"server.token_file must hold a token of at least {MIN_TOKEN_BYTES} bytes"
    return None


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with a loaded config on this machine: the dotted key and what is wrong."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def root_problems(
    config: Config, *, isdir: Callable[[str], bool], can_enter: Callable[[str], bool], uid: int
) -> list[Problem]:
    """The workspace roots no run could start in, for this ``uid`` (the daemon's): missing, or
    closed to it (``can_enter``, as a run's cwd is checked)."""
    problems: list[Problem] = []
    for index, root in enumerate(config.policy.workspaces):
        key = f"policy.workspaces[{index}]"
        closed = closed_folder(root, isdir=isdir, can_enter=can_enter)
        if closed is not None:
            message = (
                f"{no_entry(closed, f'uid {uid}')}, so no run can start in {root}; give uid "
                f"{uid} search permission there (chmod, or a group it is in) or serve as a user "
                "that has it"
            )
            problems.append(Problem(key=key, message=message))
        elif not isdir(root):
            problems.append(Problem(key=key, message=f"{root} is not an existing directory"))
    return problems


def check_environment(
    config: Config,
    *,
    isdir: Callable[[str], bool],
    is_executable: Callable[[str], bool],
    can_enter: Callable[[str], bool],
    uid: int,
    isfile: Callable[[str], bool] | None = None,
) -> list[Problem]:
    """What stops this config from working here; empty when nothing does.

    ``is_executable`` receives ``[claude] path`` as written: for a bare name such as ``claude``
    the caller looks it up on PATH. ``can_enter`` and ``uid``: :func:`root_problems`. ``isfile``,
    when given, checks ``[server] token_file``.
    """
    problems = root_problems(config, isdir=isdir, can_enter=can_enter, uid=uid)
    if not is_executable(config.claude.path):
        problems.append(
            Problem(
                key="claude.path",
                message=f"{config.claude.path} is not an executable Claude Code CLI",
            )
        )
    sandbox = config.claude.settings.get("sandbox")
    if isinstance(sandbox, dict) and sandbox.get("enabled") is True:
        missing = [name for name in ("bwrap", "socat") if not is_executable(name)]
        if missing:
            # Measured on 2.1.332: without them the CLI runs every command unsandboxed, or,
            # with failIfUnavailable, fails every run.
            problems.append(
                Problem(
                    key="claude.settings.sandbox",
                    message=f"the CLI's sandbox needs {' and '.join(missing)} on PATH "
                    "(apt install bubblewrap socat)",
                )
            )
    token_file = config.server.token_file
    if isfile is not None and token_file is not None and not isfile(token_file):
        problems.append(
            Problem(key="server.token_file", message=f"{token_file} is not an existing file")
        )
    return problems


def credentials_warning(
    config: Config, parent_env: Mapping[str, str], *, home: str, isfile: Callable[[str], bool]
) -> str | None:
    """Why runs may fail to authenticate: no credential variable in ``parent_env`` (the
    daemon's environment) and no login of the CLI's own (``isfile`` on its file). A warning,
    not a problem: the CLI may be logged in where this cannot see, its keychain say."""
    if credential_variables(config, parent_env):
        return None
    login = cli_login_file(config, parent_env, home=home)
    if isfile(login):
        return None
    names = ", ".join(sorted(AUTH_VARS - WHERE_VARS))
    return (
        f"no credentials: none of {names} is set here and the CLI has no login of its own in "
        f"{login}, so runs will fail to authenticate; export ANTHROPIC_API_KEY (or another) "
        "where serve starts (under systemd: /etc/codelegate/env), or log the CLI in as the "
        "daemon's user (run claude, then /login)"
    )
