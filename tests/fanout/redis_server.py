"""A ``redis-server`` child process on loopback, for the [fanout] tests and benchmarks.

Its own port and directory; append-only file fsynced on every write, so that a killed and
restarted Redis keeps what it acknowledged, like a production one. Readiness is Redis's own
"Ready to accept connections" line, not a poll.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` child process: start, SIGSTOP/SIGCONT, kill, restart."""

    def __init__(
        self, binary: str, folder: Path, *, fsync: str = "always", password: str | None = None
    ) -> None:
        self.binary = binary
        self.password = password
        self.fsync = fsync  # appendfsync: "always" for the tests, "everysec" (the usual) to bench
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: list[bytes] = []
        self._drain = threading.Thread()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start and return once Redis says it accepts connections."""
        self.folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
                "--logfile",
                "",
                *(("--requirepass", self.password) if self.password else ()),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.proc = proc
        ready = threading.Event()

        def drain() -> None:  # keep reading, or Redis blocks on a full pipe
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log.append(line)
                if b"Ready to accept connections" in line:
                    ready.set()
            ready.set()  # EOF: it exited

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        if not ready.wait(30) or proc.poll() is not None:
            raise RuntimeError(b"".join(self.log[-20:]).decode(errors="replace"))

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self, *, wipe: bool = False) -> None:
        """SIGKILL; ``wipe`` also deletes its data (a Redis that comes back empty)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)  # a stopped process still dies, but be plain
        self.proc.kill()
        self.proc.wait()
        self._drain.join()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if wipe:
            shutil.rmtree(self.folder)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
