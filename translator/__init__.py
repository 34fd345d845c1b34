"""Sans-IO translation of Claude Code's stream-json output into Agent IO frames.

Pure: no asyncio, no I/O, no clock reads (time comes in as an argument). See DESIGN.md. The same
source also ships compiled by mypyc (setup.py): :func:`compiled` tells which one this is.
"""

from codelegate.translator import core
from codelegate.translator.core import Translator
from codelegate.translator.frames import FinalResult, Frame, decode_frame, encode_frame, frame_id
from codelegate.translator.inputs import Limits, Outcome, RunContext
from codelegate.translator.lines import LineSplitter
from codelegate.translator.records import Card
from codelegate.translator.redact import Redactor, clean_text, redact_value
from codelegate.translator.shapes import redact_text
from codelegate.translator.transcript import translate_chunks, translate_transcript

__all__ = [
    "Card",
    "FinalResult",
    "Frame",
    "Limits",
    "LineSplitter",
    "Outcome",
    "Redactor",
    "RunContext",
    "Translator",
    "clean_text",
    "compiled",
    "decode_frame",
    "encode_frame",
    "frame_id",
    "redact_text",
    "redact_value",
    "translate_chunks",
    "translate_transcript",
]


def compiled() -> bool:
    """Whether this translator is the compiled build (its core a native module), not the source."""
    return not core.__file__.endswith(".py")
