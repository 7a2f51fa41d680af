"""The ASGI application: compatibility endpoints, the native /v1 API, auth, limits and metrics."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

from . import __version__, files
from .activity import Activity
from .config import Settings
from .errors import ApiError, bad_request, conflict, not_found
from .execution import (
    ExecResult,
    ExecSpec,
    Limiter,
    Process,
    ProcessManager,
    base_env,
    killpg,
    parse_signal,
    run_async,
    split_command,
)
from .journal import Journal
from .metrics import Metrics
from .middleware import ActivityMiddleware, MetricsMiddleware
from .models import (
    AmicableList,
    DecisionRequest,
    Error,
    ExecRequest,
    ExecResponse,
    ExistsResponse,
    FileInfo,
    Health,
    JournalEntries,
    LegacyEntry,
    LegacyExecRequest,
    LegacyExecResponse,
    Metadata,
    MkdirRequest,
    MoveRequest,
    MoveResponse,
    PathResponse,
    ProcessInfo,
    ProcessList,
    SandboxdListing,
    SignalRequest,
    StdinRequest,
    TreeListing,
    UploadResponse,
    WriteB64Request,
    WriteB64Response,
)
from .paths import Root, map_os_error
from .security import AuthMiddleware, BodyLimitMiddleware
from .transfer import FileStream, receive_multipart, receive_to_file

log = logging.getLogger("sandbox_runtime")

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Error},
    403: {"model": Error},
    404: {"model": Error},
    409: {"model": Error},
}
NDJSON = "application/x-ndjson"


class Runtime:
    """Process-wide state shared by the routes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            os.makedirs(settings.root, exist_ok=True)
        except OSError as err:
            raise SystemExit(
                f"sandbox-runtime: cannot use workspace root {settings.root}: {err.strerror}"
            ) from None
        self.root = Root(settings.root)
        settings.state_dir = _usable_state_dir(settings)
        self.metrics = Metrics()
        self.limiter = Limiter(settings.max_processes)
        self.pool = ThreadPoolExecutor(max_workers=settings.max_processes, thread_name_prefix="exec")
        self.journal = Journal(
            settings.state,
            self.root.real,
            ignore=settings.journal_ignore,
            entry_length=settings.journal_entry_length,
            handoff=settings.handoff,
        )
        self.processes = ProcessManager(self.limiter, on_exit=self._on_process_exit)
        self.started = time.time()
        self.activity = Activity()

    def _on_process_exit(self, p: Process) -> None:
        self.metrics.processes.set(self.limiter.active)
        self.metrics.execs.labels("process", "timeout" if p.timed_out else "exited").inc()
        self.metrics.exec_duration.labels("process").observe((p.ended_at or time.time()) - p.started_at)
        self.journal.record_command(
            argv=p.argv,
            cwd=p.cwd,
            exit_code=p.exit_code,
            duration=(p.ended_at or time.time()) - p.started_at,
            stdout=bytes(p.captured["stdout"]),
            stderr=bytes(p.captured["stderr"]),
            api="process",
            timed_out=p.timed_out,
            started_at=p.started_at,
        )

    def cwd(self, raw: str) -> str:
        res = self.root.resolve(raw)
        if not os.path.isdir(res.path):
            raise bad_request(f"cwd is not a directory: {raw!r}")
        return res.path

    async def run(self, spec: ExecSpec, api: str, *, journal: bool = True) -> ExecResult:
        self.limiter.acquire()
        self.metrics.processes.set(self.limiter.active)
        try:
            result = await run_async(spec)
        finally:
            self.limiter.release()
            self.metrics.processes.set(self.limiter.active)
        outcome = "timeout" if result.timed_out else ("ok" if result.exit_code == 0 else "nonzero")
        self.metrics.execs.labels(api, outcome).inc()
        self.metrics.exec_duration.labels(api).observe(result.duration)
        if not journal:
            return result
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

    def spec_from(self, req: ExecRequest) -> ExecSpec:
        if (req.argv is None) == (req.command is None):
            raise bad_request("give exactly one of `argv` (no shell) or `command` (shell string)")
        argv = req.argv if req.argv is not None else [req.shell, "-c", req.command or ""]
        if any("\x00" in a for a in argv) or any("\x00" in k + v for k, v in req.env.items()):
            raise bad_request("arguments and environment must not contain NUL bytes")
        if any("=" in k or not k for k in req.env):
            raise bad_request("environment variable names must be non-empty and contain no '='")
        env = {} if req.clear_env else base_env()
        env.update(req.env)
        return ExecSpec(
            argv=list(argv),
            cwd=self.cwd(req.cwd),
            env=env,
            stdin=req.stdin.encode() if req.stdin is not None else None,
            timeout=req.timeout_seconds or self.settings.exec_timeout,
            max_output=self.settings.max_output if req.max_output_bytes is None else req.max_output_bytes,
        )

    def legacy_spec(self, req: LegacyExecRequest) -> ExecSpec:
        argv = split_command(req.command)
        if any("\x00" in a for a in argv):
            raise bad_request("command must not contain NUL bytes")
        return ExecSpec(
            argv=argv,
            cwd=self.root.real,
            env=base_env(),
            timeout=req.timeout_seconds or req.timeout or self.settings.exec_timeout,
            max_output=self.settings.max_output,
        )


def _usable_state_dir(settings: Settings) -> str:
    """The journal and baseline live in the workspace volume so restarts keep them; if that is not
    writable (read-only root, foreign uid) fall back to a per-uid temp dir rather than refusing to start."""
    wanted = settings.state
    try:
        os.makedirs(wanted, exist_ok=True)
        if os.access(wanted, os.W_OK | os.X_OK):
            return wanted
    except OSError:
        pass
    import tempfile

    fallback = os.path.join(tempfile.gettempdir(), f"sandbox-runtime-{os.getuid()}")
    os.makedirs(fallback, mode=0o700, exist_ok=True)
    log.warning("state dir %s is not writable; using %s (not kept across restarts)", wanted, fallback)
    return fallback


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _ndjson(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        async for ev in events:
            yield (json.dumps(ev, separators=(",", ":")) + "\n").encode()

    return gen()


def build_router(rt: Runtime) -> APIRouter:
    r = APIRouter()
    root = rt.root

    # ---- health ------------------------------------------------------------------------------
    @r.get(
        "/",
        response_model=Health,
        response_model_exclude_none=True,
        tags=["health"],
        summary="Health (agent-sandbox legacy runtime)",
    )
    async def legacy_health() -> Health:
        return Health(status="ok", message="Sandbox Runtime is active.")

    @r.get(
        "/healthz",
        response_model=Health,
        response_model_exclude_none=True,
        tags=["health"],
        summary="Health (Amicable)",
    )
    async def healthz() -> Health:
        return Health(status="ok")

    @r.get(
        "/v1/health",
        response_model=Health,
        response_model_exclude_none=True,
        tags=["health"],
        summary="Health (sandboxd)",
    )
    async def v1_health() -> Health:
        return Health(
            status="ok",
            uptime_seconds=int(time.time() - rt.started),
            idle_seconds=int(rt.activity.idle_seconds()),
        )

    @r.get("/v1/metadata", response_model=Metadata, tags=["health"])
    async def v1_metadata() -> Metadata:
        # Only non-secret, orchestrator-provided identity; never the token or arbitrary env.
        keys = ("SANDBOX_NAME", "SANDBOX_NAMESPACE", "POD_NAME", "POD_NAMESPACE", "POD_IP", "HOSTNAME")
        env = {k: os.environ[k] for k in keys if k in os.environ}
        return Metadata(env=env, root=root.real, version=__version__)

    @r.get("/metrics", tags=["health"], summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # ---- compatibility: exec -----------------------------------------------------------------
    async def legacy_exec(req: LegacyExecRequest, api: str) -> LegacyExecResponse:
        res = await rt.run(rt.legacy_spec(req), api)
        return LegacyExecResponse(
            stdout=_text(res.stdout),
            stderr=_text(res.stderr),
            exit_code=res.exit_code,
            timed_out=res.timed_out,
        )

    @r.post("/execute", response_model=LegacyExecResponse, tags=["compat"], responses=ERRORS)
    async def execute(req: LegacyExecRequest) -> LegacyExecResponse:
        """agent-sandbox legacy runtime and Amicable: `{command}` split shlex-style, no shell, cwd = root."""
        return await legacy_exec(req, "execute")

    @r.post("/exec", response_model=LegacyExecResponse, tags=["compat"], responses=ERRORS)
    async def exec_alias(req: LegacyExecRequest) -> LegacyExecResponse:
        """Amicable's first choice; same shape as /execute."""
        return await legacy_exec(req, "execute")

    # ---- compatibility: files ----------------------------------------------------------------
    @r.post("/upload", response_model=UploadResponse, tags=["compat"], responses=ERRORS)
    async def upload(request: Request) -> UploadResponse:
        """Legacy multipart upload; each file part's filename is its destination relative to the root."""
        stored = await receive_multipart(
            request, root, field_names=None, mode=0o644, on_bytes=rt.metrics.bytes_in.inc
        )
        if not stored:
            raise bad_request("no file part in the multipart body")
        names = [p for p, _ in stored]
        return UploadResponse(message=f"File '{names[0]}' uploaded successfully.", files=names)

    @r.get("/download/{path:path}", tags=["compat"], responses=ERRORS, response_model=None)
    async def download(path: str) -> FileStream:
        """Legacy runtime and Amicable: raw bytes of a file."""
        res = root.resolve(path, allow_root=False)
        if not os.path.isfile(res.path):
            raise not_found("File not found")
        return FileStream(res.path, filename=res.rel, on_bytes=rt.metrics.bytes_out.inc)

    @r.get("/list/{path:path}", response_model=list[LegacyEntry], tags=["compat"], responses=ERRORS)
    async def legacy_list(path: str) -> list[LegacyEntry]:
        res = root.resolve(path)
        return [
            LegacyEntry(name=e["name"], size=e["size"], type=_compat_type(e["type"]), mod_time=e["mtime"])
            for e in files.list_dir(root, res)
        ]

    @r.get("/exists/{path:path}", response_model=ExistsResponse, tags=["compat"], responses=ERRORS)
    async def legacy_exists(path: str) -> ExistsResponse:
        res = root.resolve(path)
        return ExistsResponse(exists=os.path.exists(res.path))

    @r.get("/list", response_model=AmicableList | list[LegacyEntry], tags=["compat"], responses=ERRORS)
    async def amicable_list(
        dir: Annotated[str | None, Query()] = None,
    ) -> AmicableList | list[LegacyEntry]:
        """Amicable (`?dir=`): every file under `dir`, as paths relative to the root, directories excluded.

        Without `dir` this is the legacy listing of the root: the SDK's `list(".")` reaches us as `/list`
        because HTTP clients drop the `.` segment. Dependency and VCS directories (node_modules, .git) and
        the runtime's state are skipped in the Amicable form; they dominate the cost on real trees.
        """
        if dir is None:
            return await legacy_list("")
        res = root.resolve(dir)
        if not os.path.isdir(res.path):
            raise not_found(f"no such directory: {res.rel or '.'}")
        prune = frozenset({"node_modules", ".git", os.path.basename(rt.settings.state)})
        out = []
        for e, _ in files.walk(root, res.path, prune=prune):
            if e.name in prune and e.is_dir(follow_symlinks=False):
                continue
            if e.is_file(follow_symlinks=False) or (e.is_symlink() and root.check_entry(e.path)):
                if os.path.isdir(e.path):
                    continue
                out.append(root.relative(e.path))
        out.sort()
        return AmicableList(files=out)

    @r.post("/write_b64", response_model=WriteB64Response, tags=["compat"], responses=ERRORS)
    async def write_b64(req: WriteB64Request) -> WriteB64Response:
        try:
            data = base64.b64decode(req.content_b64, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("content_b64 is not valid base64") from None
        w = files.AtomicWriter(root, req.path)
        try:
            w.write(data)
            w.commit()
        except BaseException:
            w.abort()
            raise
        rt.metrics.bytes_in.inc(len(data))
        return WriteB64Response(status="ok", path=w.res.rel, size=len(data))

    # ---- sandboxd REST -----------------------------------------------------------------------
    @r.head("/v1/files/{path:path}", tags=["sandboxd"], responses=ERRORS, response_model=None)
    async def v1_head(request: Request, path: str) -> Any:
        """Existence and metadata headers, no body (200 or 404)."""
        return await v1_get(request, path)

    @r.get(
        "/v1/files/{path:path}",
        tags=["sandboxd"],
        responses={**ERRORS, 200: {"model": SandboxdListing, "content": {"application/octet-stream": {}}}},
        response_model=None,
    )
    async def v1_get(
        request: Request,
        path: str,
        offset: Annotated[int | None, Query(ge=0)] = None,
        length: Annotated[int | None, Query(ge=0)] = None,
    ) -> Any:
        """A file's bytes (with `Range` or `offset`/`length`) or a directory listing."""
        res = root.resolve(path)
        s = files.stat_path(root, res)
        head = request.method == "HEAD"
        if os.path.isdir(res.path):
            if head:
                return Response(status_code=200, headers={"x-file-type": "directory"})
            entries = [
                {k: e[k] for k in ("name", "size", "type", "modified_at", "mode")}
                for e in files.list_dir(root, res)
            ]
            for e in entries:
                e["type"] = _compat_type(str(e["type"]))
            return JSONResponse({"path": "/" + res.rel, "entries": entries})
        if not os.path.isfile(res.path):
            raise bad_request(f"not a regular file: {res.rel}")
        stream = FileStream(
            res.path,
            range_header=request.headers.get("range"),
            head=head,
            on_bytes=rt.metrics.bytes_out.inc,
            offset=offset,
            length=length,
        )
        stream.header_list.append((b"x-file-mode", f"0{s.st_mode & 0o777:03o}".encode()))
        return stream

    @r.put(
        "/v1/files/{path:path}",
        status_code=204,
        tags=["sandboxd"],
        responses=ERRORS,
        openapi_extra={
            "requestBody": {
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
            }
        },
    )
    async def v1_put(request: Request, path: str, mode: Annotated[str | None, Query()] = None) -> Response:
        """Atomic write (temp file + rename); parents created; raw body or multipart field `file`."""
        perm = files.parse_mode(mode)
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            stored = await _multipart_to(request, rt, path, perm)
            if not stored:
                raise bad_request("multipart body has no `file` part")
        else:
            w = files.AtomicWriter(root, path, perm)
            await receive_to_file(request, w, rt.settings.max_upload, rt.metrics.bytes_in.inc)
        return Response(status_code=204)

    @r.delete("/v1/files/{path:path}", status_code=204, tags=["sandboxd"], responses=ERRORS)
    async def v1_delete(path: str, recursive: bool = False) -> Response:
        """Remove a file or directory; a non-empty directory needs `recursive=true` (else 409)."""
        res = root.resolve_entry(path)
        if not os.path.lexists(res.path):
            raise not_found(f"no such file or directory: {res.rel}")
        files.delete(res, recursive)
        return Response(status_code=204)

    # ---- native: files -----------------------------------------------------------------------
    @r.get("/v1/stat/{path:path}", response_model=FileInfo, tags=["files"], responses=ERRORS)
    async def v1_stat(path: str) -> dict[str, Any]:
        res = root.resolve(path)
        files.stat_path(root, res)
        info = files.describe(root, res.path, os.path.basename(res.path) if res.rel else "")
        info["path"] = res.rel
        return info

    @r.get("/v1/tree/{path:path}", response_model=TreeListing, tags=["files"], responses=ERRORS)
    async def v1_tree(
        path: str,
        depth: Annotated[int, Query(ge=0, le=1000, description="0 = unlimited")] = 1,
        glob: Annotated[str | None, Query(max_length=1000)] = None,
        hidden: bool = True,
        files_only: bool = False,
    ) -> dict[str, Any]:
        """List entries under a directory to a depth, optionally filtered by a glob and hiding dotfiles."""
        res = root.resolve(path)
        loop = asyncio.get_running_loop()
        entries = await loop.run_in_executor(
            rt.pool,
            lambda: files.list_tree(root, res, depth=depth, glob=glob, hidden=hidden, files_only=files_only),
        )
        return {"path": res.rel, "entries": entries}

    @r.post("/v1/mkdir", response_model=PathResponse, tags=["files"], responses=ERRORS)
    async def v1_mkdir(req: MkdirRequest) -> PathResponse:
        return PathResponse(path=files.mkdir(root, req.path, req.parents, files.parse_mode(req.mode, 0o755)))

    @r.post("/v1/move", response_model=MoveResponse, tags=["files"], responses=ERRORS)
    async def v1_move(req: MoveRequest) -> MoveResponse:
        src, dst = files.move(root, req.src, req.dst, req.overwrite)
        return MoveResponse(src=src, dst=dst)

    # ---- native: exec ------------------------------------------------------------------------
    @r.post(
        "/v1/exec", response_model=ExecResponse, tags=["exec"], responses={**ERRORS, 429: {"model": Error}}
    )
    async def v1_exec(req: ExecRequest) -> ExecResponse:
        """Run a command to completion; output capped (`truncated`), whole process group killed on timeout."""
        res = await rt.run(rt.spec_from(req), "exec", journal=req.journal)
        return ExecResponse(
            argv=res.argv,
            exit_code=res.exit_code,
            signal=res.signal,
            stdout=_text(res.stdout),
            stderr=_text(res.stderr),
            timed_out=res.timed_out,
            truncated=res.truncated,
            duration_seconds=res.duration,
        )

    @r.post(
        "/v1/exec/stream",
        tags=["exec"],
        responses={**ERRORS, 200: {"content": {NDJSON: {}}, "description": "NDJSON events"}},
    )
    async def v1_exec_stream(req: ExecRequest) -> StreamingResponse:
        """NDJSON events as output arrives: `{type: stdout|stderr, data, offset}` …, then `{type: exit, …}`."""
        p = await rt.processes.start(rt.spec_from(req), tag=req.tag, background=False)
        rt.metrics.processes.set(rt.limiter.active)

        async def events() -> AsyncIterator[dict[str, Any]]:
            try:
                yield {"type": "start", "pid": p.pid}
                async for ev in p.follow(0, follow=True):
                    yield ev
            finally:
                if p.running:  # the client went away: do not leave its command running unattended
                    killpg(p.pid)

        return StreamingResponse(_ndjson(events()), media_type=NDJSON)

    @r.post(
        "/v1/processes", response_model=ProcessInfo, status_code=201, tags=["processes"], responses=ERRORS
    )
    async def v1_start(req: ExecRequest) -> dict[str, Any]:
        """Start a background process; its output is kept in a bounded log (follow it with /logs)."""
        spec = rt.spec_from(req)
        if req.timeout_seconds is None:
            spec.timeout = None  # background work (dev servers) runs until stopped
        p = await rt.processes.start(spec, tag=req.tag, keep_stdin=True)
        rt.metrics.processes.set(rt.limiter.active)
        return p.summary()

    @r.get("/v1/processes", response_model=ProcessList, tags=["processes"])
    async def v1_list() -> dict[str, Any]:
        return {"processes": [p.summary() for p in rt.processes.procs.values()]}

    @r.get("/v1/processes/{pid}", response_model=ProcessInfo, tags=["processes"], responses=ERRORS)
    async def v1_get_proc(pid: str) -> dict[str, Any]:
        return rt.processes.get(pid).summary()

    @r.get(
        "/v1/processes/{pid}/logs",
        tags=["processes"],
        responses={**ERRORS, 200: {"content": {NDJSON: {}}, "description": "NDJSON events"}},
    )
    async def v1_logs(
        pid: str, follow: bool = False, since: Annotated[int, Query(ge=0)] = 0
    ) -> StreamingResponse:
        """Output events from chunk `since`; with `follow=true` the stream stays open until the exit."""
        p = rt.processes.get(pid)
        return StreamingResponse(_ndjson(p.follow(since, follow=follow)), media_type=NDJSON)

    @r.post("/v1/processes/{pid}/stdin", response_model=ProcessInfo, tags=["processes"], responses=ERRORS)
    async def v1_stdin(pid: str, req: StdinRequest) -> dict[str, Any]:
        p = rt.processes.get(pid)
        stdin = p.proc.stdin
        if stdin is None or stdin.is_closing():
            raise conflict("the process' stdin is closed")
        if not p.running:
            raise conflict("the process has exited")
        try:
            stdin.write(req.data.encode())
            await stdin.drain()
            if req.eof:
                stdin.close()
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            raise conflict("the process closed its stdin") from None
        return p.summary()

    @r.post("/v1/processes/{pid}/signal", response_model=ProcessInfo, tags=["processes"], responses=ERRORS)
    async def v1_signal(pid: str, req: SignalRequest) -> dict[str, Any]:
        """Signal the whole process group (the command and everything it started)."""
        p = rt.processes.get(pid)
        sig = parse_signal(req.signal)
        if p.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        return p.summary()

    @r.delete("/v1/processes/{pid}", status_code=204, tags=["processes"], responses=ERRORS)
    async def v1_remove(pid: str) -> Response:
        """Kill (if running) and forget a process."""
        p = rt.processes.get(pid)
        if p.running:
            killpg(p.pid)
            await p.done.wait()
        rt.processes.procs.pop(pid, None)
        return Response(status_code=204)

    # ---- journal -----------------------------------------------------------------------------
    @r.get(
        "/v1/journal",
        response_model=JournalEntries,
        tags=["journal"],
        responses={200: {"content": {NDJSON: {}}, "description": "JSON, or NDJSON with follow=true"}},
    )
    async def v1_journal(
        since: Annotated[int, Query(ge=0)] = 0, significant: bool = False, follow: bool = False
    ) -> Any:
        """Recorded commands (and decisions) after sequence `since`; `follow=true` streams NDJSON."""
        if follow:
            return StreamingResponse(_ndjson(rt.journal.follow(since, significant)), media_type=NDJSON)
        return {"entries": rt.journal.entries(since, significant), "last_seq": rt.journal.seq}

    @r.post("/v1/journal/decisions", status_code=201, tags=["journal"])
    async def v1_decision(req: DecisionRequest) -> dict[str, Any]:
        """Record a decision (shown under Decision Log in HANDOFF.md)."""
        return rt.journal.record_decision(req.text, req.author)

    return r


async def _multipart_to(request: Request, rt: Runtime, path: str, mode: int) -> list[tuple[str, int]]:
    """sandboxd PUT with multipart: the `file` part goes to the URL's path, not the part's filename."""
    return await receive_multipart(
        request, rt.root, field_names=("file",), mode=mode, on_bytes=rt.metrics.bytes_in.inc, target=path
    )


def _compat_type(t: str) -> str:
    # Legacy and sandboxd clients accept only file|directory.
    return "directory" if t == "directory" else "file"


def create_app(settings: Settings) -> ASGIApp:
    rt = Runtime(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        hb: asyncio.Task[None] | None = None
        if settings.handoff and settings.heartbeat_seconds > 0:

            async def beat() -> None:
                while True:
                    with contextlib.suppress(OSError):
                        rt.journal.heartbeat()
                    await asyncio.sleep(settings.heartbeat_seconds)

            hb = asyncio.get_running_loop().create_task(beat())
        grpc_server: Any = None
        if settings.grpc_port:
            from .grpc_process import serve

            grpc_server = await serve(rt, settings.host, settings.grpc_port)
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(grace=1)
            if hb is not None:
                hb.cancel()
            await rt.processes.shutdown()
            rt.pool.shutdown(wait=False, cancel_futures=True)
            rt.journal.close()

    app = FastAPI(
        title="sandbox-runtime",
        version=__version__,
        description=(
            "Workspace API inside every shadow-operator sandbox pod. Serves the agent-sandbox legacy runtime, "
            "sandboxd REST and Amicable request shapes, plus a native /v1 API. All paths are relative to the "
            "workspace root; anything escaping it is refused."
        ),
        lifespan=lifespan,
    )
    app.state.runtime = rt

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        codes = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 401: "UNAUTHENTICATED"}
        body = {
            "code": codes.get(err.status_code, "ERROR"),
            "message": str(err.detail),
            "detail": str(err.detail),
        }
        return JSONResponse(body, status_code=err.status_code, headers=getattr(err, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in err.errors()
        )
        body = {
            "code": "INVALID_ARGUMENT",
            "message": problems or "invalid request",
            "errors": _jsonable(err),
        }
        return JSONResponse(body, status_code=422)

    @app.exception_handler(UnicodeError)
    async def unicode_error(_: Request, err: UnicodeError) -> JSONResponse:
        # Lone surrogates in JSON strings cannot become argv, env or file bytes.
        e = bad_request(f"text cannot be encoded: {err}")
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(OSError)
    async def os_error(_: Request, err: OSError) -> JSONResponse:
        e = map_os_error(err, "request")
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse({"code": "INTERNAL", "message": f"internal error: {type(err).__name__}"}, 500)

    app.include_router(build_router(rt))
    from .workspace import build_workspace_router

    app.include_router(build_workspace_router(rt))
    from .terminal import mount_pty

    mount_pty(app, rt)

    wrapped: ASGIApp = BodyLimitMiddleware(
        app, settings.max_json_body, ("/upload", "/v1/files/", "/v1/archive")
    )
    wrapped = AuthMiddleware(wrapped, settings.token)
    wrapped = ActivityMiddleware(wrapped, rt.activity)
    wrapped = MetricsMiddleware(wrapped, rt.metrics)
    return wrapped


def _jsonable(err: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for e in err.errors():
        out.append(
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg")), "type": str(e.get("type"))}
        )
    return out
