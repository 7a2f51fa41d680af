"""Running commands: buffered (one request, one result), streamed, and long-lived background processes.

Every command runs without a shell in its own session (process group), so a timeout or a signal reaches
the grandchildren too. Buffered exec spawns inline and watches pipes and a pidfd on the event loop: measured
on these machines that costs about one fork/exec, while asyncio's subprocess transport (child-watcher
thread, extra callbacks) costs about twice that, uvloop's about four times, and a worker-thread hop adds
about a millisecond under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad_request
from .shellwords import split_words

# Environment the runtime never passes on to commands: its own credentials.
_PRIVATE_ENV = ("SANDBOX_RUNTIME_TOKEN", "SANDBOX_RUNTIME_TOKEN_FILE")
# After the main process exits, output pipes may still be held open by a backgrounded grandchild;
# we stop waiting for their EOF after this long instead of hanging until the timeout.
PIPE_GRACE_SECONDS = 0.5
# Commands longer than this are split on a worker thread: even linear splitting of a few MiB of quoting
# takes long enough (Python-level work per quoted part) to be felt by every other request.
INLINE_SPLIT_LIMIT = 64 * 1024


def split_command(command: str) -> list[str]:
    try:
        argv = split_words(command)
    except ValueError as err:
        raise bad_request(f"cannot split command: {err}") from None
    if not argv:
        raise bad_request("command is empty")
    return argv


async def split_command_async(command: str) -> list[str]:
    """split_command, on a worker thread for long commands so the event loop keeps serving."""
    if len(command) <= INLINE_SPLIT_LIMIT:
        return split_command(command)
    return await asyncio.to_thread(split_command, command)


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}


@dataclass
class ExecSpec:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    stdin: bytes | None = None
    timeout: float | None = None
    max_output: int = 10 * 1024 * 1024


@dataclass
class ExecResult:
    argv: list[str]
    cwd: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    duration: float
    started_at: float
    signal: int | None = None


def _spawn_error(spec: ExecSpec, err: OSError, started: float) -> ExecResult:
    # Shell conventions: 127 command not found, 126 found but not executable.
    code = 127 if isinstance(err, FileNotFoundError) else 126
    msg = f"failed to execute {spec.argv[0]!r}: {err.strerror or err}\n".encode()
    return ExecResult(spec.argv, spec.cwd, code, b"", msg, False, False, time.time() - started, started)


def _exit_code(returncode: int) -> tuple[int, int | None]:
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


def killpg(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def run_async(spec: ExecSpec) -> ExecResult:
    """Buffered exec on the event loop itself: Popen (vfork + exec) inline, then the pipes and a pidfd
    are watched with add_reader. No thread hop and no asyncio subprocess transport, so the cost of
    a short command stays close to a bare fork/exec."""
    loop = asyncio.get_running_loop()
    started = time.time()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            spec.argv,
            cwd=spec.cwd,
            env=spec.env,
            stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as err:
        return _spawn_error(spec, err, started)
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    state = {"truncated": False}
    pipes_done = loop.create_future()
    exited = loop.create_future()
    open_fds = set(bufs)
    pidfd = os.pidfd_open(proc.pid)

    def on_pipe(fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            loop.remove_reader(fd)
            open_fds.discard(fd)
            if not open_fds and not pipes_done.done():
                pipes_done.set_result(None)
            return
        buf = bufs[fd]
        room = spec.max_output - len(buf)
        if room > 0:
            buf += chunk[:room]
        if len(chunk) > room:
            state["truncated"] = True

    def on_exit() -> None:
        loop.remove_reader(pidfd)
        if not exited.done():
            exited.set_result(None)

    for fd in bufs:
        os.set_blocking(fd, False)
        loop.add_reader(fd, on_pipe, fd)
    loop.add_reader(pidfd, on_exit)
    if spec.stdin and proc.stdin is not None:
        _feed_stdin(proc.stdin, spec.stdin)
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(exited), spec.timeout)
        except TimeoutError:
            timed_out = True
            killpg(proc.pid)
            await exited
        if open_fds:
            # Pipes still open after the exit: a backgrounded grandchild holds them. Give it a moment
            # to finish writing, then return without waiting for it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pipes_done), PIPE_GRACE_SECONDS)
    finally:
        for fd in list(open_fds):
            loop.remove_reader(fd)
        if not exited.done():
            loop.remove_reader(pidfd)
            killpg(proc.pid)
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
        # The child has exited (pidfd readable), so this reaps without blocking.
        proc.wait()
    code, sig = _exit_code(proc.returncode)
    if timed_out:
        code, sig = 124, signal.SIGKILL
    return ExecResult(
        spec.argv,
        spec.cwd,
        code,
        bytes(bufs[out_fd]),
        bytes(bufs[err_fd]),
        timed_out,
        state["truncated"],
        time.monotonic() - t0,
        started,
        sig,
    )


def _feed_stdin(pipe: Any, data: bytes) -> None:
    import threading

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            pipe.write(data)
        with contextlib.suppress(OSError):
            pipe.close()

    if len(data) <= 32 * 1024:
        feed()
    else:
        threading.Thread(target=feed, daemon=True).start()


class Limiter:
    """Caps concurrent processes; a full runtime answers 429 instead of forking without bound.

    Each slot held (a command, a terminal, a background process) is also held in `busy` (the runtime's
    activity): a sandbox running something somebody started is not idle, however long ago the request was.
    """

    def __init__(self, limit: int, busy: contextlib.AbstractContextManager[None] | None = None) -> None:
        self.limit = limit
        self.active = 0
        self.busy = busy

    def acquire(self) -> None:
        if self.active >= self.limit:
            raise ApiError(429, "RESOURCE_EXHAUSTED", f"too many running processes (limit {self.limit})")
        self.active += 1
        if self.busy is not None:
            self.busy.__enter__()

    def release(self) -> None:
        self.active -= 1
        if self.busy is not None:
            self.busy.__exit__(None, None, None)


# What one kept output chunk costs besides its bytes (the Chunk and bytes objects, the deque slot): counted
# against the log limit, so a process printing one byte at a time cannot pile up millions of chunks.
CHUNK_OVERHEAD = 200


@dataclass
class Chunk:
    stream: str
    offset: int
    data: bytes


@dataclass
class Process:
    """A command running in the background (or a streamed exec), with a bounded log of its output."""

    id: str
    argv: list[str]
    cwd: str
    pid: int
    started_at: float
    proc: asyncio.subprocess.Process
    log_limit: int
    tag: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    ended_at: float | None = None
    journal: bool = True  # recorded in the journal (and HANDOFF.md) when it exits
    chunks: deque[Chunk] = field(default_factory=deque)
    offsets: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    seq: int = 0
    dropped: int = 0
    logged: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    captured: dict[str, bytearray] = field(
        default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()}
    )
    capture_limit: int = 64 * 1024
    last_used: float = field(default_factory=time.monotonic)

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            "argv": self.argv,
            "cwd": self.cwd,
            "tag": self.tag,
            "state": "running" if self.running else "exited",
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "stdout_bytes": self.offsets["stdout"],
            "stderr_bytes": self.offsets["stderr"],
        }

    async def append(self, stream: str, data: bytes) -> None:
        cap = self.captured[stream]
        if len(cap) < self.capture_limit:
            cap += data[: self.capture_limit - len(cap)]
        self.chunks.append(Chunk(stream, self.offsets[stream], data))
        self.offsets[stream] += len(data)
        self.logged += len(data) + CHUNK_OVERHEAD
        self.seq += 1
        while self.logged > self.log_limit and len(self.chunks) > 1:
            old = self.chunks.popleft()
            self.logged -= len(old.data) + CHUNK_OVERHEAD
            self.dropped += 1
        async with self.changed:
            self.changed.notify_all()

    async def follow_raw(self) -> AsyncIterator[tuple[str, bytes] | None]:
        """(stream, bytes) for every output chunk from the start, then None once the process exited."""
        async for ev in self._events(0, follow=True, raw=True):
            yield None if ev["type"] == "exit" else (ev["type"], ev["data"])

    async def follow(self, since: int = 0, follow: bool = True) -> AsyncIterator[dict[str, Any]]:
        async for ev in self._events(since, follow=follow, raw=False):
            yield ev

    def release_log(self) -> None:
        """Forget the kept output (an exited process over the log budget); readers then see `dropped`."""
        self.dropped += len(self.chunks)
        self.chunks.clear()
        self.logged = 0

    async def _events(self, since: int, *, follow: bool, raw: bool) -> AsyncIterator[dict[str, Any]]:
        """Yield output events from sequence number `since`, then the exit event."""
        next_seq = since
        self.last_used = time.monotonic()
        while True:
            first_seq = self.seq - len(self.chunks)
            if next_seq < first_seq:
                yield {"type": "dropped", "chunks": first_seq - next_seq}
                next_seq = first_seq
            for chunk in itertools.islice(self.chunks, next_seq - first_seq, None):
                yield {
                    "type": chunk.stream,
                    "offset": chunk.offset,
                    "data": chunk.data if raw else chunk.data.decode("utf-8", "replace"),
                }
                next_seq += 1
            if not self.running:
                yield {
                    "type": "exit",
                    "exit_code": self.exit_code,
                    "signal": self.signal,
                    "timed_out": self.timed_out,
                }
                return
            if not follow:
                return
            async with self.changed:
                if self.seq == next_seq and self.running:
                    await self.changed.wait()


class ProcessManager:
    def __init__(
        self,
        limiter: Limiter,
        on_exit: Callable[[Process], None] | None = None,
        log_limit: int = 4 * 1024 * 1024,
        keep_exited: int = 256,
        exited_log_budget: int = 32 * 1024 * 1024,
    ) -> None:
        self.limiter = limiter
        self.on_exit = on_exit
        self.log_limit = log_limit
        self.keep_exited = keep_exited
        # Output kept for exited background processes, all together; past it, the least recently read
        # lose theirs (their summary and exit status stay).
        self.exited_log_budget = exited_log_budget
        self.procs: dict[str, Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(
        self, spec: ExecSpec, *, tag: str | None = None, background: bool = True, keep_stdin: bool = False
    ) -> Process:
        self.limiter.acquire()
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                cwd=spec.cwd,
                env=spec.env,
                stdin=subprocess.PIPE if (keep_stdin or spec.stdin is not None) else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            self.limiter.release()
            code = 404 if isinstance(err, FileNotFoundError) else 400
            raise ApiError(
                code,
                "NOT_FOUND" if code == 404 else "FAILED_PRECONDITION",
                f"failed to execute {spec.argv[0]!r}: {err.strerror or err}",
            ) from None
        except BaseException:
            self.limiter.release()  # e.g. an argument that cannot be encoded: never leak the slot
            raise
        p = Process(
            id=uuid.uuid4().hex[:12],
            argv=spec.argv,
            cwd=spec.cwd,
            pid=proc.pid,
            started_at=time.time(),
            proc=proc,
            # A caller that wants less output than the log keeps (the operator's verify checks) gets its tail.
            log_limit=min(self.log_limit, spec.max_output),
            tag=tag,
        )
        if background:
            self.procs[p.id] = p
            self._trim()
        if spec.stdin and proc.stdin is not None:
            # The process may already be gone (bad arguments, instant exit); its stdin is then closed.
            with contextlib.suppress(RuntimeError, BrokenPipeError, ConnectionResetError):
                proc.stdin.write(spec.stdin)
                if not keep_stdin:
                    proc.stdin.close()
        task = asyncio.get_running_loop().create_task(self._pump(p, spec.timeout))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return p

    def _trim(self) -> None:
        exited = [p for p in self.procs.values() if not p.running]
        for p in exited[: max(0, len(exited) - self.keep_exited)]:
            del self.procs[p.id]
        exited = [p for p in self.procs.values() if not p.running and p.chunks]
        total = sum(p.logged for p in exited)
        for p in sorted(exited, key=lambda p: p.last_used):
            if total <= self.exited_log_budget:
                break
            total -= p.logged
            p.release_log()

    async def _pump(self, p: Process, timeout: float | None) -> None:
        proc = p.proc
        assert proc.stdout is not None and proc.stderr is not None

        async def read(stream: asyncio.StreamReader, name: str) -> None:
            while chunk := await stream.read(1 << 16):
                await p.append(name, chunk)

        readers = asyncio.gather(read(proc.stdout, "stdout"), read(proc.stderr, "stderr"))
        try:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                p.timed_out = True
                killpg(proc.pid)
                await proc.wait()
            try:
                await asyncio.wait_for(asyncio.shield(readers), PIPE_GRACE_SECONDS)
            except TimeoutError:
                readers.cancel()
        finally:
            rc = proc.returncode if proc.returncode is not None else -signal.SIGKILL
            p.exit_code, p.signal = _exit_code(rc)
            if p.timed_out:
                p.exit_code = 124
            p.ended_at = time.time()
            self.limiter.release()
            p.done.set()
            async with p.changed:
                p.changed.notify_all()
            if self.on_exit is not None:
                self.on_exit(p)
            p.captured = {"stdout": bytearray(), "stderr": bytearray()}  # journaled: not needed any more
            self._trim()

    def get(self, pid: str) -> Process:
        try:
            return self.procs[pid]
        except KeyError:
            raise ApiError(404, "NOT_FOUND", f"no process {pid!r}") from None

    async def shutdown(self) -> None:
        for p in self.procs.values():
            if p.running:
                killpg(p.pid)
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(t, 2)


def parse_signal(name: str | int) -> int:
    if isinstance(name, int) or name.isdigit():
        num = int(name)
        if num not in signal.valid_signals():
            raise bad_request(f"unknown signal {name!r}")
        return num
    key = name.upper()
    if not key.startswith("SIG"):
        key = "SIG" + key
    try:
        return int(signal.Signals[key])
    except KeyError:
        raise bad_request(f"unknown signal {name!r}") from None
