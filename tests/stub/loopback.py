"""Serve an aiohttp application on 127.0.0.1, on a free port, for the length of a block."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def on_loopback(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on 127.0.0.1 (a port the kernel picks); yields its base URL."""
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
