"""The one way a command runs, whichever front end asked: validate → limit → spawn → journal → metrics.

The HTTP dialects, gRPC's ProcessService and the WebSocket PTY only translate their request shape into
`ExecService.spec`; the checks (cwd confined to the root and a directory, no NUL bytes, well-formed
environment names, the default timeout and output cap) and the process limit live here, so no front end
can skip one of them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Mapping
from types import TracebackType

from . import shell_journal
from .config import Settings
from .errors import ApiError, bad_request
from .execution import (
    ExecResult,
    ExecSpec,
    Limiter,
    Process,
    ProcessManager,
    base_env,
    run_async,
    split_command_async,
)
from .journal import Journal
from .metrics import Metrics
from .models import ExecRequest, LegacyExecRequest
from .paths import Root

# Interactive shells get `-i` so they prompt even though they were not started from a login.
_INTERACTIVE_SHELLS = ("sh", "bash", "dash", "zsh")


class Slot:
    """One of the `--max-processes` slots, held while a command or a terminal runs."""

    def __init__(self, service: ExecService) -> None:
        self._service = service
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._service.limiter.release()
            self._service.metrics.processes.set(self._service.limiter.active)

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.release()


class ExecService:
    def __init__(
        self,
        settings: Settings,
        root: Root,
        metrics: Metrics,
        journal: Journal,
        busy: contextlib.AbstractContextManager[None] | None = None,
    ) -> None:
        self.settings = settings
        self.root = root
        self.metrics = metrics
        self.journal = journal
        self.limiter = Limiter(settings.max_processes, busy)
        self.processes = ProcessManager(
            self.limiter, on_exit=self._on_process_exit, exited_log_budget=settings.process_log_budget
        )

    # ---- validate ----------------------------------------------------------------------------
    def cwd(self, raw: str) -> str:
        res = self.root.resolve(raw)
        if not os.path.isdir(res.path):
            raise bad_request(f"cwd is not a directory: {raw!r}")
        return res.path

    def spec(
        self,
        argv: list[str],
        *,
        cwd: str | None = "",
        env: Mapping[str, str] | None = None,
        clear_env: bool = False,
        stdin: str | None = None,
        timeout: float | None,
        max_output: int | None = None,
    ) -> ExecSpec:
        """A checked command: `cwd` relative to the root (None: the root itself, no lookup), `env` added
        to the runtime's environment (or alone, with `clear_env`)."""
        extra = env or {}
        self.check_size(sum(_size(a) for a in argv) + sum(_size(k) + _size(v) + 2 for k, v in extra.items()))
        if any("\x00" in a for a in argv) or any("\x00" in k + v for k, v in extra.items()):
            raise bad_request("arguments and environment must not contain NUL bytes")
        if any("=" in k or not k for k in extra):
            raise bad_request("environment variable names must be non-empty and contain no '='")
        full_env = {} if clear_env else base_env()
        full_env.update(extra)
        return ExecSpec(
            argv=list(argv),
            cwd=self.root.real if cwd is None else self.cwd(cwd),
            env=full_env,
            stdin=stdin.encode() if stdin is not None else None,
            timeout=timeout,
            max_output=self.settings.max_output if max_output is None else max_output,
        )

    def spec_from_request(self, req: ExecRequest, *, background: bool = False) -> ExecSpec:
        """The native request; background processes (dev servers) run until stopped unless given a timeout."""
        if (req.argv is None) == (req.command is None):
            raise bad_request("give exactly one of `argv` (no shell) or `command` (shell string)")
        argv = req.argv if req.argv is not None else [req.shell, "-c", req.command or ""]
        return self.spec(
            argv,
            cwd=req.cwd,
            env=req.env,
            clear_env=req.clear_env,
            stdin=req.stdin,
            timeout=req.timeout_seconds or (None if background else self.settings.exec_timeout),
            max_output=req.max_output_bytes,
        )

    def check_size(self, size: int) -> None:
        """Arguments plus environment beyond `--max-command-bytes` (default: Linux's own ARG_MAX of 2 MiB,
        which exec refuses anyway) are refused before any work is spent on them."""
        limit = self.settings.max_command_bytes
        if size > limit:
            raise ApiError(
                413,
                "RESOURCE_EXHAUSTED",
                f"command and environment are {size} bytes, more than the limit of {limit} "
                "(--max-command-bytes); pass large data through stdin or a file",
            )

    async def spec_from_command_line(self, req: LegacyExecRequest) -> ExecSpec:
        """agent-sandbox's legacy runtime and Amicable: one string split shell-style, run in the root."""
        self.check_size(_size(req.command))
        argv = await split_command_async(req.command)
        if any("\x00" in a for a in argv):
            raise bad_request("command must not contain NUL bytes")
        timeout = req.timeout_seconds or req.timeout or self.settings.exec_timeout
        return self.spec(argv, cwd=None, timeout=timeout)

    def terminal_spec(self, cwd: str, shell: str | None, journal_fd: int | None = None) -> ExecSpec:
        """An interactive shell (the client's choice, else $SHELL, else bash where there is one) with a
        terminal type set. A bash given `journal_fd` journals each command typed (`shell_journal`)."""
        shell = shell or os.environ.get("SHELL") or shutil.which("bash") or "/bin/sh"
        argv = [shell, "-i"] if os.path.basename(shell) in _INTERACTIVE_SHELLS else [shell]
        env = base_env()
        env.setdefault("TERM", "xterm-256color")
        if journal_fd is not None and os.path.basename(shell) == "bash":
            argv = [shell, "--rcfile", shell_journal.rcfile(self.settings.state), "-i"]
            env[shell_journal.FD_VARIABLE] = str(journal_fd)
        return self.spec(argv, cwd=cwd, env=env, clear_env=True, timeout=None)

    # ---- limit -------------------------------------------------------------------------------
    def claim(self) -> Slot:
        """A process slot, or 429 RESOURCE_EXHAUSTED when all are taken."""
        self.limiter.acquire()
        self.metrics.processes.set(self.limiter.active)
        return Slot(self)

    # ---- spawn, journal, metrics -------------------------------------------------------------
    async def run(self, spec: ExecSpec, api: str, *, journal: bool = True) -> ExecResult:
        """Run to completion with the output buffered; `journal=False` keeps an orchestrator's plumbing
        out of the agent's record."""
        with self.claim():
            result = await run_async(spec)
        outcome = "timeout" if result.timed_out else ("ok" if result.exit_code == 0 else "nonzero")
        self.metrics.execs.labels(api, outcome).inc()
        self.metrics.exec_duration.labels(api).observe(result.duration)
        if journal:
            self.journal.record_command(
                argv=result.argv,
                cwd=result.cwd,
                exit_code=result.exit_code,
                duration=result.duration,
                stdout=result.stdout,
                stderr=result.stderr,
                api=api,
                timed_out=result.timed_out,
                started_at=result.started_at,
            )
        return result

    async def start(
        self,
        spec: ExecSpec,
        *,
        tag: str | None = None,
        background: bool = True,
        keep_stdin: bool = False,
        journal: bool = True,
    ) -> Process:
        """Start a streamed (`background=False`) or background process; it is journaled when it exits, unless
        `journal=False` (an orchestrator's plumbing, e.g. the operator's verify checks)."""
        p = await self.processes.start(spec, tag=tag, background=background, keep_stdin=keep_stdin)
        p.journal = journal
        self.metrics.processes.set(self.limiter.active)
        return p

    def _on_process_exit(self, p: Process) -> None:
        duration = (p.ended_at or time.time()) - p.started_at
        self.metrics.processes.set(self.limiter.active)
        self.metrics.execs.labels("process", "timeout" if p.timed_out else "exited").inc()
        self.metrics.exec_duration.labels("process").observe(duration)
        if not p.journal:
            return
        self.journal.record_command(
            argv=p.argv,
            cwd=p.cwd,
            exit_code=p.exit_code,
            duration=duration,
            stdout=bytes(p.captured["stdout"]),
            stderr=bytes(p.captured["stderr"]),
            api="process",
            timed_out=p.timed_out,
            started_at=p.started_at,
        )


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
