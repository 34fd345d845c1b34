"""LineSplitter: any chunking gives the same lines; oversize lines are skipped and counted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codelegate.translator.lines import LineSplitter


def feed_all(splitter: LineSplitter, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        out += splitter.feed(chunk)
    return out + splitter.feed(b"")


def test_lines_whole_and_byte_by_byte() -> None:
    data = b'{"a":1}\n\n{"b":2}\r\n{"c":3}'
    expected = [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    assert feed_all(LineSplitter(100), [data]) == expected
    assert feed_all(LineSplitter(100), [data[i : i + 1] for i in range(len(data))]) == expected


def test_oversized_line_is_skipped_to_the_next_newline_and_counted() -> None:
    splitter = LineSplitter(8)
    chunks = [b"ok\n0123", b"456789", b"abc\nfine\n", b"x" * 20, b"\nlast"]
    assert feed_all(splitter, chunks) == [b"ok", b"fine", b"last"]
    assert splitter.oversized == 2


def test_oversized_complete_line_in_one_chunk() -> None:
    splitter = LineSplitter(4)
    assert feed_all(splitter, [b"12345\nabc\n"]) == [b"abc"]
    assert splitter.oversized == 1


def test_skipping_continues_across_chunks_without_newline() -> None:
    splitter = LineSplitter(4)
    assert splitter.feed(b"123456") == []
    assert splitter.feed(b"789") == []
    assert splitter.feed(b"0\nok\n") == [b"ok"]
    assert splitter.oversized == 1


def test_eof_while_skipping_resets() -> None:
    splitter = LineSplitter(4)
    assert feed_all(splitter, [b"123456"]) == []
    assert splitter.feed(b"ab\n") == [b"ab"]


def test_max_line_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LineSplitter(0)


@given(st.lists(st.binary(max_size=30), max_size=20), st.lists(st.integers(1, 9), max_size=30))
def test_any_chunking_gives_the_same_lines(parts: list[bytes], sizes: list[int]) -> None:
    data = b"\n".join(parts)
    whole = LineSplitter(12)
    expected = feed_all(whole, [data])
    chunks, pos = [], 0
    for size in sizes:
        chunks.append(data[pos : pos + size])
        pos += size
    chunks.append(data[pos:])
    split = LineSplitter(12)
    assert feed_all(split, [c for c in chunks if c]) == expected
    assert split.oversized == whole.oversized


def test_a_carriage_return_does_not_count_towards_the_bound() -> None:
    data = b"abcd\r\nxy\n"
    whole = feed_all(LineSplitter(4), [data])
    split = LineSplitter(4)
    assert feed_all(split, [data[:5], data[5:]]) == whole == [b"abcd", b"xy"]
    assert split.oversized == 0


def feed_fast(splitter: LineSplitter, chunks: list[bytes]) -> list[bytes]:
    """Like the translator: blocks when the fast path applies, lines otherwise."""
    out: list[bytes] = []
    for chunk in chunks:
        blocks = splitter.feed_blocks(chunk)
        if blocks is None:
            out += splitter.feed(chunk)
        else:
            for block in blocks:
                out += splitter.complete_lines(block)
    return out + splitter.feed(b"")


def test_blocks_fall_back_when_a_buffered_line_grows_past_the_bound() -> None:
    splitter = LineSplitter(10)
    assert splitter.feed(b"12345678") == []
    assert splitter.feed_blocks(b"9012\nab\n") is None
    assert splitter.feed(b"9012\nab\n") == [b"ab"]
    assert splitter.oversized == 1


@given(st.lists(st.binary(max_size=30), max_size=20), st.lists(st.integers(1, 40), max_size=30))
def test_blocks_give_the_same_lines_as_feed(parts: list[bytes], sizes: list[int]) -> None:
    data = b"\n".join(parts)
    chunks, pos = [], 0
    for size in sizes:
        chunks.append(data[pos : pos + size])
        pos += size
    chunks.append(data[pos:])
    chunks = [c for c in chunks if c]
    slow, fast = LineSplitter(12), LineSplitter(12)
    assert feed_fast(fast, chunks) == feed_all(slow, chunks)
    assert fast.oversized == slow.oversized
