"""Sans-IO translation of Claude Code's stream-json output into Agent IO frames.

Pure: no asyncio, no I/O, no clock reads (time comes in as an argument). See DESIGN.md.
"""

from translator.core import Card, Translator
from translator.frames import FinalResult, Frame, decode_frame, encode_frame, frame_id
from translator.lines import LineSplitter
from translator.outcome import Limits, Outcome, RunContext
from translator.redact import Redactor, clean_text, redact_text, redact_value
from translator.transcript import translate_chunks, translate_transcript

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
    "decode_frame",
    "encode_frame",
    "frame_id",
    "redact_text",
    "redact_value",
    "translate_chunks",
    "translate_transcript",
]
