"""How fast the translator is, against a floor and a peer (bench/RESULTS.md §1).

Corpus: the real CLI transcripts of the golden tests, repeated until there are at least 100,000
lines, every tool_use id made unique so that each card is real work. The transcripts are captured
as the daemon runs the CLI: ``stream_event`` lines are most of their lines, as they are of every
run. Each also opens with the CLI's answer to ``initialize`` (a ``control_response`` of about
17 KB: its commands, agents and models), once a run: in these short runs those lines are two
fifths of the corpus's bytes, which the floor decodes whole and the translator skips, so a
second corpus is made of the same transcripts without them. A long run has one such line among
thousands: the second ratio is the one that says what a run's lines cost.

Each contender runs in its own process over the corpus file and over an empty file; its time is
the difference of the child's CPU time (net of interpreter start-up and imports), the best of a
few interleaved rounds:
- ``floor``: ``msgspec.json.decode`` of every line (no translation at all);
- ``peer``: the Claude Agent SDK's ``parse_message`` over ``json.loads`` of every line;
- ``ours``: what ``codelegate translate FILE`` does (frames for the whole corpus, encoded,
  written) in the build that ships, the translator compiled by mypyc (``make compiled``, setup.py);
- ``pure``: the same, from the source as it is, not compiled (a development install);
- ``known``: ``ours`` with the redactor of a run that knows three credentials (as the daemon's
  runs do): what masking known values in every encoding costs on top;
- ``before`` (with ``--against REV``): ``pure`` as the translator of commit ``REV`` is, from a
  ``git archive`` of it, so that a change is measured against its base in the same run.

Run with ``.venv/bin/python -m bench translator`` (``--lines N``, ``--rounds N``, ``--against
REV``).
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPTS = (
    ROOT / "tests" / "golden" / "transcripts",
    ROOT / "tests" / "golden" / "reference",
)
# The compiled build, as `make compiled` installs it (the Makefile's COMPILED).
COMPILED = ROOT / ".venv" / "compiled" / "site"
REQUIRED_VS_PEER = 2.0
_ANSWER = b'{"type":"control_response"'

_WORKERS = {
    "floor": """
import msgspec, sys
decode = msgspec.json.decode
with open(sys.argv[1], "rb") as f:
    for line in f:
        if line.strip():
            decode(line)
""",
    "peer": """
import json, sys
from claude_agent_sdk._internal.message_parser import parse_message
with open(sys.argv[1], "rb") as f:
    for line in f:
        if line.strip():
            try:
                parse_message(json.loads(line))
            except Exception:
                pass
""",
    "ours": """
import sys
from codelegate.translator import RunContext
from codelegate.translator.transcript import translate_chunks
ctx = RunContext(run_id="bench", cwd="/srv/workspaces/demo", started_at=0.0)
out = sys.stdout.buffer
with open(sys.argv[1], "rb") as f:
    for block in translate_chunks(iter(lambda: f.read(1 << 20), b""), ctx):
        out.write(block)
""",
    "known": """
import secrets, sys
from codelegate.translator import Redactor, RunContext
from codelegate.translator.transcript import translate_chunks
ctx = RunContext(run_id="bench", cwd="/srv/workspaces/demo", started_at=0.0)
known = ["sk-ant-api03-" + secrets.token_hex(40), secrets.token_urlsafe(32), secrets.token_hex(20)]
out = sys.stdout.buffer
with open(sys.argv[1], "rb") as f:
    chunks = iter(lambda: f.read(1 << 20), b"")
    for block in translate_chunks(chunks, ctx, redactor=Redactor(known)):
        out.write(block)
""",
}


def build_corpus(min_lines: int, *, answers: bool = True) -> bytes:
    """Real transcripts repeated to ``min_lines`` lines, tool ids unique per copy (``answers``
    False: without the CLI's answers to our control requests)."""
    texts = [path.read_bytes() for folder in TRANSCRIPTS for path in sorted(folder.glob("*.jsonl"))]
    if not answers:
        texts = [
            b"".join(
                line for line in text.splitlines(keepends=True) if not line.startswith(_ANSWER)
            )
            for text in texts
        ]
    if not texts:
        raise SystemExit("no transcripts found")
    ids = [
        sorted(set(re.findall(rb"toolu_[A-Za-z0-9]+", text)), key=len, reverse=True)
        for text in texts
    ]
    parts: list[bytes] = []
    lines = copy = 0
    while lines < min_lines:
        for n, (text, tool_ids) in enumerate(zip(texts, ids, strict=True)):
            for tool_id in tool_ids:
                text = text.replace(tool_id, tool_id + b"_c%dt%d" % (copy, n))
            if not text.endswith(b"\n"):
                text += b"\n"
            parts.append(text)
            lines += text.count(b"\n")
        copy += 1
    return b"".join(parts)


def _run(worker: str, path: Path, trees: dict[str, Path]) -> float:
    # A contender runs with its tree as the current folder, which ``-c`` puts first on the path:
    # the checkout imports the source, the compiled build's folder that build.
    # CPU time (user + system) of the child, not wall time: on a shared machine the load of
    # other processes moves wall time far more than it moves the work done.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The script's folder comes first on sys.path: a worker run in another tree imports its
    # codelegate (the editable install's finder comes after the path).
    subprocess.run(
        [sys.executable, "-c", _WORKERS.get(worker, _WORKERS["ours"]), str(path)],
        check=True,
        cwd=trees.get(worker, ROOT),
        stdout=subprocess.DEVNULL,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(
    corpus: Path,
    empty: Path,
    rounds: int,
    names: tuple[str, ...] = tuple(_WORKERS),
    trees: dict[str, Path] | None = None,
) -> dict[str, float]:
    """Best net time per contender, rounds interleaved so that load affects all alike
    (``trees``: the source tree a contender runs in, when not this one).

    The best run over the corpus less the best start-up, each the least that load left of it:
    the best of the differences would take the round whose start-up the load slowed most, and
    count that slowness off the work."""
    trees = trees or {}
    work = {name: float("inf") for name in names}
    start = dict(work)
    for _ in range(rounds):
        for name in names:
            work[name] = min(work[name], _run(name, corpus, trees))
            start[name] = min(start[name], _run(name, empty, trees))
    return {name: work[name] - start[name] for name in names}


def _imported(tree: Path) -> tuple[Path, bool]:
    """Where a worker run in ``tree`` imports the translator from, and whether it is compiled."""
    probe = "import codelegate.translator as t; print(t.compiled(), t.__file__)"
    said = subprocess.run(
        [sys.executable, "-c", probe], check=True, cwd=tree, capture_output=True, text=True
    ).stdout.split(maxsplit=1)
    return Path(said[1].strip()), said[0] == "True"


def compiled_build() -> Path:
    """The compiled build's folder, checked to import as compiled (else exit: make compiled)."""
    if (COMPILED / "codelegate").is_dir():
        where, compiled = _imported(COMPILED)
        if compiled and where.resolve().is_relative_to(COMPILED.resolve()):
            return COMPILED
    raise SystemExit(f"no compiled translator in {COMPILED}: run `make compiled` first")


def checkout(rev: str, into: Path) -> Path:
    """The package of commit ``rev`` (``git archive``), unpacked in ``into``."""
    archive = subprocess.run(
        ["git", "archive", rev, "codelegate", "daemon", "policy", "translator"],
        check=True,
        cwd=ROOT,
        capture_output=True,
    ).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    probe = "import codelegate.translator as t; print(t.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", probe], check=True, cwd=into, capture_output=True, text=True
    ).stdout
    if not Path(where.strip()).resolve().is_relative_to(into.resolve()):
        raise SystemExit(f"the tree of {rev} is not the one imported ({where.strip()})")
    return into


def main(argv: list[str] | None = None) -> int:
    """Print the times and ratios; exit 1 when ours misses a bar: at least 2x faster than the
    peer, and no slower than the floor without the answers to initialize (issue 12)."""
    parser = argparse.ArgumentParser(prog="python -m bench translator")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", metavar="REV", help="also time the translator of REV")
    # The runner passes every option to every benchmark: ignore the others' options.
    args, _ = parser.parse_known_args(argv if argv is not None else [])
    trees: dict[str, Path] = {"ours": compiled_build(), "known": COMPILED, "pure": ROOT}
    corpus = build_corpus(args.lines)
    lean = build_corpus(args.lines, answers=False)
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = Path(tmp) / "corpus.jsonl"
        corpus_path.write_bytes(corpus)
        lean_path = Path(tmp) / "lean.jsonl"
        lean_path.write_bytes(lean)
        empty_path = Path(tmp) / "empty.jsonl"
        empty_path.write_bytes(b"")
        names: tuple[str, ...] = ("floor", "peer", "ours", "pure", "known")
        lean_names: tuple[str, ...] = ("floor", "ours", "pure")
        if args.against:
            trees["before"] = checkout(args.against, Path(tmp) / "before")
            names += ("before",)
            lean_names += ("before",)
        best = measure(corpus_path, empty_path, args.rounds, names, trees)
        best_lean = measure(lean_path, empty_path, args.rounds, lean_names, trees)
    lines = corpus.count(b"\n")
    size = len(corpus) / 1e6
    print(f"corpus: {lines} lines, {size:.1f} MB; best of {args.rounds} rounds, net of start-up")
    print("(ours: the compiled build that ships; pure: the same source, not compiled)")
    for name, seconds in best.items():
        print(f"  {name:6} {seconds:7.3f} s  {lines / seconds / 1000:8.1f} k lines/s")
    lean_lines = lean.count(b"\n")
    print(f"without the answers to initialize: {lean_lines} lines, {len(lean) / 1e6:.1f} MB")
    for name, seconds in best_lean.items():
        print(f"  {name:6} {seconds:7.3f} s  {lean_lines / seconds / 1000:8.1f} k lines/s")
    for name in lean_names[1:]:
        print(f"  {name} / floor = {best[name] / best['floor']:.2f}x as captured, ", end="")
        print(f"{best_lean[name] / best_lean['floor']:.2f}x without the answers")
    vs_floor = best_lean["ours"] / best_lean["floor"]
    vs_peer = best["peer"] / best["ours"]
    print(f"  pure / ours  = {best['pure'] / best['ours']:.2f}x (what compiling gains)")
    print(f"  peer / floor = {best['peer'] / best['floor']:.2f}x")
    print(f"  known / ours = {best['known'] / best['ours']:.2f}x")
    if args.against:
        print(f"  before / pure = {best['before'] / best['pure']:.2f}x ({args.against})")
    print(f"  peer / ours  = {vs_peer:.2f}x (required: at least {REQUIRED_VS_PEER}x)")
    print(f"  ours / floor = {vs_floor:.2f}x without the answers (required: at most 1.0x)")
    return 0 if vs_peer >= REQUIRED_VS_PEER and vs_floor <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
