"""The compiled build writes what the source writes, and screens texts as the source does.

Runs in `make test`'s compiled pass (this process imports the mypyc build, setup.py); the source is
run beside it in a process of its own. Every golden transcript goes through both, with and without
known values to mask, and the frame bytes must be the same. The build's credential screen in C
(translator/_screen.c) must answer what the source's chain of tests answers (shapes.screen_chain).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from codelegate.translator import compiled
from codelegate.translator.shapes import screen_chain
from tests.translator.test_screen import LITERALS, TEXTS

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = sorted((ROOT / "tests" / "golden").glob("*/*.jsonl"))

PASS = "CODELEGATE_TEST_COMPILED"  # set by make test's compiled pass (tests/conftest.py)
pytestmark = pytest.mark.skipif(not os.environ.get(PASS), reason="make test's compiled pass")

# Each side runs in a process of its own, with its build's folder as the current one, which
# ``-c`` puts first on the path: the checkout imports the source, the compiled build's folder that
# build. Each says which it imported, and writes each transcript's frames in turn.
_SIDE = """
import sys
from codelegate.translator import Redactor, RunContext, compiled, translate_chunks
assert compiled() == (sys.argv[1] == "compiled"), "this side imported the other build"
known = sys.argv[2].split(",")
out = sys.stdout.buffer
for path in sys.argv[3:]:
    for redactor in (None, Redactor(known)):
        ctx = RunContext(run_id="same", cwd="/srv/workspaces/demo", started_at=0.0)
        data = open(path, "rb").read()
        chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
        frames = b"".join(translate_chunks(chunks, ctx, redactor=redactor))
        out.write(b"%d\\n" % len(frames) + frames)
"""


def _frames(build: str, folder: Path, known: list[str]) -> bytes:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", PASS)}
    return subprocess.run(
        [sys.executable, "-c", _SIDE, build, ",".join(known), *map(str, TRANSCRIPTS)],
        cwd=folder,
        env=env,
        check=True,
        capture_output=True,
    ).stdout


def test_this_pass_runs_the_compiled_translator() -> None:
    assert compiled()


def test_the_compiled_translator_writes_the_sources_bytes_for_every_golden_transcript() -> None:
    known = ["sk-ant-api03-" + secrets.token_hex(40), secrets.token_urlsafe(32)]
    source = _frames("source", ROOT, known)
    assert len(TRANSCRIPTS) >= 20
    assert source.count(b"run_result") >= 2 * len(TRANSCRIPTS)
    assert _frames("compiled", Path(os.environ[PASS]), known) == source


def test_the_compiled_build_screens_texts_in_c() -> None:
    from codelegate.translator import _screen, redact, shapes

    assert shapes.may_hold_a_secret is _screen.screen
    assert redact.PLAIN.screen is _screen.screen


@settings(max_examples=3000)
@given(TEXTS)
def test_the_c_screen_answers_what_the_chain_answers(text: str) -> None:
    from codelegate.translator._screen import screen

    assert screen(text.lower()) == screen_chain(text.lower())
    assert screen(text) == screen_chain(text)


# A character that makes a str of each width: latin-1 (one byte), the BMP (two), past it (four).
WIDTHS = ("é", "…", "\U0001d11e")
GATES = ("", "=", ":", "-", "_", ".", "@ ://", "_ = - . @ ://")


@pytest.mark.parametrize("wide", ["", *WIDTHS])
def test_the_c_screen_reads_every_literal_at_either_end_of_a_str_of_any_width(wide: str) -> None:
    from codelegate.translator._screen import screen

    for literal in (*LITERALS, "tokens", 'auth"', "auth'", "auth\\", "\u0131", "\u017f", "\u0307"):
        for gate in GATES:
            for text in (
                literal + gate + wide,
                wide + gate + literal,
                literal[:-1] + wide + gate,  # cut short by a wider character
                literal,
                literal[:-1],
            ):
                assert screen(text) == screen_chain(text), text


def test_the_c_screen_takes_only_a_str() -> None:
    from codelegate.translator._screen import screen

    with pytest.raises(TypeError, match="takes a str, not bytes"):
        screen(b"token=x")  # type: ignore[arg-type]


def test_the_install_says_its_translator_is_compiled() -> None:
    from codelegate.daemon.pinned import translator_build

    assert translator_build() == "compiled (mypyc)"
