"""policy/ and translator/ stay pure: no I/O libraries, no environment reads, no clock reads.

Walks the AST of every module, so that a forbidden import hidden in a function body, an alias
(``import os as o; o.environ``) or a ``from os import environ`` is caught as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = ("policy", "translator")
BANNED_MODULES = frozenset(
    {"asyncio", "aiohttp", "subprocess", "socket", "sqlite3", "structlog", "uvloop"}
)
BANNED_ATTRIBUTES = {
    "os": frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}),
    "time": frozenset(
        {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}
    ),
}


def pure_modules() -> list[Path]:
    return sorted(path for package in PURE_PACKAGES for path in (ROOT / package).rglob("*.py"))


def violations(source: str) -> list[str]:
    """Every impure use in ``source``, as ``line: what``."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> "os" / "time"
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                top = name.name.split(".")[0]
                if top in BANNED_MODULES:
                    found.append(f"{node.lineno}: import {name.name}")
                # "import os.path" binds "os" too; "import os.path as p" binds only os.path.
                if top in BANNED_ATTRIBUTES and (name.asname is None or "." not in name.name):
                    aliases[name.asname or top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in BANNED_MODULES:
                found.append(f"{node.lineno}: from {node.module} import …")
            banned = BANNED_ATTRIBUTES.get(node.module, frozenset())
            found += [
                f"{node.lineno}: from {node.module} import {n.name}"
                for n in node.names
                if n.name in banned or n.name == "*"
            ]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr in BANNED_ATTRIBUTES[aliases[node.value.id]]
        ):
            found.append(f"{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return found


def test_there_are_modules_to_check() -> None:
    names = {path.name for path in pure_modules()}
    assert {"config.py", "launch.py", "frames.py"} <= names


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_pure(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import asyncio", ["1: import asyncio"]),
        ("import asyncio.subprocess as sp", ["1: import asyncio.subprocess"]),
        ("def f():\n    import subprocess", ["2: import subprocess"]),
        ("from aiohttp import web", ["1: from aiohttp import …"]),
        ("from sqlite3 import connect", ["1: from sqlite3 import …"]),
        ("import socket, structlog", ["1: import socket", "1: import structlog"]),
        ("import uvloop", ["1: import uvloop"]),
        ("import os\nos.environ['X']", ["2: os.environ"]),
        ("import os as o\nx = o.getenv('X')", ["2: os.getenv"]),
        ("from os import environ", ["1: from os import environ"]),
        ("from os import *", ["1: from os import *"]),
        ("import time\nt = time.monotonic()", ["2: time.monotonic"]),
        ("from time import time", ["1: from time import time"]),
        ("import os.path\nos.path.join('a')", []),
        ("import os.path\nos.environ", ["2: os.environ"]),
        ("import os.path as p\np.environ", []),
        ("import os\nos.path.realpath('a')", []),
        ("from . import x\nfrom policy import config", []),
        ("environ = {}\nenviron.get('X')", []),
    ],
)
def test_the_checker_itself(source: str, expected: list[str]) -> None:
    assert violations(source) == expected
