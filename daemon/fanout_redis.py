"""Redis as ``[fanout]`` uses it: a client that fails fast, the append script, the doctor's probe.

The publisher (``daemon/fanout.py``) retries and catches up from the store, so its client never
retries nor waits long by itself; the stream keys are ``daemon/fanout_keys.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Sequence
from typing import Final

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from codelegate.daemon.deliveries import Delivery
from codelegate.policy.config import FanoutConfig, redacted_url

SOCKET_TIMEOUT_S: Final = 5.0  # a Redis that does not answer this long counts as gone

# Appends frames to one run's stream: ``XADD <key> <seq>-0 frame <json>`` for each frame that
# follows on from the stream's top, that is whose predecessor (the seq it follows: ``seq - 1``
# live, the one stored before it in a catch-up from a capped store) is there; one already there
# is skipped (published twice), and one after a gap stops the call (the publisher fills the
# gap from the store). One call carries a run's frames of a pipeline, packed into one argument
# (``<seq> <predecessor> <length>\n<json>`` each): one argument and one answer per run, not per
# frame, which is what makes publishing cheap for the daemon's event loop (redis-py packs and
# parses each argument and answer in Python; see bench/RESULTS.md). Returns {top before, top
# after}.
APPEND_SCRIPT: Final = r"""
local key, blob = KEYS[1], ARGV[1]
local top = 0
local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
if last[1] then top = tonumber(string.match(last[1][1], '^%d+')) end
local before, pos = top, 1
while pos <= #blob do
  local _, head, seq, prev, len = string.find(blob, '^(%d+) (%d+) (%d+)\n', pos)
  local n = tonumber(seq)
  if tonumber(prev) > top then break end
  pos = head + tonumber(len) + 1
  if n > top then
    redis.call('XADD', key, seq .. '-0', 'frame', string.sub(blob, head + 1, pos - 1))
    top = n
  end
end
return {before, top}
"""
APPEND_SHA: Final = hashlib.sha1(APPEND_SCRIPT.encode(), usedforsecurity=False).hexdigest()


def append_blob(group: Sequence[Delivery], stored_after: int | None = None) -> bytes:
    """The one argument of :data:`APPEND_SCRIPT` for a run's frames of a pipeline: live ones,
    each following the seq before it, or (``stored_after``) a page the store gave for the seqs
    after that one, each following the frame before it in the page."""
    if stored_after is None:
        return b"".join([b"%d %d %d\n%b" % (d.seq, d.seq - 1, len(d.data), d.data) for d in group])
    prevs = [stored_after, *(d.seq for d in group[:-1])]
    return b"".join(
        [
            b"%d %d %d\n%b" % (d.seq, p, len(d.data), d.data)
            for d, p in zip(group, prevs, strict=True)
        ]
    )


def connect(fanout: FanoutConfig, *, socket_timeout: float | None = None) -> Redis:
    """An asyncio client for ``fanout.redis_url`` that fails fast (the publisher retries)."""
    timeout = SOCKET_TIMEOUT_S if socket_timeout is None else socket_timeout
    return Redis.from_url(
        fanout.redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


def probe(fanout: FanoutConfig, timeout_s: float = 3.0) -> str:
    """``codelegate doctor``: "" when Redis answers PING, has streams and runs the append script
    (a managed Redis or an ACL may refuse scripting), else what failed."""

    async def ping() -> str:
        client = connect(fanout, socket_timeout=timeout_s)
        try:
            await client.ping()
            info = await client.info("server")
            version = str(info.get("redis_version", "0"))
            if int(version.partition(".")[0]) < 5:
                return f"Redis {version} has no streams (5.0 or later is needed)"
            # Loading caches the script and runs nothing: what the publisher does first.
            try:
                await client.script_load(APPEND_SCRIPT)
            except ResponseError as exc:
                return f"Redis refuses the append script ({exc}): fan-out needs EVALSHA"
            return ""
        except (RedisError, OSError, ValueError) as exc:
            return f"cannot reach Redis at {redacted_url(fanout.redis_url)}: {exc}"
        finally:
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()

    return asyncio.run(ping())
