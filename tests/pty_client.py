"""``codelegate run`` as a user starts it: its own process, a pty for its terminal.

What the tests read is the screen's bytes with rich's own codes taken out (colours, Live's
redraws): the words a person sees, whatever Live does around them.
"""

from __future__ import annotations

import asyncio
import os
import pty
import re
import signal
import sys

from tests.polling import until

# What the ``codelegate`` console script runs (``-m`` would import the module twice).
_CONSOLE_SCRIPT = "import sys; from codelegate.daemon.cli import main; sys.exit(main())"
# rich's SGR colours, erase-line, cursor moves and cursor show/hide.
_RICH_CODES = re.compile(rb"\x1b\[(?:[0-9;]*m|[0-9]*K|[0-9]*[AB]|\?25[hl])|\r")


class PtyClient:
    """``codelegate run ARGS`` with a pty as its stdin, stdout and stderr."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int) -> None:
        self.proc = proc
        self._master: int | None = master
        self._screen = bytearray()
        asyncio.get_running_loop().add_reader(master, self._read)

    @classmethod
    async def start(cls, *args: str) -> PtyClient:
        master, slave = pty.openpty()
        env = {**os.environ, "COLUMNS": "200", "LINES": "50", "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _CONSOLE_SCRIPT,
                "run",
                *args,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                start_new_session=True,  # its own session, as a login shell's job would be
            )
        finally:
            os.close(slave)
        return cls(proc, master)

    def _read(self) -> None:
        assert self._master is not None
        try:
            chunk = os.read(self._master, 65536)
        except OSError:  # EIO: the client closed its end
            chunk = b""
        if chunk:
            self._screen += chunk
        else:
            self._close_master()

    def _close_master(self) -> None:
        if self._master is not None:
            asyncio.get_running_loop().remove_reader(self._master)
            os.close(self._master)
            self._master = None

    @property
    def screen(self) -> str:
        return _RICH_CODES.sub(b"", bytes(self._screen)).decode(errors="replace")

    async def shown(self, text: str) -> None:
        """Wait until ``text`` is on the screen."""
        await until(lambda: text in self.screen, 60, f"{text!r} on the screen:\n{self.screen}")

    def type(self, keys: bytes) -> None:
        assert self._master is not None
        os.write(self._master, keys)

    def hang_up(self) -> None:
        """The terminal goes away (a closed window, a dropped SSH session): its end closes and
        the client gets SIGHUP, as the kernel sends it to a session that loses its terminal."""
        self._close_master()
        self.proc.send_signal(signal.SIGHUP)

    async def exit_code(self) -> int:
        async with asyncio.timeout(60):
            return await self.proc.wait()

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._close_master()
