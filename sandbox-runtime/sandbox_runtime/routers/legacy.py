"""agent-sandbox's legacy Python runtime: `/`, `/execute`, `/upload`, `/download`, `/list`, `/exists`."""

from __future__ import annotations

import os

from fastapi import APIRouter, Request

from ..errors import bad_request, not_found
from ..models import (
    ExistsResponse,
    Health,
    LegacyEntry,
    LegacyExecRequest,
    LegacyExecResponse,
    UploadResponse,
)
from ..transfer import FileStream, receive_multipart
from .common import ERRORS, RuntimeDep, legacy_listing, run_command_line

router = APIRouter()


@router.get(
    "/",
    response_model=Health,
    response_model_exclude_none=True,
    tags=["health"],
    summary="Health (agent-sandbox legacy runtime)",
)
async def legacy_health() -> Health:
    return Health(status="ok", message="Sandbox Runtime is active.")


@router.post("/execute", response_model=LegacyExecResponse, tags=["compat"], responses=ERRORS)
async def execute(req: LegacyExecRequest, rt: RuntimeDep) -> LegacyExecResponse:
    """agent-sandbox legacy runtime and Amicable: `{command}` split shlex-style, no shell, cwd = root."""
    return await run_command_line(rt, req)


@router.post("/upload", response_model=UploadResponse, tags=["compat"], responses=ERRORS)
async def upload(request: Request, rt: RuntimeDep) -> UploadResponse:
    """Legacy multipart upload; each file part's filename is its destination relative to the root."""
    stored = await receive_multipart(
        request,
        rt.root,
        field_names=None,
        mode=0o644,
        on_bytes=rt.metrics.bytes_in.inc,
        limit=rt.settings.max_upload,
    )
    if not stored:
        raise bad_request("no file part in the multipart body")
    names = [p for p, _ in stored]
    return UploadResponse(message=f"File '{names[0]}' uploaded successfully.", files=names)


@router.get("/download/{path:path}", tags=["compat"], responses=ERRORS, response_model=None)
async def download(path: str, rt: RuntimeDep) -> FileStream:
    """Legacy runtime and Amicable: raw bytes of a file."""
    res = rt.root.resolve(path, allow_root=False)
    if not os.path.isfile(res.path):
        raise not_found("File not found")
    return FileStream(res.path, filename=res.rel, on_bytes=rt.metrics.bytes_out.inc)


@router.get("/list/{path:path}", response_model=list[LegacyEntry], tags=["compat"], responses=ERRORS)
async def legacy_list(path: str, rt: RuntimeDep) -> list[LegacyEntry]:
    return await legacy_listing(rt, path)


@router.get("/exists/{path:path}", response_model=ExistsResponse, tags=["compat"], responses=ERRORS)
async def legacy_exists(path: str, rt: RuntimeDep) -> ExistsResponse:
    res = rt.root.resolve(path)
    return ExistsResponse(exists=os.path.exists(res.path))
