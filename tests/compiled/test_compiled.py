"""The compiled build writes what the source writes.

Runs in `make test`'s compiled pass (this process imports the mypyc build, setup.py); the source is
run beside it in a process of its own. Every golden transcript goes through both, with and without
known values to mask, and the frame bytes must be the same.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from codelegate.translator import Redactor, RunContext, compiled, translate_chunks

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = sorted((ROOT / "tests" / "golden").glob("*/*.jsonl"))

PASS = "CODELEGATE_TEST_COMPILED"  # set by make test's compiled pass (tests/conftest.py)
pytestmark = pytest.mark.skipif(not os.environ.get(PASS), reason="make test's compiled pass")

# The source's side: the checkout's own folder comes first on the path (-c), so it imports the
# source whatever else is installed; it says so, and writes each transcript's frames in turn.
_SOURCE_SIDE = """
import sys
from codelegate.translator import Redactor, RunContext, compiled, translate_chunks
assert not compiled(), "the source's side imported the compiled build"
known = sys.argv[1].split(",")
out = sys.stdout.buffer
for path in sys.argv[2:]:
    for redactor in (None, Redactor(known)):
        ctx = RunContext(run_id="same", cwd="/srv/workspaces/demo", started_at=0.0)
        data = open(path, "rb").read()
        chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
        frames = b"".join(translate_chunks(chunks, ctx, redactor=redactor))
        out.write(b"%d\\n" % len(frames) + frames)
"""


def _compiled_side(known: list[str]) -> bytes:
    out = []
    for path in TRANSCRIPTS:
        for redactor in (None, Redactor(known)):
            ctx = RunContext(run_id="same", cwd="/srv/workspaces/demo", started_at=0.0)
            data = path.read_bytes()
            chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
            frames = b"".join(translate_chunks(chunks, ctx, redactor=redactor))
            out.append(b"%d\n" % len(frames) + frames)
    return b"".join(out)


def test_this_pass_runs_the_compiled_translator() -> None:
    assert compiled()


def test_the_compiled_translator_writes_the_sources_bytes_for_every_golden_transcript() -> None:
    known = ["sk-ant-api03-" + secrets.token_hex(40), secrets.token_urlsafe(32)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", PASS)}
    source = subprocess.run(
        [sys.executable, "-c", _SOURCE_SIDE, ",".join(known), *map(str, TRANSCRIPTS)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    ).stdout
    assert len(TRANSCRIPTS) >= 20
    assert source == _compiled_side(known)


def test_the_install_says_its_translator_is_compiled() -> None:
    from codelegate.daemon.pinned import translator_build

    assert translator_build() == "compiled (mypyc)"
