"""translate_transcript(): what `codelegate translate` prints."""

from __future__ import annotations

import msgspec

from codelegate.translator import Outcome, translate_transcript
from codelegate.translator.transcript import translate_chunks
from tests.translator.helpers import assistant, context, result_line, tool_result, tool_use


def test_transcript_to_ndjson_frames() -> None:
    data = assistant(tool_use("t1", "Read")) + tool_result("t1") + result_line()
    out = b"".join(translate_transcript(data, context(parent_tool_call_id=None)))
    frames = [msgspec.json.decode(line) for line in out.splitlines()]
    assert [f["type"] for f in frames] == ["tool_call", "tool_result", "run_result"]
    assert out.endswith(b"\n")
    assert {f["ts"] for f in frames} == {1000.0}


def test_chunks_outcome_and_time() -> None:
    chunks = [b"", assistant(tool_use("t1", "Read"))]
    out = b"".join(
        translate_chunks(chunks, context(), outcome=Outcome(reason="cancelled"), now=5.0)
    )
    frames = [msgspec.json.decode(line) for line in out.splitlines()]
    assert frames[-1]["result"]["status"] == "cancelled"
    assert {f["ts"] for f in frames} == {5.0}
