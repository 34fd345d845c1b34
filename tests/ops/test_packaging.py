"""Installed, the project is one import name: ``codelegate``, and the tool needs nothing else.

The wheel is built offline from a copy of the checkout (the test extras carry the setuptools it
needs) and installed with ``--no-deps`` into a bare venv: what an agent's venv gets from ``pip
install``. setuptools builds in the source tree (``build/``, ``*.egg-info``), hence the copy.
The development venv holds python-daemon, whose top-level ``daemon`` must stay its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


# What the wheel is built from: the project's two build files, its readme, and the one import name
# with the three folders its symlinks point at (copied as links, so they point into the copy).
SOURCES = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "codelegate",
    "daemon",
    "translator",
    "policy",
)


class Built(NamedTuple):
    wheel: Path
    new_in_checkout: set[str]  # top-level names the build left in the checkout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    before = {p.name for p in ROOT.iterdir()}
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name,
                source / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        else:
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--quiet"]
    subprocess.run(
        [
            *pip,
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(out),
            str(source),
        ],
        check=True,
        cwd=source,
        capture_output=True,
    )
    [found] = out.glob("codelegate-*.whl")
    return Built(found, {p.name for p in ROOT.iterdir()} - before)


@pytest.fixture(scope="module")
def wheel(built: Built) -> Path:
    return built.wheel


def test_building_the_wheel_leaves_nothing_in_the_checkout(built: Built) -> None:
    assert built.new_in_checkout == set()


def _isolated(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # -I: no current directory, no PYTHONPATH, no user site: only what the venv installed.
    return subprocess.run(
        [str(python), "-I", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_the_wheel_holds_codelegate_and_nothing_else_at_top_level(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"codelegate", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "codelegate/daemon/clients/tool.py" in names
    assert "codelegate/translator/core.py" in names
    assert "codelegate/policy/launch.py" in names
    [top_level] = [n for n in names if n.endswith("top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["codelegate"]
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt")))
    assert "codelegate = codelegate.daemon.cli:main" in entry.decode()


def test_the_tool_works_in_a_venv_that_has_only_the_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "agent-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python)]
    subprocess.run(
        [*pip, "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")} <= {
        "codelegate",
        "__pycache__",
    }
    # No aiohttp, msgspec or rich here: the tool is standard library only. The socket is absent,
    # so the call answers with its envelope, not an ImportError.
    socket = tmp_path / "absent.sock"
    done = _isolated(
        python,
        "from codelegate import ClaudeCode\n"
        f"print(ClaudeCode(socket={str(socket)!r}).claude_code('hello'))",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["status"] == "failed"
    assert envelope["error_code"] == "daemon_unreachable"
    assert envelope["provider"] == "claude_code"


def test_python_daemon_beside_codelegate_keeps_its_daemon(tmp_path: Path) -> None:
    done = _isolated(
        Path(sys.executable),
        "import daemon, codelegate\n"
        "from codelegate import claude_code\n"
        "import codelegate.daemon.serving.app\n"
        "print(daemon.__file__)\n"
        "print(hasattr(daemon, 'DaemonContext'))\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    where, has_context = done.stdout.split()
    assert "site-packages" in where
    assert has_context == "True"


@pytest.mark.parametrize("asked", ["yes", "2", "true"])
def test_a_compile_setting_other_than_0_or_1_stops_the_build_and_says_so(asked: str) -> None:
    build = subprocess.run(
        [sys.executable, "setup.py", "--name"],
        cwd=ROOT,
        env={**os.environ, "CODELEGATE_COMPILE": asked},
        capture_output=True,
        text=True,
    )
    assert build.returncode != 0
    assert f"CODELEGATE_COMPILE must be 0 or 1, not {asked!r}" in build.stderr


def test_without_the_compile_setting_the_build_compiles_nothing(tmp_path: Path) -> None:
    # mypyc writes its C into build/ as soon as setup.py runs with the setting: here none comes.
    for name in SOURCES:
        (tmp_path / name).symlink_to(ROOT / name)
    build = subprocess.run(
        [sys.executable, "setup.py", "--name"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "CODELEGATE_COMPILE"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert build.stdout.strip() == "codelegate"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(SOURCES)
