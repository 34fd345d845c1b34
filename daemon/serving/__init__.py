"""Serving: the aiohttp surface (listeners, access checks, routes, NDJSON and WebSocket streams)."""
