"""What the app's handlers share: typed app keys and the daemon's mutable state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from aiohttp import web

from codelegate.daemon.hub import Hub
from codelegate.daemon.metrics import Metrics
from codelegate.daemon.runs import RunManager
from codelegate.daemon.store.store import RunStore
from codelegate.policy.codes import BAD_REQUEST, UNAVAILABLE
from codelegate.policy.config import Config
from codelegate.policy.errors import PolicyError

if TYPE_CHECKING:  # redis-py is imported only when [fanout] is configured
    from codelegate.daemon.fanout import Publisher


@dataclass
class DaemonState:
    """Mutable state the app shares across handlers (the app itself is frozen once started)."""

    environ: Mapping[str, str]
    tcp_token: bytes | None = None
    stopping: bool = False
    cli_version: str | None = None
    manager: RunManager | None = None
    store: RunStore | None = None
    fanout: Publisher | None = None  # [fanout]: frames on Redis Streams


CONFIG: Final = web.AppKey("config", Config)
HUB: Final = web.AppKey("hub", Hub)
METRICS: Final = web.AppKey("metrics", Metrics)
STATE: Final = web.AppKey("state", DaemonState)


def manager_of(app: web.Application) -> RunManager:
    """The app's run manager (available while the app runs)."""
    manager = app[STATE].manager
    if manager is None:
        raise PolicyError(UNAVAILABLE, "the daemon is starting")
    return manager


def int_query(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter within [lo, hi]; 400 otherwise."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PolicyError(BAD_REQUEST, f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise PolicyError(BAD_REQUEST, f"{name} must be between {lo} and {hi}")
    return value
