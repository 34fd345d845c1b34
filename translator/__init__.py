"""Sans-IO translation of Claude Code's stream-json output into Agent IO frames.

Pure: no asyncio, no I/O, no clock reads (time comes in as an argument). See DESIGN.md.
"""
