"""translator/ stays pure: no I/O, no asyncio, no clocks, no environment (DESIGN "Packages")."""

from __future__ import annotations

import ast
from pathlib import Path

from codelegate import translator
from codelegate.translator.frames import decode_frame, encode_frame

BANNED_MODULES = {
    "asyncio",
    "aiohttp",
    "subprocess",
    "socket",
    "sqlite3",
    "structlog",
    "os",
    "time",
    "logging",
    "threading",
}


def test_no_impure_imports() -> None:
    for path in Path(translator.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]]
            else:
                continue
            assert not BANNED_MODULES & set(names), f"{path.name} imports {names}"


def test_frames_round_trip() -> None:
    from tests.translator.helpers import assistant, run, tool_use

    for frame in run([assistant(tool_use("t1", "Read"))]):
        assert decode_frame(encode_frame(frame)) == frame
