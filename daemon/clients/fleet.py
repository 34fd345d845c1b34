"""Following a fleet through Redis: the reader side of ``[fanout]`` (daemon/fanout.py).

This is the model for a backend (O Chat's) that follows every run of many daemons at once.
Two kinds of stream: ``<prefix>:runs``, the index, where each run's start (``status`` =
``running``) and end (its final status) appear with its ``run_id`` and ``host_id``; and one
``<prefix>:run:<run_id>`` per run, whose entry ``<seq>-0`` holds frame ``seq``. The reader keeps,
per run, the last seq it has (exactly the ``after=`` of the daemon's own API) and one id for the
index, and blocks on a single ``XREAD`` over all of them. A run is followed from its start entry
(or from an end entry whose start was trimmed) until its ``run_result`` frame. To resume after a
restart, a backend stores those positions and passes them back (``since``, ``after``).

In a few lines of redis-py, the whole loop is::

    index, after = "0-0", {}                     # or the positions stored last time
    while True:
        keys = {f"{p}:runs": index} | {f"{p}:run:{r}": f"{s}-0" for r, s in after.items()}
        for key, entries in await redis.xread(keys, block=5000, count=1000):
            for entry_id, fields in entries:
                if key == f"{p}:runs".encode():
                    index = entry_id
                    if fields[b"status"] == b"running":  # a start; ends tell the status
                        after.setdefault(fields[b"run_id"].decode(), 0)
                else:
                    run_id, seq = key.decode().rpartition(":")[2], int(entry_id.split(b"-")[0])
                    handle(run_id, seq, fields[b"frame"])   # the frame's JSON bytes
                    after[run_id] = seq
                    if b'"type":"run_result"' in fields[b"frame"]:  # a JSON decode is better
                        del after[run_id]

(With Redis Cluster, keys live on different shards: XREAD each shard's keys separately.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final, cast

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from codelegate.daemon.fanout_keys import index_key, seq_of, stream_key
from codelegate.policy.config import redacted_url, redis_url_problem

BLOCK_MS: Final = 5000  # one XREAD waits at most this long before the loop goes round
COUNT: Final = 1000  # entries per stream per XREAD


# What XREAD answers (redis-py's own annotation is looser): per stream, its (id, fields) entries.
_XRead = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None


class _Type(msgspec.Struct):
    type: str = ""


_type: Final = msgspec.json.Decoder(_Type)


@dataclass(frozen=True)
class FleetFrame:
    """One frame of one run of the fleet, as the daemon that ran it encoded it."""

    run_id: str
    host_id: str
    seq: int
    data: bytes  # the frame's JSON, byte for byte the NDJSON replay's line
    last: bool  # the run_result: the run is complete


@dataclass
class Positions:
    """Where a reader is: the index id and, per run followed, the last seq it has."""

    index: str = "0-0"  # "0-0": every run the index still has; "$": runs started from now on
    after: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)
    # Runs followed to their end, so that a later index entry of theirs does not replay them.
    completed: set[str] = field(default_factory=set)


async def follow_fleet(
    client: Redis,
    prefix: str,
    positions: Positions | None = None,
    *,
    block_ms: int = BLOCK_MS,
) -> AsyncIterator[FleetFrame]:
    """Every frame of every run of the fleet, each run in seq order, gapless; forever.

    ``positions`` is updated as frames are yielded: keep it to resume with ``after=`` semantics.
    """
    pos = positions if positions is not None else Positions()
    index = index_key(prefix)
    index_b = index.encode()
    while True:
        keys: dict[str, str] = {index: pos.index}
        for run_id, seq in pos.after.items():
            keys[stream_key(prefix, run_id)] = f"{seq}-0"
        streams: dict[Any, Any] = keys  # redis-py wants a dict of its own key and id types
        answer = cast(_XRead, await client.xread(streams, count=COUNT, block=block_ms))
        for key, entries in answer or ():
            if key == index_b:
                for entry_id, fields in entries:
                    pos.index = entry_id.decode()
                    run_id = fields[b"run_id"].decode()
                    if run_id in pos.after or run_id in pos.completed:
                        continue
                    # A start, or an end whose start was trimmed: the stream has it all.
                    pos.after[run_id] = 0
                    pos.hosts[run_id] = fields.get(b"host_id", b"").decode()
                continue
            run_id = key.decode().rpartition(":")[2]
            if run_id not in pos.after:
                continue
            for entry_id, fields in entries:
                seq = seq_of(entry_id)
                data = fields[b"frame"]
                last = _type.decode(data).type == "run_result"
                pos.after[run_id] = seq
                yield FleetFrame(run_id, pos.hosts.get(run_id, ""), seq, data, last)
                if last:
                    del pos.after[run_id]
                    pos.hosts.pop(run_id, None)
                    pos.completed.add(run_id)
                    break


# -- codelegate watch --redis URL ---------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codelegate watch --redis",
        description="Follow every run of a fleet of daemons through Redis ([fanout]).",
    )
    parser.add_argument("--redis", required=True, metavar="URL", help="redis://host:port/db")
    parser.add_argument("--prefix", default="codelegate", help="the daemons' stream_prefix")
    parser.add_argument(
        "--new", action="store_true", help="only runs that start from now on (default: all kept)"
    )
    parser.add_argument("--json", action="store_true", help="print the frames as NDJSON")
    return parser


async def _watch(args: argparse.Namespace) -> int:
    # The terminal client's renderer draws the cards (imported here: rich only when used).
    from rich.console import Console

    from codelegate.daemon.clients.terminal import Renderer, _decode

    console = Console(stderr=args.json, highlight=False)
    renderer = Renderer(console, json_out=sys.stdout.buffer if args.json else None, many=True)
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    client = Redis.from_url(args.redis)

    async def pump() -> None:
        positions = Positions(index="$" if args.new else "0-0")
        async for frame in follow_fleet(client, args.prefix, positions):
            renderer.line(frame.data, _decode(frame.data))

    try:
        with renderer:
            job = asyncio.ensure_future(pump())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({job, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (job, stopped):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job  # re-raises a Redis error
        return 0
    except (RedisError, OSError) as exc:
        console.print(
            f"codelegate watch: Redis at {redacted_url(args.redis)}: {exc}",
            style="red",
            markup=False,
        )
        return 3
    finally:
        with contextlib.suppress(RedisError, OSError):
            await client.aclose()


def main(argv: list[str]) -> int:
    """``codelegate watch --redis URL [--prefix P] [--new] [--json]``."""
    args = _parser().parse_args(argv)
    problem = redis_url_problem(args.redis)
    if problem:
        print(f"codelegate watch: --redis: {problem}", file=sys.stderr)
        return 2
    return asyncio.run(_watch(args))
