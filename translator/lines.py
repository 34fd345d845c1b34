"""Splitting a byte stream into lines, with a bound on the length of a line.

A line longer than the bound must not stop a run (real CLI lines over 5 MB have been reported):
it is skipped up to the next newline and counted, so that the caller can report it.
"""

from __future__ import annotations


class LineSplitter:
    """Sans-IO line splitter: ``feed(data)`` returns the complete lines; ``feed(b"")`` is EOF.

    Lines are returned without their ``\\n`` (and without a trailing ``\\r``); blank lines are
    dropped. ``oversized`` counts the lines skipped because they were longer than ``max_line``.
    """

    __slots__ = ("_buf", "_skipping", "max_line", "oversized")

    def __init__(self, max_line: int) -> None:
        if max_line < 1:
            raise ValueError("max_line must be positive")
        self.max_line = max_line
        self.oversized = 0
        self._buf = b""
        # True while discarding the rest of an oversized line up to its newline.
        self._skipping = False

    def feed(self, data: bytes) -> list[bytes]:
        """Complete lines found in ``data`` (plus what was buffered); ``b""`` flushes at EOF."""
        if not data:
            return self._eof()
        if self._skipping:
            nl = data.find(b"\n")
            if nl < 0:
                return []
            self._skipping = False
            data = data[nl + 1 :]
        buf = self._buf + data if self._buf else data
        last = buf.rfind(b"\n")
        if last < 0:
            self._keep(buf)
            return []
        self._keep(buf[last + 1 :])
        return self._complete(buf[:last].split(b"\n"))

    def feed_blocks(self, data: bytes) -> list[bytes | memoryview] | None:
        """The complete lines in ``data`` (plus what was buffered) as blocks of bytes.

        The fast path of :meth:`feed`: it applies only when no line can be over the bound (each
        block is within it); otherwise it returns None and consumes nothing. The buffered start
        of a line comes back joined to its end as a block of its own, so that the bulk of
        ``data`` is never copied (a view of it is returned).
        """
        if not data or self._skipping:
            return None
        last = data.rfind(b"\n")
        if last < 0 or last > self.max_line:
            return None
        blocks: list[bytes | memoryview] = []
        start = 0
        if self._buf:
            first = data.find(b"\n")
            if len(self._buf) + first > self.max_line:
                return None
            blocks.append(self._buf + data[:first])
            start = first + 1
        if start < last:
            blocks.append(memoryview(data)[start:last])
        self._keep(data[last + 1 :])
        return blocks

    def complete_lines(self, block: bytes | memoryview) -> list[bytes]:
        """The non-blank lines of a block from :meth:`feed_blocks`, without line ends."""
        return self._complete(bytes(block).split(b"\n"))

    def _keep(self, rest: bytes) -> None:
        # An unterminated tail already over the bound can be dropped now: no need to buffer
        # megabytes only to discard them when the newline finally comes.
        # (One byte of slack: a trailing "\r" is not part of the line.)
        if len(rest) > self.max_line + 1:
            self.oversized += 1
            self._skipping = True
            self._buf = b""
        else:
            self._buf = rest

    def _complete(self, lines: list[bytes]) -> list[bytes]:
        limit = self.max_line
        out: list[bytes] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                continue
            if len(line) > limit:
                self.oversized += 1
                continue
            out.append(line)
        return out

    def _eof(self) -> list[bytes]:
        self._skipping = False
        rest, self._buf = self._buf, b""
        return self._complete([rest])
