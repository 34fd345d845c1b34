"""``claude --version``: the one probe, for ``/healthz``, the start-up log and ``doctor``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final

# The CLI answers in well under a second; a first start on a cold disk (node loading its
# modules) can take several.
VERSION_TIMEOUT_S: Final = 15.0
# What the probe's environment keeps of the daemon's: enough to find node and a locale, none of
# the credentials (a version answer needs none).
_KEPT: Final = ("PATH", "HOME", "LANG")


async def cli_version(path: str, environ: Mapping[str, str]) -> str | None:
    """The version the CLI at ``path`` reports (``2.1.332``); None when it does not answer."""
    try:
        proc = await asyncio.create_subprocess_exec(
            path,
            "--version",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={k: v for k, v in environ.items() if k in _KEPT},
        )
    except OSError:
        return None
    try:
        async with asyncio.timeout(VERSION_TIMEOUT_S):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    words = out.decode("utf-8", "replace").split()
    return words[0] if proc.returncode == 0 and words else None
