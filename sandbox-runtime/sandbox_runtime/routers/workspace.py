"""Native whole-workspace operations: baseline & diff, tar.gz export & import."""

from __future__ import annotations

import os
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ..archive import ImportLimits, export_stream, import_stream
from ..baseline import Manifest
from ..errors import ApiError, bad_request
from ..models import BaselineInfo, BaselineRequest, DiffResponse, Error, ImportResponse
from .common import RuntimeDep

router = APIRouter()


def _info(man: Manifest) -> dict[str, Any]:
    return {
        "created_at": man.created_at,
        "files": len(man.files),
        "snapshot_bytes": man.snapshot_bytes,
        "exclude": man.exclude,
    }


def _no_baseline() -> ApiError:
    return ApiError(404, "NOT_FOUND", "no baseline captured yet (POST /v1/baseline)")


@router.post("/v1/baseline", response_model=BaselineInfo, tags=["diff"])
async def capture(rt: RuntimeDep, req: BaselineRequest | None = None) -> dict[str, Any]:
    """Capture the workspace as the reference for /v1/diff (default excludes: node_modules/, .git/)."""
    exclude = req.exclude if req is not None else None
    async with rt.baseline_lock:
        man = await rt.blocking(rt.baselines.capture, exclude)
    return _info(man)


@router.get("/v1/baseline", response_model=BaselineInfo, tags=["diff"], responses={404: {"model": Error}})
async def info(rt: RuntimeDep) -> dict[str, Any]:
    man = await rt.blocking(rt.baselines.load)
    if man is None:
        raise _no_baseline()
    return _info(man)


@router.get("/v1/diff", response_model=DiffResponse, tags=["diff"], responses={404: {"model": Error}})
async def diff(rt: RuntimeDep, patch: bool = True, paths_only: bool = False) -> dict[str, Any]:
    """Added, modified and deleted paths since the baseline, with a unified patch for text files."""
    man = await rt.blocking(rt.baselines.load)
    if man is None:
        raise _no_baseline()
    async with rt.baseline_lock:
        return await rt.blocking(
            rt.baselines.diff, man, patch=patch and not paths_only, paths_only=paths_only
        )


@router.get(
    "/v1/archive/{path:path}",
    tags=["archive"],
    responses={200: {"content": {"application/gzip": {}}}, 400: {"model": Error}, 403: {"model": Error}},
)
async def export(
    path: str,
    rt: RuntimeDep,
    exclude: Annotated[list[str] | None, Query(description="e.g. node_modules/ or *.log")] = None,
    level: Annotated[int, Query(ge=0, le=9)] = 1,
) -> StreamingResponse:
    """Stream a directory as tar.gz (paths relative to it); excluded patterns are skipped."""
    res = rt.root.resolve(path)
    if not os.path.isdir(res.path):
        raise bad_request(f"not a directory: {res.rel or '.'}")
    # The runtime's own state is never exported with the whole workspace.
    extra = rt.baselines.always_exclude if not res.rel else []
    body = export_stream(rt.root, res.rel, exclude or [], level, rt.metrics.bytes_out.inc, extra)
    name = (os.path.basename(res.rel) or "workspace") + ".tar.gz"
    return StreamingResponse(
        body,
        media_type="application/gzip",
        headers={"content-disposition": f'attachment; filename="{name}"'},
    )


@router.post(
    "/v1/archive/{path:path}",
    response_model=ImportResponse,
    tags=["archive"],
    responses={400: {"model": Error}, 403: {"model": Error}},
    openapi_extra={
        "requestBody": {
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        }
    },
)
async def import_(
    request: Request,
    path: str,
    rt: RuntimeDep,
    exclude: Annotated[list[str] | None, Query()] = None,
) -> ImportResponse:
    """Extract a tar or tar.gz body under a directory, all or nothing: unsafe members (escapes, devices,
    links leading out) refuse the whole archive and leave the directory unchanged."""
    res = rt.root.resolve(path)
    if os.path.exists(res.path) and not os.path.isdir(res.path):
        raise bad_request(f"not a directory: {res.rel}")
    s = rt.settings
    limits = ImportLimits(s.max_upload, s.max_archive_members, s.max_archive_bytes)
    # The runtime's own state is never imported into the whole workspace (as it is never exported).
    extra = rt.baselines.always_exclude if not res.rel else []
    count, total = await import_stream(
        rt.root,
        res.rel,
        request.stream(),
        (exclude or []) + extra,
        rt.metrics.bytes_in.inc,
        limits=limits,
        state_dir=s.state,
    )
    return ImportResponse(path=res.rel, files=count, bytes=total)
