"""Our own `/v1` API: exec (buffered and streamed), background processes, files, the journal, metrics."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import files
from ..errors import conflict
from ..execution import killpg, parse_signal
from ..models import (
    DecisionRequest,
    Error,
    ExecRequest,
    ExecResponse,
    FileInfo,
    JournalEntries,
    MkdirRequest,
    MoveRequest,
    MoveResponse,
    PathResponse,
    ProcessInfo,
    ProcessList,
    SignalRequest,
    StdinRequest,
    TreeListing,
)
from .common import ERRORS, NDJSON, RuntimeDep, ndjson, text

router = APIRouter()


@router.get("/metrics", tags=["health"], summary="Prometheus metrics")
async def metrics(rt: RuntimeDep) -> Response:
    return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)


# ---- files ---------------------------------------------------------------------------------------
@router.get("/v1/stat/{path:path}", response_model=FileInfo, tags=["files"], responses=ERRORS)
async def v1_stat(path: str, rt: RuntimeDep) -> dict[str, Any]:
    root = rt.root
    res = root.resolve(path)
    files.stat_path(root, res)
    info = files.describe(root, res.path, os.path.basename(res.path) if res.rel else "")
    info["path"] = res.rel
    return info


@router.get("/v1/tree/{path:path}", response_model=TreeListing, tags=["files"], responses=ERRORS)
async def v1_tree(
    path: str,
    rt: RuntimeDep,
    depth: Annotated[int, Query(ge=0, le=1000, description="0 = unlimited")] = 1,
    glob: Annotated[str | None, Query(max_length=1000)] = None,
    hidden: bool = True,
    files_only: bool = False,
) -> dict[str, Any]:
    """List entries under a directory to a depth, optionally filtered by a glob and hiding dotfiles."""
    res = rt.root.resolve(path)
    entries = await rt.blocking(
        files.list_tree, rt.root, res, depth=depth, glob=glob, hidden=hidden, files_only=files_only
    )
    return {"path": res.rel, "entries": entries}


@router.post("/v1/mkdir", response_model=PathResponse, tags=["files"], responses=ERRORS)
async def v1_mkdir(req: MkdirRequest, rt: RuntimeDep) -> PathResponse:
    return PathResponse(path=files.mkdir(rt.root, req.path, req.parents, files.parse_mode(req.mode, 0o755)))


@router.post("/v1/move", response_model=MoveResponse, tags=["files"], responses=ERRORS)
async def v1_move(req: MoveRequest, rt: RuntimeDep) -> MoveResponse:
    src, dst = files.move(rt.root, req.src, req.dst, req.overwrite)
    return MoveResponse(src=src, dst=dst)


# ---- exec ----------------------------------------------------------------------------------------
@router.post(
    "/v1/exec", response_model=ExecResponse, tags=["exec"], responses={**ERRORS, 429: {"model": Error}}
)
async def v1_exec(req: ExecRequest, rt: RuntimeDep) -> ExecResponse:
    """Run a command to completion; output capped (`truncated`), whole process group killed on timeout."""
    res = await rt.exec.run(rt.exec.spec_from_request(req), "exec", journal=req.journal)
    return ExecResponse(
        argv=res.argv,
        exit_code=res.exit_code,
        signal=res.signal,
        stdout=text(res.stdout),
        stderr=text(res.stderr),
        timed_out=res.timed_out,
        truncated=res.truncated,
        duration_seconds=res.duration,
    )


@router.post(
    "/v1/exec/stream",
    tags=["exec"],
    responses={**ERRORS, 200: {"content": {NDJSON: {}}, "description": "NDJSON events"}},
)
async def v1_exec_stream(req: ExecRequest, rt: RuntimeDep) -> StreamingResponse:
    """NDJSON events as output arrives: `{type: stdout|stderr, data, offset}` …, then `{type: exit, …}`."""
    p = await rt.exec.start(rt.exec.spec_from_request(req), tag=req.tag, background=False)

    async def events() -> AsyncIterator[dict[str, Any]]:
        try:
            yield {"type": "start", "pid": p.pid}
            async for ev in p.follow(0, follow=True):
                yield ev
        finally:
            if p.running:  # the client went away: do not leave its command running unattended
                killpg(p.pid)

    return StreamingResponse(ndjson(events()), media_type=NDJSON)


# ---- background processes ------------------------------------------------------------------------
@router.post(
    "/v1/processes", response_model=ProcessInfo, status_code=201, tags=["processes"], responses=ERRORS
)
async def v1_start(req: ExecRequest, rt: RuntimeDep) -> dict[str, Any]:
    """Start a background process; its output is kept in a bounded log (follow it with /logs)."""
    p = await rt.exec.start(
        rt.exec.spec_from_request(req, background=True), tag=req.tag, keep_stdin=True, journal=req.journal
    )
    return p.summary()


@router.get("/v1/processes", response_model=ProcessList, tags=["processes"])
async def v1_list(rt: RuntimeDep) -> dict[str, Any]:
    return {"processes": [p.summary() for p in rt.exec.processes.procs.values()]}


@router.get("/v1/processes/{pid}", response_model=ProcessInfo, tags=["processes"], responses=ERRORS)
async def v1_get_proc(pid: str, rt: RuntimeDep) -> dict[str, Any]:
    return rt.exec.processes.get(pid).summary()


@router.get(
    "/v1/processes/{pid}/logs",
    tags=["processes"],
    responses={**ERRORS, 200: {"content": {NDJSON: {}}, "description": "NDJSON events"}},
)
async def v1_logs(
    pid: str, rt: RuntimeDep, follow: bool = False, since: Annotated[int, Query(ge=0)] = 0
) -> StreamingResponse:
    """Output events from chunk `since`; with `follow=true` the stream stays open until the exit."""
    p = rt.exec.processes.get(pid)
    return StreamingResponse(ndjson(p.follow(since, follow=follow)), media_type=NDJSON)


@router.post("/v1/processes/{pid}/stdin", response_model=ProcessInfo, tags=["processes"], responses=ERRORS)
async def v1_stdin(pid: str, req: StdinRequest, rt: RuntimeDep) -> dict[str, Any]:
    p = rt.exec.processes.get(pid)
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


@router.post("/v1/processes/{pid}/signal", response_model=ProcessInfo, tags=["processes"], responses=ERRORS)
async def v1_signal(pid: str, req: SignalRequest, rt: RuntimeDep) -> dict[str, Any]:
    """Signal the whole process group (the command and everything it started)."""
    p = rt.exec.processes.get(pid)
    sig = parse_signal(req.signal)
    if p.running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, sig)
    return p.summary()


@router.delete("/v1/processes/{pid}", status_code=204, tags=["processes"], responses=ERRORS)
async def v1_remove(pid: str, rt: RuntimeDep) -> Response:
    """Kill (if running) and forget a process."""
    p = rt.exec.processes.get(pid)
    if p.running:
        killpg(p.pid)
        await p.done.wait()
    rt.exec.processes.procs.pop(pid, None)
    return Response(status_code=204)


# ---- journal -------------------------------------------------------------------------------------
@router.get(
    "/v1/journal",
    response_model=JournalEntries,
    tags=["journal"],
    responses={200: {"content": {NDJSON: {}}, "description": "JSON, or NDJSON with follow=true"}},
)
async def v1_journal(
    rt: RuntimeDep,
    since: Annotated[int, Query(ge=0)] = 0,
    significant: bool = False,
    follow: bool = False,
) -> Any:
    """Recorded commands (and decisions) after sequence `since`; `follow=true` streams NDJSON."""
    if follow:
        return StreamingResponse(ndjson(rt.journal.follow(since, significant)), media_type=NDJSON)
    return {"entries": rt.journal.entries(since, significant), "last_seq": rt.journal.seq}


@router.post("/v1/journal/decisions", status_code=201, tags=["journal"])
async def v1_decision(req: DecisionRequest, rt: RuntimeDep) -> dict[str, Any]:
    """Record a decision (shown under Decision Log in HANDOFF.md)."""
    return rt.journal.record_decision(req.text, req.author)
