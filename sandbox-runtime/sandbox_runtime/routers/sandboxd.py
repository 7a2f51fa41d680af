"""agent-sandbox's sandboxd REST API: `/v1/health`, `/v1/metadata` and `/v1/files/{path}`."""

from __future__ import annotations

import os
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from .. import __version__, files
from ..errors import bad_request, not_found
from ..models import Health, Metadata, SandboxdListing
from ..transfer import FileStream, receive_multipart, receive_to_file
from .common import ERRORS, RuntimeDep, compat_type

router = APIRouter()


@router.get(
    "/v1/health",
    response_model=Health,
    response_model_exclude_none=True,
    tags=["health"],
    summary="Health (sandboxd)",
)
async def v1_health(rt: RuntimeDep) -> Health:
    return Health(
        status="ok",
        uptime_seconds=int(time.time() - rt.started),
        idle_seconds=int(rt.activity.idle_seconds()),
    )


@router.get("/v1/metadata", response_model=Metadata, tags=["health"])
async def v1_metadata(rt: RuntimeDep) -> Metadata:
    # Only non-secret, orchestrator-provided identity; never the token or arbitrary env.
    keys = ("SANDBOX_NAME", "SANDBOX_NAMESPACE", "POD_NAME", "POD_NAMESPACE", "POD_IP", "HOSTNAME")
    env = {k: os.environ[k] for k in keys if k in os.environ}
    return Metadata(env=env, root=rt.root.real, version=__version__)


@router.head("/v1/files/{path:path}", tags=["sandboxd"], responses=ERRORS, response_model=None)
async def v1_head(request: Request, path: str, rt: RuntimeDep) -> Any:
    """Existence and metadata headers, no body (200 or 404)."""
    return await v1_get(request, path, rt)


@router.get(
    "/v1/files/{path:path}",
    tags=["sandboxd"],
    responses={**ERRORS, 200: {"model": SandboxdListing, "content": {"application/octet-stream": {}}}},
    response_model=None,
)
async def v1_get(
    request: Request,
    path: str,
    rt: RuntimeDep,
    offset: Annotated[int | None, Query(ge=0)] = None,
    length: Annotated[int | None, Query(ge=0)] = None,
) -> Any:
    """A file's bytes (with `Range` or `offset`/`length`) or a directory listing."""
    root = rt.root
    res = root.resolve(path)
    s = files.stat_path(root, res)
    head = request.method == "HEAD"
    if os.path.isdir(res.path):
        if head:
            return Response(status_code=200, headers={"x-file-type": "directory"})
        entries = [
            {k: e[k] for k in ("name", "size", "type", "modified_at", "mode")}
            for e in await rt.blocking(files.list_dir, root, res)
        ]
        for e in entries:
            e["type"] = compat_type(str(e["type"]))
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


@router.put(
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
async def v1_put(
    request: Request, path: str, rt: RuntimeDep, mode: Annotated[str | None, Query()] = None
) -> Response:
    """Atomic write (temp file + rename); parents created; raw body or multipart field `file`."""
    perm = files.parse_mode(mode)
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        # The `file` part goes to the URL's path, not to the part's filename.
        stored = await receive_multipart(
            request,
            rt.root,
            field_names=("file",),
            mode=perm,
            on_bytes=rt.metrics.bytes_in.inc,
            target=path,
            limit=rt.settings.max_upload,
        )
        if not stored:
            raise bad_request("multipart body has no `file` part")
    else:
        w = files.AtomicWriter(rt.root, path, perm)
        await receive_to_file(request, w, rt.settings.max_upload, rt.metrics.bytes_in.inc)
    return Response(status_code=204)


@router.delete("/v1/files/{path:path}", status_code=204, tags=["sandboxd"], responses=ERRORS)
async def v1_delete(path: str, rt: RuntimeDep, recursive: bool = False) -> Response:
    """Remove a file or directory; a non-empty directory needs `recursive=true` (else 409)."""
    res = rt.root.resolve_entry(path)
    if not os.path.lexists(res.path):
        raise not_found(f"no such file or directory: {res.rel}")
    await rt.blocking(files.delete, res, recursive)
    return Response(status_code=204)
