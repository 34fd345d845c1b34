"""One Claude CLI process per run, supervised until the last process it started is gone.

The child runs in a session of its own (``start_new_session``), so SIGTERM reaches its whole
process group; what escaped the group (``setsid`` Bash commands, double-forked grandchildren) is
found through the run marker in its environment (:mod:`.procs`) and, where a delegated cgroup
v2 subtree exists, through the run's own cgroup (:mod:`.cgroups`), and SIGKILLed. The same
sweep runs after a normal exit: nothing a run started outlives it.

stdout is handed out as raw chunks: splitting lines is the translator's ``LineSplitter`` job, so
an oversized line costs a bounded buffer, never a crash. stderr is drained all the time (a child
blocked on a full stderr pipe would hang the run) into a bounded ring of lines, which are
redacted as one text when the tail is taken (a secret spread over lines is masked whole).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, NamedTuple

from codelegate.daemon.supervision import procs
from codelegate.daemon.supervision.cgroups import RunCgroup
from codelegate.policy.environment import RUN_MARKER_VAR
from codelegate.translator.redact import PLAIN, Redactor

STDERR_LINE_CHARS = 2000  # per kept stderr line; a runaway line must not fill the ring's memory
STDOUT_BUFFER = 1 << 16  # StreamReader high-water mark: the pipe is paused above 2x this


class ExitStatus(NamedTuple):
    """How the child ended: an exit code, or the signal that killed it (never both)."""

    exit_code: int | None
    signal: int | None


class SpawnError(Exception):
    """The CLI could not be started (missing binary, bad cwd, permission)."""


def can_enter(path: str) -> bool:
    """Whether this process may enter (search) the directory ``path``: what the child's chdir
    into a workspace needs, told by the kernel (mode, owner, groups, ACLs, capabilities)."""
    return os.access(path, os.X_OK, effective_ids=os.access in os.supports_effective_ids)


def pin_directory(path: str) -> int:
    """An ``O_PATH`` descriptor of the directory at the absolute ``path``, opened one component
    at a time without following any symbolic link.

    ``path`` is the workspace as policy resolved and checked it. Between that check and the
    spawn a component could be swapped for a symbolic link pointing elsewhere; opened this way
    such a component fails (``ENOTDIR``/``ELOOP``) instead of being followed, and the child is
    started in the directory this descriptor holds, not in whatever the path names by then.
    """
    if not os.path.isabs(path):
        raise OSError(f"not an absolute path: {path!r}")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":  # a resolved path has none; never walk up past the check
                raise OSError(f"'..' in a resolved path: {path!r}")
            parent, fd = fd, -1
            try:
                fd = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
            finally:
                os.close(parent)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def _descriptor_path(fd: int, path: str) -> str:
    """A path the child can chdir to that names exactly the directory ``fd`` holds.

    The child inherits our descriptors until it execs (they are close-on-exec), so it resolves
    ``/proc/self/fd/<fd>`` to the same directory; without /proc, the checked path itself.
    """
    via = f"/proc/self/fd/{fd}"
    return via if os.path.isdir(via) else path


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, telling us when the stdout and stderr pipes close."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.closed = {1: asyncio.Event(), 2: asyncio.Event()}
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        # asyncio's Process.wait() (3.11) only returns once every pipe is closed, which a
        # straggler holding our stdout can postpone forever: track the exit itself.
        super().process_exited()
        self.exited.set()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        super().pipe_connection_lost(fd, exc)
        if fd in self.closed:
            self.closed[fd].set()

    async def output_closed(self) -> None:
        """Both output pipes reached EOF."""
        for event in self.closed.values():
            await event.wait()


async def _start(
    argv: Sequence[str], *, cwd: str, env: Mapping[str, str], run_id: str, cgroup: bool
) -> tuple[asyncio.subprocess.Process, asyncio.SubprocessTransport, _Protocol, RunCgroup | None]:
    """The child process, in a session (and, with ``cgroup``, a cgroup) of its own."""
    run_cgroup = RunCgroup.create(run_id) if cgroup else None
    launch = list(argv)
    if run_cgroup is not None:
        # Through the shell wrapper a missing binary would only show as exit 127: check it
        # here so that it stays a spawn failure.
        if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            run_cgroup.remove()
            raise SpawnError(f"cannot start {argv[0]!r}: not an executable file")
        launch = run_cgroup.wrap(argv)
    loop = asyncio.get_running_loop()
    with procs.spawning():
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _Protocol(STDOUT_BUFFER, loop),
                *launch,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
        except OSError as exc:
            if run_cgroup is not None:
                run_cgroup.remove()
            raise SpawnError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        procs.register_child(proc.pid)
    return proc, transport, protocol, run_cgroup


class ChildProcess:
    """A spawned CLI process of one run. Create with :meth:`spawn`."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        transport: asyncio.SubprocessTransport,
        protocol: _Protocol,
        *,
        run_id: str,
        stderr_lines: int,
        eof_grace: float,
        on_stderr_line: Callable[[int], None] | None,
        cgroup: RunCgroup | None,
        redactor: Redactor = PLAIN,
    ) -> None:
        self.pid = proc.pid
        self.cgroup = cgroup
        self.run_id = run_id
        self.stderr_lines_seen = 0
        self._proc = proc
        self._transport = transport
        self._protocol = protocol
        # Raw lines (and whether each was cut), in memory only: redacted when the tail is taken.
        self._ring: collections.deque[tuple[str, bool]] = collections.deque(
            maxlen=max(1, stderr_lines)
        )
        self._redactor = redactor
        self._eof_grace = eof_grace
        self._on_stderr_line = on_stderr_line
        self._status: ExitStatus | None = None
        self._terminating: asyncio.Future[ExitStatus] | None = None
        self._killed = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._after_exit: asyncio.Task[None] | None = None

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes,
        run_id: str,
        stderr_lines: int = 200,
        eof_grace: float = 2.0,
        on_stderr_line: Callable[[int], None] | None = None,
        cgroup: bool = True,
        redactor: Redactor = PLAIN,
        keep_stdin: bool = False,
    ) -> ChildProcess:
        """Start ``argv`` in a new session, write ``stdin`` and close it (with ``keep_stdin``
        leave it open: :meth:`send` writes more, :meth:`close_stdin` or a termination ends it).

        ``env`` must carry ``RUN_MARKER_VAR=run_id``: without it the run's escaped processes
        could not be found again, so it is refused. ``on_stderr_line(count)`` is called with the
        running total of stderr lines. With ``cgroup`` (the default) the run also gets a cgroup
        of its own where a delegated cgroup v2 subtree is available (see :mod:`.cgroups`).
        ``cwd`` is the workspace as policy resolved it: it is opened without following symbolic
        links and the child starts in the directory so opened (:func:`pin_directory`).
        ``redactor`` (the run's: it knows the credentials in ``env``) cleans the stderr tail.
        Raises :class:`SpawnError` if the program cannot start.
        """
        if env.get(RUN_MARKER_VAR) != run_id:
            raise ValueError(f"env must carry {RUN_MARKER_VAR}={run_id}")
        if not argv:
            raise SpawnError("empty argv")
        try:
            cwd_fd = pin_directory(cwd)
        except OSError as exc:
            raise SpawnError(
                f"cannot start in {cwd!r}: {exc.strerror or exc} (the workspace changed since"
                " it was checked, or is gone)"
            ) from exc
        try:
            proc, transport, protocol, run_cgroup = await _start(
                argv, cwd=_descriptor_path(cwd_fd, cwd), env=env, run_id=run_id, cgroup=cgroup
            )
        finally:
            os.close(cwd_fd)
        child = cls(
            proc,
            transport,
            protocol,
            run_id=run_id,
            stderr_lines=stderr_lines,
            eof_grace=eof_grace,
            on_stderr_line=on_stderr_line,
            cgroup=run_cgroup,
            redactor=redactor,
        )
        child._spawn_task(child._feed_stdin(stdin, close=not keep_stdin), "stdin")
        child._spawn_task(child._drain_stderr(), "stderr")
        child._after_exit = child._spawn_task(child._close_output_after_exit(), "output-eof")
        return child

    def _spawn_task(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        # Strong references: the loop only keeps weak ones to tasks.
        task = asyncio.ensure_future(coro)
        task.set_name(f"run {self.run_id} {what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _feed_stdin(self, data: bytes, *, close: bool) -> None:
        # Written from a task so that a prompt larger than the pipe cannot deadlock a child that
        # writes before it has read everything. A child that exits early just breaks the pipe.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if data:
                self.send(data)
                await self._stdin.drain()
            if close:
                self.close_stdin()
                await self._stdin.wait_closed()

    @property
    def _stdin(self) -> asyncio.StreamWriter:
        writer = self._proc.stdin
        assert writer is not None  # noqa: S101 - PIPE was requested
        return writer

    def send(self, data: bytes) -> bool:
        """Queue ``data`` (whole lines) on the child's stdin, after whatever was queued before;
        False when stdin is closed already (then nothing is written)."""
        writer = self._stdin
        if writer.is_closing():
            return False
        writer.write(data)
        return True

    @property
    def stdin_open(self) -> bool:
        """Whether lines can still be sent (stdin not closed, nor closing)."""
        return not self._stdin.is_closing()

    def close_stdin(self) -> None:
        """Close the child's stdin once what was queued is written (idempotent)."""
        writer = self._stdin
        if not writer.is_closing():
            writer.close()

    async def _drain_stderr(self) -> None:
        reader = self._proc.stderr
        assert reader is not None  # noqa: S101 - PIPE was requested
        pending = bytearray()
        overflow = False
        while chunk := await reader.read(1 << 14):
            start = 0
            while (nl := chunk.find(b"\n", start)) >= 0:
                if not overflow:
                    pending += chunk[start:nl]
                self._keep_line(bytes(pending), overflow)
                pending.clear()
                overflow = False
                start = nl + 1
            if not overflow:
                pending += chunk[start:]
                if len(pending) > STDERR_LINE_CHARS * 4:  # UTF-8: at most 4 bytes a char
                    del pending[STDERR_LINE_CHARS * 4 :]
                    overflow = True
        if pending or overflow:
            self._keep_line(bytes(pending), overflow)

    def _keep_line(self, raw: bytes, cut: bool) -> None:
        text = raw.decode("utf-8", "replace")
        # Kept raw: a line redacted alone would miss what spans lines (the body of a PEM key),
        # and a line redacted after its cut would miss a token the cut went through.
        cut = cut or len(text) > STDERR_LINE_CHARS
        self._ring.append((text[:STDERR_LINE_CHARS], cut))
        self.stderr_lines_seen += 1
        if self._on_stderr_line is not None:
            self._on_stderr_line(self.stderr_lines_seen)

    async def _close_output_after_exit(self) -> None:
        # A straggler that inherited our stdout keeps the pipe open after the CLI exits, and the
        # reader would wait forever. Give the pipe a grace to drain, then kill what holds it;
        # if it is still open after that (a process we cannot see), stop reading.
        await self._protocol.exited.wait()
        for step in (self.reap_stragglers, self._force_close_output):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._protocol.output_closed(), self._eof_grace)
                return
            await step()

    async def _force_close_output(self) -> int:
        for fd in (1, 2):
            pipe = self._transport.get_pipe_transport(fd)
            if pipe is not None:
                pipe.close()
        return 0

    @property
    def returncode(self) -> int | None:
        """The raw asyncio return code (negative = signal), None while running."""
        return self._transport.get_returncode()

    @property
    def killed(self) -> int:
        """How many stray processes of this run were SIGKILLed so far."""
        return self._killed

    async def read(self, n: int = 1 << 16) -> bytes:
        """Next stdout chunk of at most ``n`` bytes; ``b""`` at end of output."""
        reader = self._proc.stdout
        assert reader is not None  # noqa: S101 - PIPE was requested
        return await reader.read(n)

    async def output_closed(self) -> None:
        """Wait until the CLI exited and stdout and stderr are closed, stragglers holding them
        killed (at most about 2 x ``eof_grace`` plus a kill sweep after the exit)."""
        await self._protocol.output_closed()
        if self._after_exit is not None:
            await asyncio.shield(self._after_exit)

    def stderr_tail(self, limit: int = sys.maxsize) -> str:
        """The last ``limit`` characters of the kept stderr lines: redacted as one text, then
        cut (so a cut never leaves part of a secret that redaction would have seen whole)."""
        return self._redactor.clean_lines(self._ring, limit)

    async def wait(self) -> ExitStatus:
        """Wait for the CLI process itself to exit (not for its stragglers)."""
        await self._protocol.exited.wait()
        code = self._transport.get_returncode()
        assert code is not None  # noqa: S101 - set before process_exited is called
        procs.unregister_child(self.pid)
        if self._status is None:
            self._status = ExitStatus(None, -code) if code < 0 else ExitStatus(code, None)
        return self._status

    async def terminate(self, grace: float) -> ExitStatus:
        """SIGTERM the group, wait ``grace``, then SIGKILL the group and every marked process.

        Idempotent: concurrent and repeated calls share one termination and its result.
        """
        if self._terminating is None:
            self._terminating = asyncio.ensure_future(self._terminate(grace))
        return await asyncio.shield(self._terminating)

    async def _terminate(self, grace: float) -> ExitStatus:
        self.close_stdin()
        if self.returncode is None:
            # The CLI stops its own Bash trees on SIGTERM: give it the chance first.
            procs.signal_group(self.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._protocol.exited.wait(), grace)
        # Only signal the group while its leader is unreaped: after that the pgid could be
        # recycled, and every member still carries the marker anyway.
        pgid = self.pid if self.returncode is None else None
        await self._kill_all(pgid)
        return await self.wait()

    async def reap_stragglers(self) -> int:
        """After the CLI exited: SIGKILL whatever of the run is left. Returns how many."""
        return await self._kill_all(None)

    async def _kill_all(self, pgid: int | None) -> int:
        killed, _ = await procs.kill_run(
            self.run_id, pgid=pgid, cgroup=self.cgroup, leader=self.pid
        )
        self._killed += killed
        # An empty run cgroup is removed; one that cannot be (a process in D state) is kept
        # for the next sweep.
        if self.cgroup is not None and self.cgroup.remove():
            self.cgroup = None
        return killed

    async def aclose(self) -> None:
        """Cancel the helper tasks (after the run is over and output has been read)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.cgroup is not None and self.cgroup.remove():
            self.cgroup = None
